-- KEYS[1] lock; ARGV[1] owner, ARGV[2] publish command, ARGV[3] waited-for
-- mark, ARGV[4] (optional, with fencing) the holder record's own name,
-- where a lock granted by an older version keeps it (its value the owner
-- alone): deleted with the lock -> 1 released, 0 not owner (see owner.lua)
-- Publishes only when a waiter marked the lock (see acquire.lua): an
-- uncontended release is the owner check and one DEL. The channel is the
-- lock's name with `released` for `lock` (`…:<id>:lock` → `…:<id>:released`),
-- made here only when someone waits. The mark is not declared (a Cluster
-- serves a migrating slot's call where its declared keys are): where the
-- slot is leaving and the mark has moved already, the lock alone is
-- deleted and the release announced (a waiter may have marked it).
local v = redis.call('GET', KEYS[1])
if owned_by(v, ARGV[1]) then
  local n = redis.pcall('DEL', KEYS[1], ARGV[3])
  if type(n) == 'table' then
    redis.call('DEL', KEYS[1])
    n = 2
  end
  if ARGV[4] and v == ARGV[1] then redis.pcall('DEL', ARGV[4]) end
  if n > 1 then
    redis.pcall(ARGV[2], string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  return 1
end
return 0

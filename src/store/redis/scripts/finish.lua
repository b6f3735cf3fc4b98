-- KEYS[1] lock; ARGV[1] owner, ARGV[2] record, ARGV[3] retention ms,
-- ARGV[4] publish command (the channel as in release.lua), ARGV[5] record
-- name, ARGV[6] waited-for mark, ARGV[7] (optional, Redlock) record
-- writer
-- -> 1 stored and released, 0 not owner (nothing stored; see owner.lua)
-- The record writer (the owner token, kept as long as the record) lets a
-- Redlock finish that missed its quorum take back exactly what it wrote.
-- Publishes only when a waiter marked the lock, as release.lua does. Only
-- the lock is declared (see release.lua); where the slot is leaving and
-- the record's name is not there, nothing is stored and the error answers
-- (the lock stays): the store then writes the record where the slot goes
-- and releases (`finish_while_migrating` in scripts.rs).
if owned_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  local stored = redis.pcall('SET', ARGV[5], ARGV[2], 'PX', ARGV[3])
  if stored.err then return stored end
  if ARGV[7] then redis.call('SET', ARGV[7], ARGV[1], 'PX', ARGV[3]) end
  local n = redis.pcall('DEL', KEYS[1], ARGV[6])
  if type(n) == 'table' then
    redis.call('DEL', KEYS[1])
    n = 2
  end
  if n > 1 then
    redis.pcall(ARGV[4], string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  return 1
end
return 0

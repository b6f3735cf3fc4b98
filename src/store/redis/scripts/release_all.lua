-- Releases every lock of a list that the owner holds, as release.lua
-- releases one: the lock and its waited-for mark deleted (and the holder
-- record's own name, for a lock of an older version), the release
-- announced only when a waiter marked it.
--
-- KEYS the locks (one slot); ARGV[1] owner, ARGV[2] publish command; then
-- per lock i, at 2 + 2(i-1): +1 its waited-for mark, +2 its holder
-- record's own name ('' without fencing), deleted where the lock's value
-- is the owner alone (a lock granted by an older version, see release.lua)
-- -> one 1 (released) or 0 (not the owner) per lock, in order
local out = {}
for i = 1, #KEYS do
  local at = 2 + 2 * (i - 1)
  local v = redis.call('GET', KEYS[i])
  if owned_by(v, ARGV[1]) then
    local n = redis.pcall('DEL', KEYS[i], ARGV[at + 1])
    if type(n) == 'table' then
      redis.call('DEL', KEYS[i])
      n = 2
    end
    if ARGV[at + 2] ~= '' and v == ARGV[1] then redis.pcall('DEL', ARGV[at + 2]) end
    if n > 1 then
      redis.pcall(ARGV[2], string.sub(KEYS[i], 1, -5) .. 'released', '')
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

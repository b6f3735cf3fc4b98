-- Releases every lock of a list that the owner holds, as release.lua
-- releases one: the lock and its waited-for mark deleted, the release
-- announced only when a waiter marked it.
--
-- KEYS[1] the first lock, the one key declared (migration.lua)
-- ARGV[1] owner, ARGV[2] flags (migration.lua: 'c' on a Cluster, where
-- the release is announced with SPUBLISH, else PUBLISH); then per lock i
-- (one slot), at 2 + 2(i-1): +1 its name (the first's is KEYS[1]), +2 its
-- waited-for mark
-- -> one answer per lock, in order: 1 released, 0 not the owner, -1 not
--    on this node, or maybe on the other node of a migrating slot: the
--    caller releases it alone (release.lua, routed by its lock)
local owner = ARGV[1]
local publish = 'PUBLISH'
if cluster then publish = 'SPUBLISH' end
-- On a Cluster each lock is read caught (`pcall`: one not on the node a
-- slot leaves is an error).
local get = redis.call
if cluster then get = redis.pcall end
local out = {}
for i = 1, (#ARGV - 2) / 2 do
  local at = 2 + 2 * (i - 1)
  local lock = ARGV[at + 1]
  local v = get('GET', lock)
  if cluster and not writable(v) then
    out[i] = -1
  elseif owned_by(v, owner) then
    local n = redis.pcall('DEL', lock, ARGV[at + 2])
    if type(n) == 'table' then
      redis.call('DEL', lock)
      n = 2
    end
    if n > 1 then
      redis.pcall(publish, string.sub(lock, 1, -5) .. 'released', '')
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

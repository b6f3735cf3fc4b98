-- KEYS[1] lock; ARGV[1] the holder record's own name ('' without
-- fencing), where a lock granted by an older version keeps it (its value
-- the owner alone, no space: see owner.lua), ARGV[2] waited-for mark,
-- ARGV[3] flags (migration.lua: 'c' on a Cluster, where the release is
-- announced with SPUBLISH, else PUBLISH), ARGV[4] bucket fence counter
-- ('' without fencing), ARGV[5] fence retention ms
-- -> {released 0/1, fence}: an operator's release, whoever holds the lock.
-- With fencing, the bucket's counter is raised to a fresh token (as a
-- grant mints one, token.lua: max(last + 1, TIME in us)), above every
-- token issued for the lock so far; it is answered so that the caller can
-- present it to a fenced resource and shut the old holder out at once.
-- Waiters are woken as by a release. Where the counter is on the other
-- node of a migrating slot, or may be, the fence is TIME alone and the
-- counter is left (as a grant's token then is, acquire.lua).
local released = 0
local v = redis.call('GET', KEYS[1])
if v then
  local n = redis.pcall('DEL', KEYS[1], ARGV[2])
  if type(n) == 'table' then
    redis.call('DEL', KEYS[1])
    n = 2
  end
  if ARGV[1] ~= '' and not string.find(v, ' ', 1, true) then
    redis.pcall('DEL', ARGV[1])
  end
  if n > 1 then
    local publish = 'PUBLISH'
    if cluster then publish = 'SPUBLISH' end
    redis.pcall(publish, string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  released = 1
end
if ARGV[4] == '' then return {released, ''} end
local s = us_of(redis.call('TIME'))
local last = redis.pcall('GET', ARGV[4])
if cluster and not writable(last) then return {released, s} end
if type(last) ~= 'string' then last = nil end
-- max(last + 1, TIME in us), as a grant mints it (token.lua)
s = next_token(last, s)
local set = redis.pcall('SET', ARGV[4], s, 'PX', ARGV[5])
if type(set) == 'table' and set.err then return set end
return {released, s}

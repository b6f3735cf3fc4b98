-- KEYS[1] lock; ARGV[1] waited-for mark, ARGV[2] flags (migration.lua:
-- 'c' on a Cluster, where the release is announced with SPUBLISH, else
-- PUBLISH), ARGV[3] bucket fence counter ('' without fencing), ARGV[4]
-- fence retention ms
-- -> {released 0/1, fence}: an operator's release, whoever holds the lock.
-- With fencing, the bucket's counter is raised to a fresh token (as a
-- grant mints one, token.lua: max(last + 1, TIME in us)), above every
-- token issued for the lock so far; it is answered so that the caller can
-- present it to a fenced resource and shut the old holder out at once.
-- Waiters are woken as by a release. Where the counter is on the other
-- node of a migrating slot, or may be, the fence is TIME alone and the
-- counter is left (as a grant's token then is, acquire.lua).
local released = 0
if redis.call('GET', KEYS[1]) then
  local n = redis.pcall('DEL', KEYS[1], ARGV[1])
  if type(n) == 'table' then
    redis.call('DEL', KEYS[1])
    n = 2
  end
  if n > 1 then
    local publish = 'PUBLISH'
    if cluster then publish = 'SPUBLISH' end
    redis.pcall(publish, string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  released = 1
end
if ARGV[3] == '' then return {released, ''} end
local s = us_of(redis.call('TIME'))
local last = redis.pcall('GET', ARGV[3])
if cluster and not writable(last) then return {released, s} end
if type(last) ~= 'string' then last = nil end
-- max(last + 1, TIME in us), as a grant mints it (token.lua)
s = next_token(last, s)
local set = redis.pcall('SET', ARGV[3], s, 'PX', ARGV[4])
if type(set) == 'table' and set.err then return set end
return {released, s}

-- The grant without fencing (`with_fencing(false)`), on its contended path:
-- the store first sends a plain `SET NX PX`, and runs this only when that
-- found the key taken (or to replay a record).
--
-- KEYS[1] lock, KEYS[2] waited-for mark, KEYS[3] (optional) completed record
-- ARGV[1] owner, ARGV[2] lease ms
-- -> {1, 0} granted, {3, 0} re-entered by the same owner, {0, pttl} held
--    (and the lock marked as waited-for, as acquire.lua does),
--    {2, record} completed (only when KEYS[3] is given)
if KEYS[3] then
  local rec = redis.call('GET', KEYS[3])
  if rec then return {2, rec} end
end
local cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not cur then return {1, 0} end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {3, 0}
end
local pttl = redis.call('PTTL', KEYS[1])
-- At the lock's own expiry (see acquire.lua).
local at = redis.call('PEXPIRETIME', KEYS[1])
if at > 0 then
  redis.call('SET', KEYS[2], '1', 'PXAT', at)
else
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return {0, pttl}

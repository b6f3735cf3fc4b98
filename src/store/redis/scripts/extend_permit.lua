-- KEYS[1] permits (see acquire_permit.lua); ARGV[1] owner, ARGV[2] lease ms
-- -> 1 extended, 0 not held (released, expired, or the set gone)
-- A permit past its end is not brought back: it is removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
if tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
local ends = string.format('%.0f', now + tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ends) then
  redis.call('PEXPIREAT', KEYS[1], ends)
end
return 1

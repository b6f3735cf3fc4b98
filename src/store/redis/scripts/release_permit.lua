-- KEYS[1] permits (see acquire_permit.lua); ARGV[1] owner, ARGV[2] publish
-- command, ARGV[3] waited-for mark, ARGV[4] release channel (the lock's:
-- one subscription serves both kinds)
-- -> 1 released, 0 not held (a permit past its end is removed, and 0)
-- Publishes only when a waiter marked the key (acquire_permit.lua). The
-- mark is not declared (see release.lua): where it has moved already, the
-- release is announced anyway.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(score) <= now then return 0 end
local n = redis.pcall('DEL', ARGV[3])
if type(n) == 'table' then n = 1 end
if n > 0 then
  redis.pcall(ARGV[2], ARGV[4], '')
end
return 1

-- KEYS[1] fence counter; ARGV[1] token, ARGV[2] retention ms
-- Raises the counter to at least the token (Redlock write-back).
local cur = tonumber(redis.call('GET', KEYS[1]))
if not cur or cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1

-- KEYS[1] lock; ARGV[1] owner, ARGV[2] lease ms, ARGV[3] (optional) the
-- holder record (see acquire.lua), renewed with the lock
-- -> 1 extended, 0 not owner
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[3] then redis.pcall('PEXPIRE', ARGV[3], ARGV[2]) end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

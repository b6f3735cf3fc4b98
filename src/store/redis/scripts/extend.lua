-- KEYS[1] lock; ARGV[1] owner, ARGV[2] lease ms -> 1 extended, 0 not owner
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

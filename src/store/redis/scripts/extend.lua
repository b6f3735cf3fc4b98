-- KEYS[1] lock (or a reader-writer lock's writer); ARGV[1] owner,
-- ARGV[2] lease ms
-- -> 1 extended, 0 not owner (see owner.lua)
if owned_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

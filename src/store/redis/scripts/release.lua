-- KEYS[1] lock; ARGV[1] owner, ARGV[2] publish command, ARGV[3] release
-- channel -> 1 released, 0 not owner
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall(ARGV[2], ARGV[3], '')
  return 1
end
return 0

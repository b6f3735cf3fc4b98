-- KEYS[1] lock; ARGV[1] owner, ARGV[2] lease ms, ARGV[3] (optional, with
-- fencing) the holder record's own name, where a lock granted by an older
-- version keeps it (its value the owner alone): renewed with it
-- -> 1 extended, 0 not owner (see owner.lua)
local v = redis.call('GET', KEYS[1])
if owned_by(v, ARGV[1]) then
  if ARGV[3] and v == ARGV[1] then redis.pcall('PEXPIRE', ARGV[3], ARGV[2]) end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

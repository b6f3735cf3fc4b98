-- Hands the lock to another owner (Locker::resume takes an exported lease
-- up under an owner token of its own): one owner-checked step, so that of
-- two callers handing the same owner over, one gets it. The holder record
-- in the value (see owner.lua) stays: the hold is the same grant.
-- KEYS[1] lock; ARGV[1] the owner now, ARGV[2] the new owner, ARGV[3] lease
-- ms, ARGV[4] (optional, with fencing) the holder record's own name, where
-- a lock granted by an older version keeps it (its value the owner
-- alone): it lives as long as the lock
-- -> 1 handed over, 0 not held by ARGV[1]
local v = redis.call('GET', KEYS[1])
if not owned_by(v, ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(v, #ARGV[1] + 1), 'PX', ARGV[3])
if ARGV[4] and v == ARGV[1] then redis.pcall('PEXPIRE', ARGV[4], ARGV[3]) end
return 1

-- Hands the lock to another owner (Locker::resume takes an exported lease
-- up under an owner token of its own): one owner-checked step, so that of
-- two callers handing the same owner over, one gets it.
-- KEYS[1] lock; ARGV[1] the owner now, ARGV[2] the new owner, ARGV[3] lease
-- ms, ARGV[4] (with fencing) the holder record, which lives as long as the
-- lock (see acquire.lua)
-- -> 1 handed over, 0 not held by ARGV[1]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] then redis.pcall('PEXPIRE', ARGV[4], ARGV[3]) end
return 1

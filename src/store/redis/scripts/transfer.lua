-- Hands the lock to another owner (Locker::resume takes an exported lease
-- up under an owner token of its own): one owner-checked step, so that of
-- two callers handing the same owner over, one gets it. The holder record
-- in the value (see owner.lua) stays: the hold is the same grant.
-- KEYS[1] lock; ARGV[1] the owner now, ARGV[2] the new owner, ARGV[3] lease
-- ms
-- -> 1 handed over, 0 not held by ARGV[1]
local v = redis.call('GET', KEYS[1])
if not owned_by(v, ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(v, #ARGV[1] + 1), 'PX', ARGV[3])
return 1

-- KEYS[1] lock; ARGV[1] the holder record (see acquire.lua), ARGV[2] the
-- waited-for mark
-- -> {} free, or {owner, pttl, holder record or '', waited 0/1}
-- Read in one step, so the record is the lock's of that moment. The owner
-- token leaves Redis only to the store, which keeps a one-way hash of it.
local owner = redis.call('GET', KEYS[1])
if not owner then return {} end
local pttl = redis.call('PTTL', KEYS[1])
local record = redis.pcall('GET', ARGV[1])
if type(record) ~= 'string' then record = '' end
local waited = redis.pcall('EXISTS', ARGV[2])
if type(waited) ~= 'number' then waited = 0 end
return {owner, pttl, record, waited}

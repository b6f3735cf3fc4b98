-- KEYS[1] lock; ARGV[1] the waited-for mark
-- -> {} free, or {owner, pttl, holder record or '', waited 0/1}
-- The holder record is in the lock's value, after the owner token and a
-- space (see owner.lua); a value without a space is the owner alone (a
-- grant without fencing: no record). Read in one step, so the record is
-- the lock's of that moment. The owner token leaves Redis only to the store, which
-- keeps a one-way hash of it.
local v = redis.call('GET', KEYS[1])
if not v then return {} end
local pttl = redis.call('PTTL', KEYS[1])
local owner, record = v, ''
local space = string.find(v, ' ', 1, true)
if space then
  owner, record = string.sub(v, 1, space - 1), string.sub(v, space + 1)
end
local waited = redis.pcall('EXISTS', ARGV[1])
if type(waited) ~= 'number' then waited = 0 end
return {owner, pttl, record, waited}

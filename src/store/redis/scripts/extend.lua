-- KEYS[1] lock; ARGV[1] owner, ARGV[2] lease ms, ARGV[3] (optional) 'h'
-- with fencing, where a lock granted by an older version keeps its holder
-- record in a name of its own (its value the owner alone): renewed with
-- it. That name is the lock's with another last part (`…:<id>:lock` →
-- `…:<id>:holder`), made here only for such a lock, not sent: each
-- argument costs Redis about 1,100 instructions (see acquire.lua).
-- -> 1 extended, 0 not owner (see owner.lua)
local v = redis.call('GET', KEYS[1])
if owned_by(v, ARGV[1]) then
  if ARGV[3] and v == ARGV[1] then
    redis.pcall('PEXPIRE', string.sub(KEYS[1], 1, -5) .. 'holder', ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0

-- KEYS[1] lock; ARGV[1] owner, ARGV[2] (optional) flags: 'c' on a Cluster
-- (the release is announced with SPUBLISH, else PUBLISH)
-- -> 1 released, 0 not owner (see owner.lua)
-- The other names are the lock's with another last part (`…:<id>:lock` →
-- `…:<id>:waited`, `…:released`), made here, not sent: each argument
-- costs Redis about 1,100 instructions (see acquire.lua).
-- Publishes only when a waiter marked the lock (see acquire.lua): an
-- uncontended release is the owner check and one DEL. The channel is
-- made only when someone waits. The mark is not declared (a Cluster
-- serves a migrating slot's call where its declared keys are): where the
-- slot is leaving and the mark has moved already, the lock alone is
-- deleted and the release announced (a waiter may have marked it).
if owned_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  local base = string.sub(KEYS[1], 1, -5)
  -- The flag told by equality, which costs next to nothing, where a
  -- `string.find` costs Redis about 1,000 instructions even on an empty
  -- string (the store sends no flags off a Cluster).
  local cluster = ARGV[2] == 'c'
  local n
  if cluster then
    -- The mark may have moved with a migrating slot (see above).
    n = redis.pcall('DEL', KEYS[1], base .. 'waited')
    if type(n) == 'table' then
      redis.call('DEL', KEYS[1])
      n = 2
    end
  else
    -- One primary: nothing to catch (a `pcall` and its `type` check cost
    -- Redis about 700 instructions a release).
    n = redis.call('DEL', KEYS[1], base .. 'waited')
  end
  if n > 1 then
    local publish = 'PUBLISH'
    if cluster then publish = 'SPUBLISH' end
    redis.pcall(publish, base .. 'released', '')
  end
  return 1
end
return 0

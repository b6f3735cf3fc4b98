-- KEYS[1] the writer of a reader-writer lock (see acquire_rw.lua);
-- ARGV[1] owner (checked as every lock's, owner.lua), ARGV[2] publish
-- command, ARGV[3] waited-for mark, ARGV[4] release channel (the lock's:
-- one subscription serves every kind)
-- -> 1 released, 0 not owner
-- Publishes only when a waiter marked the key (acquire_rw.lua). (A
-- reader's release and a waiting writer's withdrawal are a permit's
-- release on their sets: release_permit.lua.)
if not owned_by(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
local n = redis.pcall('DEL', ARGV[3])
if type(n) == 'table' then n = 1 end
if n > 0 then
  redis.pcall(ARGV[2], ARGV[4], '')
end
return 1

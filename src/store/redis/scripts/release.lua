-- KEYS[1] lock, KEYS[2] waited-for mark; ARGV[1] owner, ARGV[2] publish
-- command -> 1 released, 0 not owner
-- Publishes only when a waiter marked the lock (see acquire.lua): an
-- uncontended release is the owner check and one DEL. The channel is the
-- lock's name with `released` for `lock` (`…:<id>:lock` → `…:<id>:released`),
-- made here only when someone waits.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
    redis.pcall(ARGV[2], string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  return 1
end
return 0

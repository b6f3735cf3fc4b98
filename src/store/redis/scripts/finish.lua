-- KEYS[1] lock, KEYS[2] record, KEYS[3] waited-for mark,
-- KEYS[4] (optional, Redlock) record writer
-- ARGV[1] owner, ARGV[2] record, ARGV[3] retention ms,
-- ARGV[4] publish command (the channel as in release.lua)
-- -> 1 stored and released, 0 not owner (nothing stored)
-- The record writer (the owner token, kept as long as the record) lets a
-- Redlock finish that missed its quorum take back exactly what it wrote.
-- Publishes only when a waiter marked the lock, as release.lua does.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  if KEYS[4] then redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[3]) end
  if redis.call('DEL', KEYS[1], KEYS[3]) > 1 then
    redis.pcall(ARGV[4], string.sub(KEYS[1], 1, -5) .. 'released', '')
  end
  return 1
end
return 0

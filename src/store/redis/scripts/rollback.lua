-- KEYS[1] record, KEYS[2] record writer; ARGV[1] owner
-- Deletes the record if `owner` wrote it (Redlock: a finish that missed its
-- quorum) -> 1 deleted, 0 not ours (absent, or a later holder's)
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0

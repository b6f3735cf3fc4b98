-- A grant of one side of a key's reader-writer lock, fenced or not.
-- The readers are a sorted set, owner -> lease end in ms of the server's
-- TIME; the writer is a string (its owner) with the writer's lease as its
-- expiry; the writers waiting are a sorted set, waiter -> mark end. Ended
-- readers and marks are removed here first. Each set expires with its
-- longest member, and Redis deletes a set when its last member goes, so
-- Redis keeps nothing of a key once nothing is held or waited for.
--
-- Writer-preferring: while a writer's mark lasts, no new reader is
-- granted (a reader already holding keeps its hold, and may renew it).
-- A writer that finds the lock busy marks itself (ARGV[4], kept across
-- the tries of one acquire) for a lease; it tries again, so renews the
-- mark, at least every lease/3, and takes it back when it gives up
-- (release_rw.lua, 'q') or is granted (here).
--
-- KEYS[1] readers, KEYS[2] writer, KEYS[3] writers waiting (one hash tag)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] 'r' or 'w', ARGV[4] the
-- waiter ('' for a reader, or a writer's try that does not wait),
-- ARGV[5] waited-for mark, ARGV[6] bucket fence counter ('' without
-- fencing), ARGV[7] fence retention ms
-- -> {1, token} granted, {3, token} ours already (its lease reset),
--    {0, ms} busy: until the writer's lease ends, the last reader's does,
--    or (a reader) the waiting writers' marks lapse; without fencing the
--    token is 0
--
-- A write grant mints a token from the key's bucket counter, as the lock
-- and a permit do (token.lua). A read grant mints none: it answers the
-- counter as it stands (raised to TIME where behind it, never advanced
-- past it), at least the token of every earlier write and below every
-- later write's. Finding it busy marks the key as waited-for until then,
-- so that the next release (or withdrawal) publishes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = now + tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local function keep_until(key, at)
  if redis.call('PEXPIRETIME', key) < at then
    redis.call('PEXPIREAT', key, string.format('%.0f', at))
  end
end
local function last_of(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then return tonumber(last[2]) end
end
local function busy(till)
  if till <= now then till = now + 1 end
  redis.call('SET', ARGV[5], '1', 'PXAT', string.format('%.0f', till))
  return {0, till - now}
end
local writer = redis.call('GET', KEYS[2])
local kind = 1
if ARGV[3] == 'r' then
  if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    kind = 3
  elseif writer then
    return busy(now + redis.call('PTTL', KEYS[2]))
  else
    local marked = last_of(KEYS[3])
    if marked then return busy(marked) end
  end
  redis.call('ZADD', KEYS[1], ends, ARGV[1])
  keep_until(KEYS[1], ends)
else
  if owned_by(writer, ARGV[1]) then
    kind = 3
  elseif writer or redis.call('EXISTS', KEYS[1]) == 1 then
    if ARGV[4] ~= '' then
      redis.call('ZADD', KEYS[3], ends, ARGV[4])
      keep_until(KEYS[3], ends)
    end
    if writer then return busy(now + redis.call('PTTL', KEYS[2])) end
    return busy(last_of(KEYS[1]) or now)
  end
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  if ARGV[4] ~= '' then redis.call('ZREM', KEYS[3], ARGV[4]) end
end
if ARGV[6] == '' then return {kind, 0} end
local s = us_of(t)
local last = redis.call('GET', ARGV[6])
local token
if ARGV[3] == 'r' then
  -- The epoch: the counter, or TIME where the counter is behind it (then
  -- raised to it, so that the next write is above this reader's token).
  if last and not above(s, last) then return {kind, last} end
  token = s
else
  -- token = max(last + 1, TIME in us) (token.lua)
  token = next_token(last, s)
end
redis.call('SET', ARGV[6], token, 'PX', ARGV[7])
return {kind, token}

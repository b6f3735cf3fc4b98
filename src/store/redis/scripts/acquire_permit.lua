-- One permit of a key's semaphore, fenced or not. The permits are a sorted
-- set, owner -> lease end in ms of the server's TIME; expired permits are
-- removed here first, so a crashed holder's permit comes back at its lease
-- end (and not before). The set expires with its longest lease, and Redis
-- deletes it when its last member goes: Redis keeps nothing per key once
-- no permit is held. The token comes from the key's bucket counter, the
-- one the lock's grant uses (see acquire.lua), so that tokens of permits
-- and of the lock of one key rise together.
--
-- KEYS[1] permits: the one key declared (see migration.lua)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] permits (the caller's N),
-- ARGV[4] waited-for mark, ARGV[5] bucket fence counter ('' without
-- fencing), ARGV[6] fence retention ms ('' without fencing), ARGV[7] 'c' on
-- a Cluster (migration.lua)
-- -> {1, token} granted, {3, token} ours already (its lease reset, a fresh
--    token), {0, ms until the soonest permit ends} none free; without
--    fencing the token is 0
--
-- Finding none free marks the key as waited-for until the soonest permit's
-- end, so that the next permit release publishes (release_permit.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = string.format('%.0f', now + tonumber(ARGV[2]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local kind = 1
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  kind = 3
elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local soonest = tonumber(first[2])
  local marked = not cluster
  if cluster then
    local e = redis.pcall('EXISTS', ARGV[4])
    marked = writable(e ~= 0 and e)
  end
  if marked then
    redis.call('SET', ARGV[4], '1', 'PXAT', string.format('%.0f', soonest))
  end
  return {0, soonest - now}
end
redis.call('ZADD', KEYS[1], ends, ARGV[1])
if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ends) then
  redis.call('PEXPIREAT', KEYS[1], ends)
end
if ARGV[5] == '' then return {kind, 0} end
-- The token: max(last + 1, TIME in us) (token.lua). On a Cluster the
-- counter may be on the other node of a migrating slot: the token then
-- rests on TIME alone, as in acquire.lua.
local s = us_of(t)
local last, token
if not cluster then
  -- Read and set to TIME in one call; set again only where the token is
  -- not TIME (the counter was at or past it).
  last = redis.call('SET', ARGV[5], s, 'PX', ARGV[6], 'GET')
  token = next_token(last, s)
  if token ~= s then redis.call('SET', ARGV[5], token, 'PX', ARGV[6]) end
else
  last = redis.pcall('GET', ARGV[5])
  if not writable(last) then return {kind, s} end
  token = next_token(last, s)
  redis.call('SET', ARGV[5], token, 'PX', ARGV[6])
end
return {kind, token}

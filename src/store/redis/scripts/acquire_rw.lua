-- A grant of one side of a key's reader-writer lock, fenced or not.
-- The readers are a sorted set, owner -> lease end in ms of the server's
-- TIME; the writer is a string (its owner) with the writer's lease as its
-- expiry; the writers waiting are a sorted set, waiter -> mark end. Ended
-- readers and marks are removed here. Each set expires with its longest
-- member, and Redis deletes a set when its last member goes, so Redis
-- keeps nothing of a key once nothing is held or waited for.
--
-- Writer-preferring: while a writer's mark lasts, no new reader is
-- granted (a reader already holding keeps its hold, and may renew it).
-- A writer that finds the lock busy marks itself (ARGV[5], kept across
-- the tries of one acquire) for a lease; it tries again, so renews the
-- mark, at least every lease/3, and takes it back when it gives up (a
-- permit's release on the waiting set, release_permit.lua) or is granted
-- (here).
--
-- KEYS[1] this side's name, the one key declared (migration.lua): the
-- readers for a read, the writer for a write
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] 'r' or 'w', ARGV[4] flags
-- (migration.lua: 'c' on a Cluster, 'cm' once the caller found the names
-- a {4} answer asks about on neither node), ARGV[5] the waiter ('' for a
-- reader, or a writer's try that does not wait), ARGV[6] the other side's
-- name (the writer for a read, the readers for a write), ARGV[7] the
-- writers waiting, ARGV[8] waited-for mark, ARGV[9] bucket fence counter
-- ('' without fencing), ARGV[10] fence retention ms
-- -> {1, token} granted, {3, token} ours already (its lease reset),
--    {0, ms} busy: until the writer's lease ends, the last reader's does,
--    or (a reader) the waiting writers' marks lapse; without fencing the
--    token is 0; {4, ''} (a Cluster whose slot migrates, on the node it
--    goes to) a name this grant depends on may be on the node the slot
--    leaves: the writer and the writers waiting for a read, the readers
--    for a write. The caller asks where they are (their `PTTL`, which the
--    Cluster routes: -2 where on neither node) and answers busy for as
--    long as they last, or calls again with 'cm'.
--
-- A write grant mints a token from the key's bucket counter, as the lock
-- and a permit do (token.lua). A read grant mints none: it answers the
-- counter as it stands (raised to TIME where behind it, never advanced
-- past it), at least the token of every earlier write and below every
-- later write's. Finding it busy marks the key as waited-for until then,
-- so that the next release (or withdrawal) publishes.
--
-- Slot migration (migration.lua). The declared side decides where the
-- grant runs. A read runs on the node the slot leaves only where its
-- readers are there: a writer granted since the move began was granted
-- where the slot goes, after the readers were found on neither node, and
-- none can be granted there beside readers that the slot leaves with
-- (the node the slot leaves creates no name), so the writer there is
-- not held anywhere else, and its absence (an error) is taken as such.
-- The writers waiting are then read where they are here; a mark on the
-- other node is not seen (writer preference is best effort while a slot
-- moves). A write runs there only where the writer is held there: it is
-- refused, or re-entered, whatever the readers. On the node the slot goes
-- to, a side absent here may still be on the other node: the grant asks
-- the caller ({4}), unless it did ('cm'). A waiting writer's mark, the
-- waited-for mark and the counter are written only where they cannot be
-- on the other node; the token then rests on TIME alone (acquire.lua).
local read = ARGV[3] == 'r'
local owner, lease, waiter = ARGV[1], ARGV[2], ARGV[5]
local other, waiting, mark = ARGV[6], ARGV[7], ARGV[8]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = now + tonumber(lease)
-- A read of a name beside KEYS[1]: on a Cluster caught (`pcall`), for a
-- name that is not on the node a slot leaves is an error there.
local get = redis.call
if cluster then get = redis.pcall end
-- Whether a name absent here is absent from both nodes: off a migrating
-- slot, or found so by the caller ('cm').
local function gone()
  return not cluster or checked or not is_importing()
end
-- Whether `e`, an error a read answered, is that of a name not on this
-- node (the node a slot leaves): any other is the script's answer.
local function not_here(e)
  return string.find(e.err or '', 'non local', 1, true) ~= nil
end
local function keep_until(key, at)
  if redis.call('PEXPIRETIME', key) < at then
    redis.call('PEXPIREAT', key, string.format('%.0f', at))
  end
end
local function last_of(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then return tonumber(last[2]) end
end
-- Busy until `till`: the waited-for mark set (where it may be written),
-- so that the next release publishes.
local function busy(till)
  if till <= now then till = now + 1 end
  local marked = not cluster
  if cluster then
    local e = redis.pcall('EXISTS', mark)
    marked = writable(e ~= 0 and e)
  end
  if marked then
    redis.call('SET', mark, '1', 'PXAT', string.format('%.0f', till))
  end
  return {0, till - now}
end
local kind = 1
if read then
  local mine = redis.call('ZSCORE', KEYS[1], owner)
  if mine and tonumber(mine) > now then
    kind = 3
  else
    local w = get('GET', other)
    if type(w) == 'table' then
      -- Not on the node the slot leaves, where the readers are: held
      -- nowhere (see above).
      if not not_here(w) then return w end
    elseif w then
      return busy(now + redis.call('PTTL', other))
    end
    local ended = get('ZREMRANGEBYSCORE', waiting, '-inf', now)
    local marks = type(ended) == 'number' and last_of(waiting)
    if marks then return busy(marks) end
    if type(ended) == 'table' and not not_here(ended) then return ended end
    -- The writer or the writers waiting absent here (not emptied here)
    -- may be on the node the slot leaves.
    if (w == false or ended == 0) and not gone() then return {4, ''} end
  end
  redis.call('ZADD', KEYS[1], ends, owner)
  -- Ended readers removed once the grant's own is in: a set emptied here
  -- could not be made again on the node a slot leaves.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  keep_until(KEYS[1], ends)
else
  -- A writer that finds the lock busy marks itself waiting (where the
  -- waiting set may be written).
  local function wait_mark()
    if waiter == '' then return end
    if cluster then
      local e = redis.pcall('EXISTS', waiting)
      if not writable(e ~= 0 and e) then return end
    end
    redis.call('ZADD', waiting, ends, waiter)
    keep_until(waiting, ends)
  end
  local w = redis.call('GET', KEYS[1])
  if w and owned_by(w, owner) then
    kind = 3
  elseif w then
    wait_mark()
    return busy(now + redis.call('PTTL', KEYS[1]))
  else
    local ended = get('ZREMRANGEBYSCORE', other, '-inf', now)
    local readers = type(ended) == 'number' and last_of(other)
    if readers then
      wait_mark()
      return busy(readers)
    end
    if type(ended) == 'table' then
      if not not_here(ended) then return ended end
      return {4, ''}
    end
    -- The readers absent here (not emptied here) may be on the node the
    -- slot leaves.
    if ended == 0 and not gone() then return {4, ''} end
  end
  redis.call('SET', KEYS[1], owner, 'PX', lease)
  if waiter ~= '' then get('ZREM', waiting, waiter) end
end
if (ARGV[9] or '') == '' then return {kind, 0} end
local s = us_of(t)
local last = get('GET', ARGV[9])
-- The counter on the other node, or maybe: TIME alone (acquire.lua).
if cluster and not writable(last) then return {kind, s} end
local token
if read then
  -- The epoch: the counter, or TIME where the counter is behind it (then
  -- raised to it, so that the next write is above this reader's token).
  if last and not above(s, last) then return {kind, last} end
  token = s
else
  -- token = max(last + 1, TIME in us) (token.lua)
  token = next_token(last, s)
end
redis.call('SET', ARGV[9], token, 'PX', ARGV[10])
return {kind, token}

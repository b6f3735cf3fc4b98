-- The grant, fenced or not. The lock value is the owner token; with
-- fencing, the counter is the lock's bucket's (see `bucket`): the last
-- token minted for any lock of the bucket. It only rises, so each lock's
-- tokens rise too, and Redis holds one counter per bucket, however many ids
-- were ever locked. Without fencing (`fencing(false)`) the store first sends
-- a plain `SET NX PX`, and runs this only when that found the key taken (or
-- to replay a record, or to `WAIT` for replicas).
--
-- KEYS[1] lock: the one key declared, so that a Cluster routes the call by
-- the lock alone (see "Slot migration" below)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] waited-for mark, ARGV[4] bucket
-- fence counter ('' without fencing), ARGV[5] fence retention ms ('' without
-- fencing), ARGV[6] '1' on a Cluster, ARGV[7] (optional) the completed
-- record ('' for none), ARGV[8] '1' when the caller found no record on
-- the node a slot migrates from (after a {4} answer), ARGV[9] (optional,
-- with fencing) the holder record's name, ARGV[10] the holder's label
-- -> {1, token} granted, {3, token} re-entered by the same owner (the
--    counter, which is at least the token of its grant), {0, pttl} held,
--    {2, record} completed (only when the record is given), {4, ''} the
--    record may be on the other node of a migrating slot: read it there
--    (a plain GET, which the Cluster routes) and call again; without
--    fencing the token is 0
--
-- Written for Redis' cost model: every redis.call and every Lua string
-- conversion is a large share of the script's time, so the fenced grant is
-- one `SET NX PX GET` (take it, or learn who has it), `TIME`, and one
-- `SET … PX GET` of the counter.
--
-- Finding the lock held (the contended path only) sets the waited-for mark,
-- so that the holder's release announces itself; an uncontended release
-- publishes nothing. The mark lives no longer than the holder's lease (a
-- waiter tries again by then at the latest, and marks again), and the
-- release deletes it. The token is built from TIME's two strings
-- and compared as a string of digits: no number conversion or
-- floating-point formatting on the usual path.
--
-- Slot migration (Cluster). While a slot moves, a node serves a command
-- only if it has every key the command declares, or (the node importing
-- the slot, after ASK) if it declares one key. So the lock is the only key
-- declared: the node that has the lock runs the grant, and a free lock is
-- granted where the slot goes. The other names are reached undeclared:
-- on the node the slot leaves, a name that moved already is an error
-- (caught: `pcall`); on the node it goes to, a name not there yet may still
-- be on the other node, so it is never created there (MIGRATE would find
-- the name taken): the token then rests on TIME alone, as after a
-- counter's retention lapses, and the waiter polls. Whether this node
-- imports the lock's slot is asked only then.
local cluster = ARGV[6] == '1'
local importing
local function is_importing()
  if importing == nil then
    local slot = redis.call('CLUSTER', 'KEYSLOT', KEYS[1])
    local nodes = redis.call('CLUSTER', 'NODES')
    importing = string.find(nodes, '[' .. slot .. '-<-', 1, true) ~= nil
  end
  return importing
end
-- Whether a name may be written here, given what reading it answered
-- (`pcall`: an error table where it moved away, false or nil where absent):
-- it is here, or cannot be on another node.
local function writable(got)
  if type(got) == 'table' then return false end
  return got or not (cluster and is_importing())
end
local fenced = ARGV[4] ~= ''
local record = ARGV[7]
if record == '' then record = nil end
if record then
  local rec = redis.pcall('GET', record)
  if type(rec) == 'table' then return {4, ''} end
  if rec then return {2, rec} end
  if ARGV[8] ~= '1' and not writable(rec) then return {4, ''} end
end
local cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if cur then
  if cur ~= ARGV[1] then
    local pttl = redis.call('PTTL', KEYS[1])
    local marked = not cluster
    if cluster then
      local e = redis.pcall('EXISTS', ARGV[3])
      marked = writable(e ~= 0 and e)
    end
    if marked then
      -- At the lock's own expiry (an absolute time: a relative one taken
      -- from PTTL may land a millisecond past it).
      local at = redis.call('PEXPIRETIME', KEYS[1])
      if at > 0 then
        redis.call('SET', ARGV[3], '1', 'PXAT', at)
      else
        redis.call('SET', ARGV[3], '1', 'PX', ARGV[2])
      end
    end
    return {0, pttl}
  end
  -- Ours already (an attempt whose answer was lost): the counter is at
  -- least the token that attempt minted, and no other holder of this lock
  -- can have come between, so it is a valid token for this grant.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if not fenced then return {3, 0} end
  local last = redis.pcall('GET', ARGV[4])
  if type(last) == 'string' then return {3, last} end
elseif not fenced then
  return {1, 0}
end
-- token = max(last + 1, TIME in us) (token.lua)
local s = now_us()
local last
if not cluster then
  last = redis.call('SET', ARGV[4], s, 'PX', ARGV[5], 'GET')
else
  last = redis.pcall('GET', ARGV[4])
  if not writable(last) then
    -- The counter is on the other node, or may be: TIME alone.
    return {1, s}
  end
  redis.call('SET', ARGV[4], s, 'PX', ARGV[5])
end
local granted = s
s = next_token(last, granted)
if s ~= granted then
  redis.call('SET', ARGV[4], s, 'PX', ARGV[5])
end
-- The holder record, for operators (`inspect`): the token, the grant's
-- server time in us and the label, expiring with the lock (a script's
-- clock stands still, so both expire in the same millisecond); renewed
-- by extend.lua, deleted by the release. `pcall`: where a slot migrates
-- and the name is elsewhere, the grant stands without it.
if ARGV[9] then
  redis.pcall('SET', ARGV[9], s .. ' ' .. granted .. ' ' .. ARGV[10], 'PX', ARGV[2])
end
return {1, s}

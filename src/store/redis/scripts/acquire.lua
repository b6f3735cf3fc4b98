-- The grant, fenced or not. The lock's value is the owner token; with
-- fencing, followed by a space and the holder record for operators
-- (`inspect`): `<token> <granted us> <label>` (see owner.lua), so that the
-- record lives and dies with the lock and costs no command of its own.
-- With fencing, the counter is the lock's bucket's (see `bucket`): the
-- last token minted for any lock of the bucket. It only rises, so each
-- lock's tokens rise too, and Redis holds one counter per bucket, however
-- many ids were ever locked. Without fencing (`fencing(false)`) the store
-- first sends a plain `SET NX PX`, and runs this only when that found the
-- key taken (or to replay a record, or to `WAIT` for replicas).
--
-- KEYS[1] lock: the one key declared, so that a Cluster routes the call by
-- the lock alone (see "Slot migration" below)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] bucket fence counter ('' without
-- fencing), ARGV[4] fence retention ms ('' without fencing), and, each
-- optional (the caller leaves out trailing ones it does not need):
-- ARGV[5] the holder's label (with fencing; '' or absent for none),
-- ARGV[6] flags: 'c' on a Cluster, 'cm' when the caller found no record
-- on either node of a migrating slot (after a {4} answer), ARGV[7] the
-- completed record's name
-- The waited-for mark's name is the lock's with `waited` for `lock`
-- (`…:<id>:lock` → `…:<id>:waited`), made only where it is set.
-- -> token (a string) granted with fencing, {1, 0} granted without,
--    {3, token} re-entered by the same owner (the
--    counter as it stood, or the token of its grant where that is larger:
--    see below), {0, pttl} held,
--    {2, record} completed (only when the record is given), {4, ''} the
--    record may be on the other node of a migrating slot: read it there
--    (a plain GET, which the Cluster routes) and call again; without
--    fencing the token is 0
--
-- Each argument costs Redis about 1,100 instructions and a reply that is
-- a table about 4,800 more than a string (callgrind, BENCHMARKS.md): the
-- usual grant sends four arguments and answers its token alone.
--
-- Written for Redis' cost model: every redis.call and every Lua string
-- conversion is a large share of the script's time, so the fenced grant
-- (one primary, Sentinel) is three calls: `TIME`, one `SET … PX GET` of
-- the counter (its last value read, TIME written), and one `SET NX PX GET`
-- of the lock, whose value carries the token minted from those two (take
-- it, or learn who has it); a fourth, a `SET` of the counter, only when the
-- token is not TIME (the counter was at or past it). The counter is
-- written before the grant is known, so an attempt that does not grant
-- leaves it at least where it was, in this same script: at TIME where
-- that is above it (no token is minted there, and every later one is
-- above it still), else put back. A re-entry (the lock ours already: an
-- attempt whose answer was lost) puts it back in any case, and answers it
-- as it stood: at least the token that attempt minted, and no other holder
-- of this lock can have come between, so it is a valid token for this
-- grant; the grant's own, unless another attempt on a lock of the bucket
-- came between (on Redlock, see `counted_without_write_back`).
--
-- Finding the lock held (the contended path only) sets the waited-for mark,
-- so that the holder's release announces itself; an uncontended release
-- publishes nothing. The mark lives no longer than the holder's lease (a
-- waiter tries again by then at the latest, and marks again), and the
-- release deletes it. The token is built from TIME's two strings
-- and compared as a string of digits: no number conversion or
-- floating-point formatting on the usual path.
--
-- Slot migration (Cluster; migration.lua, prepended, has the rule): the
-- lock is the one key declared, so the node that has the lock runs the
-- grant, and a free lock is granted where the slot goes. The counter and
-- the waited-for mark are reached undeclared: where one may be on the
-- other node, the token rests on TIME alone, as after a counter's
-- retention lapses, and the waiter polls. So on a Cluster the counter is
-- read with a plain `GET` before the grant, and written after it, only
-- where the grant happened (four calls). ARGV[6]'s 'm' ('cm') is about the
-- record alone: it was found on neither node.
local fenced = (ARGV[3] or '') ~= ''
local record = ARGV[7]
if record and record ~= '' then
  local rec = redis.pcall('GET', record)
  if type(rec) == 'table' then return {4, ''} end
  if rec then return {2, rec} end
  if cluster and not checked and not writable(rec) then return {4, ''} end
end
-- now_ms: the script's TIME in ms (fenced: it was read for the token),
-- for the lease left where the lock is found held (at the end).
local now_ms
if not fenced then
  local cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  if not cur then return {1, 0} end
  if owned_by(cur, ARGV[1]) then
    -- Ours already (an attempt whose answer was lost).
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {3, 0}
  end
else
  -- token = max(last + 1, TIME in us) (token.lua)
  local s = us_of(redis.call('TIME'))
  local last
  if not cluster then
    last = redis.call('SET', ARGV[3], s, 'PX', ARGV[4], 'GET')
  else
    -- Read only: written once the grant is known (see "Slot migration").
    last = redis.pcall('GET', ARGV[3])
  end
  local token = next_token(type(last) == 'string' and last, s)
  local value = ARGV[1] .. ' ' .. token .. ' ' .. s .. ' ' .. (ARGV[5] or '')
  -- `pcall`: a lock name of another type (an error) must not leave the
  -- counter as written above (TIME, perhaps below it): Redis does not undo a
  -- script's writes when it fails.
  local cur = redis.pcall('SET', KEYS[1], value, 'NX', 'PX', ARGV[2], 'GET')
  if type(cur) == 'table' then
    if not cluster and type(last) == 'string' then
      redis.call('SET', ARGV[3], last, 'PX', ARGV[4])
    end
    return cur
  end
  -- The counter as it must be left: `token` on a grant; as it was where
  -- this was a re-entry, or where TIME is not above it (it must not fall).
  local mine = cur and owned_by(cur, ARGV[1])
  local read = last
  if mine then
    -- A re-entry answers at least the token of the grant it enters, which
    -- its value carries: the counter may have lapsed meanwhile (its
    -- retention shorter than the hold, an eviction) or been left behind
    -- that token (minted from a counter ahead of the clock, on Redlock).
    -- (A token as the store writes them: no leading zero, at most 19
    -- digits; anything else in the value is not taken for one.)
    local t = string.match(cur, '^%S+ ([1-9]%d*) ')
    if t and #t <= 19 and above(t, type(last) == 'string' and last) then
      last = t
    end
  end
  -- (A fenced grant's value carries its token: a lock of this owner that
  -- this store granted is ours, a re-entry.)
  local ours = mine and type(last) == 'string'
  if not cluster then
    if ours or (cur and token ~= s) then
      redis.call('SET', ARGV[3], last, 'PX', ARGV[4])
    elseif token ~= s then
      redis.call('SET', ARGV[3], token, 'PX', ARGV[4])
    end
  elseif not cur then
    -- The counter is on the other node, or may be: TIME alone.
    if not writable(last) then return token end
    redis.call('SET', ARGV[3], token, 'PX', ARGV[4])
  elseif ours and last ~= read and writable(read) then
    -- A re-entry above the counter (lapsed, or behind its value's token):
    -- the counter put back to it, as on one primary, where it is here.
    redis.call('SET', ARGV[3], last, 'PX', ARGV[4])
  end
  if not cur then return token end
  if ours then
    -- Ours already (an attempt whose answer was lost): see above.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {3, last}
  end
  now_ms = tonumber(string.sub(s, 1, -4))
end
-- Held by another owner: the lease it has left (from `PEXPIRETIME` and
-- `now_ms`, the script's TIME, where read, else `PTTL`), and the
-- waited-for mark set. (Inline, not a function: see migration.lua.)
local waited = string.sub(KEYS[1], 1, -5) .. 'waited'
local at, pttl
if now_ms then
  at = redis.call('PEXPIRETIME', KEYS[1])
  pttl = -1
  if at >= 0 then pttl = math.max(at - now_ms, 0) end
else
  pttl = redis.call('PTTL', KEYS[1])
end
local marked = not cluster
if cluster then
  local e = redis.pcall('EXISTS', waited)
  marked = writable(e ~= 0 and e)
end
if marked then
  -- At the lock's own expiry (an absolute time: a relative one taken
  -- from PTTL may land a millisecond past it).
  at = at or redis.call('PEXPIRETIME', KEYS[1])
  if at > 0 then
    redis.call('SET', waited, '1', 'PXAT', at)
  else
    redis.call('SET', waited, '1', 'PX', ARGV[2])
  end
end
return {0, pttl}

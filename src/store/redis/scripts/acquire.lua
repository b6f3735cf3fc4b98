-- The grant, fenced or not. The lock value is the owner token; with
-- fencing, the counter is the lock's bucket's (see `bucket`): the last
-- token minted for any lock of the bucket. It only rises, so each lock's
-- tokens rise too, and Redis holds one counter per bucket, however many ids
-- were ever locked. Without fencing (`fencing(false)`) the store first sends
-- a plain `SET NX PX`, and runs this only when that found the key taken (or
-- to replay a record, or to `WAIT` for replicas).
--
-- KEYS[1] lock, KEYS[2] waited-for mark, then with fencing KEYS[3] bucket
-- fence counter, and last (optional) the completed record
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] (with fencing only) fence
-- retention ms
-- -> {1, token} granted, {3, token} re-entered by the same owner (the
--    counter, which is at least the token of its grant), {0, pttl} held,
--    {2, record} completed (only when the record key is given); without
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
local fenced = ARGV[3] ~= nil
local record = KEYS[fenced and 4 or 3]
if record then
  local rec = redis.call('GET', record)
  if rec then return {2, rec} end
end
local cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if cur then
  if cur ~= ARGV[1] then
    local pttl = redis.call('PTTL', KEYS[1])
    -- At the lock's own expiry (an absolute time: a relative one taken
    -- from PTTL may land a millisecond past it).
    local at = redis.call('PEXPIRETIME', KEYS[1])
    if at > 0 then
      redis.call('SET', KEYS[2], '1', 'PXAT', at)
    else
      redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
    end
    return {0, pttl}
  end
  -- Ours already (an attempt whose answer was lost): the counter is at
  -- least the token that attempt minted, and no other holder of this lock
  -- can have come between, so it is a valid token for this grant.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if not fenced then return {3, 0} end
  local last = redis.call('GET', KEYS[3])
  if last then return {3, last} end
elseif not fenced then
  return {1, 0}
end
-- token = max(last + 1, TIME in us), as a decimal string: the seconds,
-- then the microseconds zero-padded to 6 digits (string work only: no
-- string <-> number conversion on this path)
local t = redis.call('TIME')
local us = t[2]
local s = t[1] .. string.rep('0', 6 - #us) .. us
local last = redis.call('SET', KEYS[3], s, 'PX', ARGV[3], 'GET')
if last and (#last > #s or (#last == #s and last >= s)) then
  s = string.format('%.0f', tonumber(last) + 1)
  redis.call('SET', KEYS[3], s, 'PX', ARGV[3])
end
return {1, s}

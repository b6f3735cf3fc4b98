-- The fencing token rule of a lock's grant, shared by acquire.lua (one
-- lock) and acquire_all.lua (several): prepended to each (scripts.rs), so
-- that a key's tokens are minted the same way whichever grant takes it.
--
-- now_us(): the server's TIME in microseconds, as a decimal string: the
-- seconds, then the microseconds zero-padded to 6 digits (string work
-- only: no string <-> number conversion on the usual path).
-- next_token(last, now): max(last + 1, now) as a decimal string, `last`
-- being the bucket counter's value (nil or false: none), compared as a
-- string of digits.
local function now_us()
  local t = redis.call('TIME')
  local us = t[2]
  return t[1] .. string.rep('0', 6 - #us) .. us
end
-- above(a, b): whether the decimal string `a` (no leading zero) is above
-- `b` (false or nil: none), compared as strings of digits.
local function above(a, b)
  return not b or #a > #b or (#a == #b and a > b)
end
local function next_token(last, now)
  if last and not above(now, last) then
    return string.format('%.0f', tonumber(last) + 1)
  end
  return now
end

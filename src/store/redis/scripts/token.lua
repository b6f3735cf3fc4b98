-- The fencing token rule, prepended (scripts.rs) to every script that
-- mints a token or moves a bucket's counter: the lock's grant
-- (acquire.lua), the multi-key grant (acquire_all.lua), a permit's
-- (acquire_permit.lua), a read's and a write's (acquire_rw.lua), the
-- operator's forced release (force_release.lua) and the Redlock write-back
-- (raise_fence.lua). So a key's tokens are minted the same way whichever
-- of them takes it, and a counter only ever rises.
--
-- us_of(t): a `TIME` answer in microseconds, as a decimal string: the
-- seconds, then the microseconds zero-padded to 6 digits (string work
-- only: no string <-> number conversion on the usual path).
-- above(a, b): whether the decimal string `a` (no leading zero) is above
-- `b` (false or nil: none), compared as strings of digits.
-- next_token(last, now): max(last + 1, now) as a decimal string, `last`
-- being the bucket counter's value (nil or false: none), `now` the
-- server's time (us_of).
--
-- (Three functions, no more: each function a script defines costs Redis
-- a closure, about 400 instructions, on every call; see BENCHMARKS.md.)
local function us_of(t)
  local us = t[2]
  return t[1] .. string.rep('0', 6 - #us) .. us
end
local function above(a, b)
  return not b or #a > #b or (#a == #b and a > b)
end
local function next_token(last, now)
  if last and not above(now, last) then
    return string.format('%.0f', tonumber(last) + 1)
  end
  return now
end

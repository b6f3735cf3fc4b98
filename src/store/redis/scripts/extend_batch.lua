-- Many renewals in one call: a batch of the watchdog's on one primary.
-- Each renewal is answered on its own, by the one-key script of its kind
-- run unchanged: scripts.rs wraps the bodies of extend.lua and
-- extend_permit.lua as the functions `extend_lock(KEYS, ARGV)` and
-- `extend_permit(KEYS, ARGV)` ahead of this loop, so that a renewal means
-- the same alone and in a batch. (The bodies only read their `KEYS` and
-- `ARGV`: one table of each is refilled for every renewal.)
--
-- KEYS the leases, one per renewal (a lock, a writer, or a permits set)
-- ARGV[1] the kinds, one letter per renewal: 'l' a lock or a writer
--   (extend.lua), 'p' a permit or a reader (extend_permit.lua)
-- ARGV[2] the lease ms of every renewal, or '' where they differ
-- then per renewal i: its owner, and its lease ms where ARGV[2] is ''
-- -> one answer per renewal, in order: its script's answer (1 extended,
--    0 not held), or the error its script met (a key of the wrong type),
--    which fails that renewal alone, as in a pipeline of one call each
--
-- Every argument costs Redis a string (about 1,100 instructions): what
-- is the same for every renewal is sent once.
local kinds = ARGV[1]
-- Whether any renewal is a permit's: if none, no renewal's letter is read
-- (a `string.byte` per renewal costs Redis about 1,000 instructions).
local mixed = string.find(kinds, 'p', 1, true) ~= nil
local w = 1
local keys, args = {}, {}
if ARGV[2] == '' then w = 2 else args[2] = ARGV[2] end
local out = {}
for i = 1, #KEYS do
  local at = 2 + w * (i - 1)
  keys[1], args[1] = KEYS[i], ARGV[at + 1]
  if w == 2 then args[2] = ARGV[at + 2] end
  local one = extend_lock
  if mixed and string.byte(kinds, i) == 112 then one = extend_permit end -- 'p'
  local ok, answer = pcall(one, keys, args)
  if ok then
    out[i] = answer
  elseif type(answer) == 'table' and answer.err then
    out[i] = answer
  else
    out[i] = {err = tostring(answer)}
  end
end
return out

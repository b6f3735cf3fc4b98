-- Many renewals in one call: a batch of the watchdog's on one primary.
-- Each renewal is answered on its own, by the one-key script of its kind
-- run unchanged: scripts.rs wraps the bodies of extend.lua and
-- extend_permit.lua as the functions `extend_lock(KEYS, ARGV)` and
-- `extend_permit(KEYS, ARGV)` ahead of this loop, so that a renewal means
-- the same alone and in a batch. (The bodies only read their `KEYS` and
-- `ARGV`: one table of each is refilled for every renewal.)
--
-- KEYS the leases, one per renewal (a lock, a writer, or a permits set)
-- ARGV[1] the kinds, one letter per renewal: 'l' (extend.lua: a lock or a
-- writer) or 'p' (extend_permit.lua: a permit or a reader); ARGV[2] '1'
-- when each renewal names a holder record (a fenced store), else ''; then
-- per renewal i, at 2 + w(i-1) (w = 3 with holder records, else 2): +1
-- owner, +2 lease ms, +3 the holder record ('' for none; see extend.lua)
-- -> one answer per renewal, in order: its script's answer (1 extended,
--    0 not held), or the error its script met (a key of the wrong type),
--    which fails that renewal alone, as in a pipeline of one call each
--
-- Every argument costs Redis a string: a renewal's kind is one letter of
-- ARGV[1], and a store without fencing sends no holder argument.
local kinds = ARGV[1]
-- Whether any renewal is a permit's: if none, no renewal's letter is read
-- (a `string.byte` per renewal costs Redis about 1,000 instructions).
local permits = string.find(kinds, 'p', 1, true) ~= nil
local w = 2
if ARGV[2] == '1' then w = 3 end
local out = {}
local keys, args = {}, {}
for i = 1, #KEYS do
  local at = 2 + w * (i - 1)
  keys[1], args[1], args[2], args[3] = KEYS[i], ARGV[at + 1], ARGV[at + 2], nil
  if w == 3 and ARGV[at + 3] ~= '' then args[3] = ARGV[at + 3] end
  local one = extend_lock
  if permits and string.byte(kinds, i) == 112 then one = extend_permit end -- 'p'
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

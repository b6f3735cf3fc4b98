-- Many renewals in one call: a batch of the watchdog's on one primary.
-- Each renewal is answered on its own, by the one-key script of its kind
-- run unchanged: scripts.rs wraps the bodies of extend.lua and
-- extend_permit.lua as the functions `extend_lock(KEYS, ARGV)` and
-- `extend_permit(KEYS, ARGV)` ahead of this loop, so that a renewal means
-- the same alone and in a batch.
--
-- KEYS the leases, one per renewal (one lock, a writer, or a permits set)
-- ARGV per renewal i, at 4(i-1): +1 'l' (extend.lua: a lock or a writer)
-- or 'p' (extend_permit.lua: a permit or a reader), +2 owner, +3 lease
-- ms, +4 the holder record ('' for none; see extend.lua)
-- -> one answer per renewal, in order: its script's answer (1 extended,
--    0 not held), or the error its script met (a key of the wrong type),
--    which fails that renewal alone, as in a pipeline of one call each
local out = {}
for i = 1, #KEYS do
  local at = 4 * (i - 1)
  local args = {ARGV[at + 2], ARGV[at + 3]}
  if ARGV[at + 4] ~= '' then args[3] = ARGV[at + 4] end
  local one = extend_lock
  if ARGV[at + 1] == 'p' then one = extend_permit end
  local ok, answer = pcall(one, {KEYS[i]}, args)
  if ok then
    out[i] = answer
  elseif type(answer) == 'table' and answer.err then
    out[i] = answer
  else
    out[i] = {err = tostring(answer)}
  end
end
return out

-- Every lock of a list, or none, in one step: the locks of one primary
-- (or of one Cluster slot). Each key is granted as acquire.lua grants one
-- lock: its value the owner token (with fencing, followed by the holder
-- record: see owner.lua), its fencing token minted from its own bucket's
-- counter (max(last + 1, TIME in us)); so a single lock and a multi-key
-- grant of the same key see each other, and a key's tokens rise across
-- both (the token rule is token.lua's, the one acquire.lua uses).
--
-- KEYS the locks (1 to 64, one slot); ARGV[1] owner, ARGV[2] lease ms,
-- ARGV[3] '1' on a Cluster, ARGV[4] fence retention ms ('' without
-- fencing), ARGV[5] the holder's label; then per lock i, at 5 + 2(i-1):
-- +1 its waited-for mark, +2 its bucket's counter ('' without fencing)
-- -> {1, token...} granted (one token per lock, in order; 0 without
--    fencing), {0, i, pttl} lock i (1-based) held by another owner: nothing
--    taken, every lock found held marked as waited-for, i the one whose
--    lease ends last (-1: no expiry), {4} a slot migrates: nothing taken,
--    take the locks one by one instead (acquire.lua handles migration)
--
-- First every lock and counter is read, and nothing is written until all
-- are free: a partial grant is never seen. A lock ours already (an attempt
-- whose answer was lost) is granted again with a fresh token, above the
-- one it had.
local cluster = ARGV[3] == '1'
if cluster then
  -- Names of the slot may be on either node while it migrates (see
  -- migration.lua, "Slot migration"): leave that to the one-by-one path.
  local slot = redis.call('CLUSTER', 'KEYSLOT', KEYS[1])
  local nodes = redis.call('CLUSTER', 'NODES')
  if string.find(nodes, '[' .. slot .. '-', 1, true) then return {4} end
end
local owner, lease = ARGV[1], ARGV[2]
local fenced = ARGV[4] ~= ''
local last = {}
local held, longest = nil, nil
for i = 1, #KEYS do
  local at = 5 + 2 * (i - 1)
  local cur = redis.call('GET', KEYS[i])
  if cur and not owned_by(cur, owner) then
    local pttl = redis.call('PTTL', KEYS[i])
    local ends = redis.call('PEXPIRETIME', KEYS[i])
    if ends > 0 then
      redis.pcall('SET', ARGV[at + 1], '1', 'PXAT', ends)
    else
      redis.pcall('SET', ARGV[at + 1], '1', 'PX', lease)
    end
    if held == nil or longest ~= -1 and (pttl == -1 or pttl > longest) then
      held, longest = i, pttl
    end
  elseif fenced then
    local counter = ARGV[at + 2]
    if last[counter] == nil then
      local got = redis.pcall('GET', counter)
      if type(got) == 'table' then return {4} end
      last[counter] = got or false
    end
    -- A lock ours already: its token, in its value, is a floor for the
    -- fresh one as the counter is (which may have lapsed meanwhile, or be
    -- behind it: see acquire.lua).
    local t = cur and string.match(cur, '^%S+ ([1-9]%d*) ')
    local l = last[counter]
    if t and #t <= 19 and above(t, l) then
      last[counter] = t
    end
  end
end
if held then return {0, held, longest} end
local out = {1}
local s
if fenced then s = us_of(redis.call('TIME')) end
for i = 1, #KEYS do
  local at = 5 + 2 * (i - 1)
  if fenced then
    local counter = ARGV[at + 2]
    local token = next_token(last[counter], s)
    redis.call('SET', KEYS[i], owner .. ' ' .. token .. ' ' .. s .. ' ' .. ARGV[5], 'PX', lease)
    redis.call('SET', counter, token, 'PX', ARGV[4])
    last[counter] = token
    out[i + 1] = token
  else
    redis.call('SET', KEYS[i], owner, 'PX', lease)
    out[i + 1] = 0
  end
end
return out

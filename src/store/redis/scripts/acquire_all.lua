-- Every lock of a list, or none, in one step: the locks of one primary
-- (or of one Cluster slot). Each key is granted as acquire.lua grants one
-- lock: its value the owner token (with fencing, followed by the holder
-- record: see owner.lua), its fencing token minted from its own bucket's
-- counter (max(last + 1, TIME in us)); so a single lock and a multi-key
-- grant of the same key see each other, and a key's tokens rise across
-- both (the token rule is token.lua's, the one acquire.lua uses).
--
-- KEYS[1] the first lock, the one key declared (migration.lua: a Cluster
-- serves a call of one declared key while its slot migrates)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] flags (migration.lua: 'c' on
-- a Cluster), ARGV[4] fence retention ms ('' without fencing), ARGV[5] the
-- holder's label; then per lock i (1 to 64, one slot), at 5 + 3(i-1): +1
-- its name (the first's is KEYS[1]), +2 its waited-for mark, +3 its
-- bucket's counter ('' without fencing)
-- -> {1, token...} granted (one token per lock, in order; 0 without
--    fencing), {0, i, pttl} lock i (1-based) held by another owner: nothing
--    taken, every lock found held marked as waited-for, i the one whose
--    lease ends last (-1: no expiry), {4} a lock or counter is not on this
--    node, or may be on the other node of a migrating slot: nothing taken,
--    take the locks one by one instead (acquire.lua handles migration)
--
-- First every lock and counter is read, and nothing is written until all
-- are free: a partial grant is never seen. A lock ours already (an attempt
-- whose answer was lost) is granted again with a fresh token, above the
-- one it had.
local owner, lease = ARGV[1], ARGV[2]
local fenced = ARGV[4] ~= ''
local n = (#ARGV - 5) / 3
-- On a Cluster each name is read caught (`pcall`: one not on the node a
-- slot leaves is an error), and must be here or absent from both nodes.
local get = redis.call
if cluster then get = redis.pcall end
local last, found = {}, {}
local held, longest = nil, nil
for i = 1, n do
  local at = 5 + 3 * (i - 1)
  local lock = ARGV[at + 1]
  local cur = get('GET', lock)
  if cluster and not writable(cur) then return {4} end
  if cur and not owned_by(cur, owner) then
    local pttl = redis.call('PTTL', lock)
    if held == nil or longest ~= -1 and (pttl == -1 or pttl > longest) then
      held, longest = i, pttl
    end
    found[#found + 1] = i
  elseif fenced then
    local counter = ARGV[at + 3]
    if last[counter] == nil then
      local got = get('GET', counter)
      if cluster and not writable(got) then return {4} end
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
if held then
  -- Every lock found held marked as waited-for, to its holder's lease end
  -- (where the mark may be written: migration.lua).
  for _, i in ipairs(found) do
    local at = 5 + 3 * (i - 1)
    local mark = ARGV[at + 2]
    local marked = not cluster
    if cluster then
      local e = redis.pcall('EXISTS', mark)
      marked = writable(e ~= 0 and e)
    end
    if marked then
      local ends = redis.call('PEXPIRETIME', ARGV[at + 1])
      if ends > 0 then
        redis.pcall('SET', mark, '1', 'PXAT', ends)
      else
        redis.pcall('SET', mark, '1', 'PX', lease)
      end
    end
  end
  return {0, held, longest}
end
local out = {1}
local s
if fenced then s = us_of(redis.call('TIME')) end
for i = 1, n do
  local at = 5 + 3 * (i - 1)
  if fenced then
    local counter = ARGV[at + 3]
    local token = next_token(last[counter], s)
    redis.call('SET', ARGV[at + 1], owner .. ' ' .. token .. ' ' .. s .. ' ' .. ARGV[5], 'PX', lease)
    redis.call('SET', counter, token, 'PX', ARGV[4])
    last[counter] = token
    out[i + 1] = token
  else
    redis.call('SET', ARGV[at + 1], owner, 'PX', lease)
    out[i + 1] = 0
  end
end
return out

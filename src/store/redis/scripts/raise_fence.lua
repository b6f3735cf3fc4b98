-- KEYS[1] fence counter, KEYS[2] (Redlock write-back only) the lock;
-- ARGV[1] token, ARGV[2] retention ms, ARGV[3] (with KEYS[2]) the owner
-- Raises the counter to at least the token (Redlock write-back, forced
-- release). In a write-back, where the lock is still the owner's, its
-- holder record takes the token too: a write-back reaches at least a
-- majority, so a majority of the nodes then show the token the grant
-- answered, whatever a node that granted late minted (inspect's majority
-- view takes the quorum-th largest token when every node holds the lock).
-- (Compared as strings of digits, token.lua's `above`.)
if above(ARGV[1], redis.call('GET', KEYS[1])) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if KEYS[2] then
  local v = redis.call('GET', KEYS[2])
  if v and v ~= ARGV[3] and owned_by(v, ARGV[3]) then
    -- `<owner> <token> <granted us> <label>`: the token replaced.
    local rest = string.sub(v, #ARGV[3] + 2)
    local space = string.find(rest, ' ', 1, true)
    if space and string.sub(rest, 1, space - 1) ~= ARGV[1] then
      redis.call('SET', KEYS[2], ARGV[3] .. ' ' .. ARGV[1] .. string.sub(rest, space), 'KEEPTTL')
    end
  end
end
return 1

-- The owner check of a lock's value, prepended (scripts.rs) to every
-- script that reads one. A lock's value is its owner token alone (a grant
-- without fencing; a reader-writer lock's writer), or the owner token, one
-- space and the holder record `<token> <granted us> <label>` (a fenced
-- grant, see acquire.lua). Owner
-- tokens are of one length and have no space, so the value is `owner`'s
-- exactly when it is `owner`, or starts with `owner` and a space: another
-- owner's value, or one that merely starts with `owner`, is not.
--
-- owned_by(v, owner): whether `v` (a GET's answer: false where the lock is
-- free) is `owner`'s.
local function owned_by(v, owner)
  if v == owner then return true end
  return v ~= false and string.byte(v, #owner + 1) == 32
    and string.sub(v, 1, #owner) == owner
end

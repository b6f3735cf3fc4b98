-- The slot-migration prelude (Cluster), prepended (scripts.rs) to every
-- script that reaches names beside the one key it declares. scripts.rs
-- writes its first line, `local flags = ARGV[n]`: the script's flags,
-- 'c' on a Cluster, 'cm' on a Cluster when the caller looked, after the
-- script's {4} answer, for the names it asked about and found them on
-- neither node of a migrating slot (which names is the script's to say);
-- absent or '' elsewhere. (Told apart by equality, which costs next to
-- nothing: a `string.find` costs Redis about 1,000 instructions.)
--
-- Slot migration. While a slot moves, a node serves a command only if it
-- has every key the command declares, or (the node importing the slot,
-- after ASK) if it declares one key. So a script declares one key, the
-- name that decides where it runs: the node that has it, or, where the
-- node the slot leaves does not (it never creates a name of the slot any
-- more), the node it goes to, where it is then created. The other names
-- are reached undeclared: on the node the slot leaves, a name that is not
-- there (moved already, or never written) reads as an error (caught:
-- `pcall`) and cannot be created; on the node the slot goes to, a name not
-- there yet may still be on the other node, so it is never created there
-- (MIGRATE would find the name taken) unless it cannot be elsewhere. A
-- name found missing on the node a slot leaves stays missing there until
-- the move ends, so what the caller finds of it holds for the retry.
--
-- cluster: whether the script runs on a Cluster (flags 'c' or 'cm').
-- checked: flags 'cm' (see above).
-- is_importing(): whether this node imports KEYS[1]'s slot (asked once a
-- call, and only when a name is missing here: two CLUSTER calls).
-- writable(got): whether a name may be written here, given what reading it
-- answered (`pcall`: an error table where it is not here on the node a
-- slot leaves, false or nil where absent): it is here, or cannot be on
-- another node. Off a Cluster every name may be.
--
-- The helpers are made on a Cluster only (nil elsewhere): each function a
-- script defines costs Redis a closure on every call (see BENCHMARKS.md).
local cluster = flags == 'c' or flags == 'cm'
local checked = flags == 'cm'
local is_importing, writable
if cluster then
  local importing
  is_importing = function()
    if importing == nil then
      local slot = redis.call('CLUSTER', 'KEYSLOT', KEYS[1])
      local nodes = redis.call('CLUSTER', 'NODES')
      importing = string.find(nodes, '[' .. slot .. '-<-', 1, true) ~= nil
    end
    return importing
  end
  writable = function(got)
    if type(got) == 'table' then return false end
    return got or not is_importing()
  end
end

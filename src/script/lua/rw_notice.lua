-- The read-write lock's notices (after rw_prologue.lua; they run once per key), for the scripts
-- other than the grants and the release (which inlines them: it is on the hot path).
--
-- `was_forced(owner)` is true when `forced` names the owner (a forced unlock freed it);
-- `announce(how)` publishes an empty message on the lock's channel (`s` SPUBLISH, `p` PUBLISH,
-- anything else nothing).
local function was_forced(owner)
  return rw[7] and string.find(' ' .. rw[7] .. ' ', ' ' .. owner .. ' ', 1, true) ~= nil or false
end
local function announce(how)
  if how == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif how == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end

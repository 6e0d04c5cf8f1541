-- rw_extend: move this owner's lease (its read entry or its write hold) to now + TTL, never
-- shortening it while the owner has several holds (own_prologue.lua, own_keep.lua,
-- rw_prologue.lua, rw_entry.lua, rw_notice.lua, rw_lease.lua and rw_raise.lua first).
--
-- KEYS[1] the lock's hash. ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] expiry grace.
--
-- Replies: {1, remaining ms} extended; {0, 0} no live entry of this owner; {-1, 0} it is gone
-- and another owner writes; {-2, 0} (before -1/0) it is gone and `forced` names the owner: a
-- forced unlock freed it (see rw_force_unlock.lua). Touches only this owner's entry. allow-oom.
#!lua flags=allow-oom
local role, expires, value = role()
if not role then
  if was_forced(ARGV[1]) then return {-2, 0} end
  if writer_live then return {-1, 0} end
  return {0, 0}
end
if expires <= now_ms then return {0, 0} end
local ends = now_ms + tonumber(ARGV[2])
if holds and expires > ends then ends = expires end
set_until(ARGV[1], role, ends, value)
raise(last_fence, ends)
return {1, ends - now_ms}

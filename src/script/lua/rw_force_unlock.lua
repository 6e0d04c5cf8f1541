-- rw_force_unlock: an operator frees a read-write lock whoever holds it (own_prologue.lua,
-- own_keep.lua, rw_prologue.lua, rw_entry.lua, rw_notice.lua and inspect.lua first). The writer and every reader go, with
-- their hold counts and hold fields; the fence stays; a waiting writer's intent stays (it is
-- a waiter, not a hold, and lapses on its own). When live holds were freed, their owners'
-- tokens (the live writer's and each live reader's, space separated, at most one entry per
-- freed owner) replace `forced`, so a freed owner's next release, extend or renewal answers -2
-- and its re-entry or downgrade -3 (freed by a forced unlock) instead of 0 or -1; `forced` is
-- no hold (inspection, `settle` and the expiry rule ignore it) and goes with the key. When the
-- key is left without holders it expires by the usual rule (`settle`), and the release is
-- announced on the lock's channel.
--
-- KEYS[1] the lock's hash. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms (unused),
-- ARGV[3] expiry grace.
--
-- Replies: the inspection of the state it found, before freeing it. allow-oom.
#!lua flags=allow-oom
local before = inspect('rw')
local freed, owners = 0, {}
if writer_live then owners[1] = writer end
local flat = redis.call('HGETALL', KEYS[1])
for n = 1, #flat, 2 do
  local field = flat[n]
  local head = string.sub(field, 1, 2)
  if field == 'w' or field == 'wu' or field == 'rs' or head == 'r:' or head == 'c:' or head == 'h:' then
    redis.call('HDEL', KEYS[1], field)
    freed = freed + 1
    local reader = string.sub(field, 3)
    if head == 'r:' and (tonumber(string.match(flat[n + 1], '^(%d+)')) or 0) > now_ms
      and not (writer_live and reader == writer) then
      owners[#owners + 1] = reader
    end
  end
end
rw[8] = false
if #owners > 0 then
  rw[7] = table.concat(owners, ' ')
  redis.call('HSET', KEYS[1], 'forced', rw[7])
end
if freed > 0 then
  settle()
  if before[2] == 1 then announce(ARGV[1]) end
end
return before

-- The read-write lock's prologue (after the lock prologue's and the fence rule's code): its hash
-- `fencelock:{NAME}:rw` holds `fence` (the one counter), the writer `w` (owner) and `wu` (lease
-- end ms), one field `r:<owner>` = `<lease end ms>:<fence>` per reader, the first waiting
-- writer's intent `i` (its wait id) and `iu` (intent lease end ms), and for an owner with
-- re-entered holds `c:<owner>` (hold count) and `h:<owner>:<id>` per hold (`<id>` empty for
-- the first), and `rs` (ms) while a read was refused at `MAX_READERS` live readers: the first of
-- them ends then, so until then (or until a reader entry goes) no read needs to count them again;
-- after a forced unlock that freed live holds `forced` = the freed owners' tokens, space
-- separated (see rw_force_unlock.lua; not a hold: `settle` does not count it).
--
-- `writer_live`, `intent_live`; `role_of(owner)` → `'w'|'r'|nil, lease end, reader value`;
-- `set_until(owner, role, ends, value)`; `forget(owner, role)` removes an entry and its holds (a reader's also `rs`);
-- `raise(fence, ends)` (raise.lua, inserted before this snippet) the key's expiry, never
-- shortened (a live entry may need it); `settle()` after a release: when no writer or
-- reader entry is left, the key expires `grace` after now (or after a live intent's end).
-- `until_of(value)` and `fence_of(value)` read a reader entry; `was_forced(key, owner)` is
-- true when `forced` names the owner (one `HGET`, for failure paths only); they run once per
-- script call (above the `--@key` line, see prologue.lua), the rest once per key.
local function until_of(v) return tonumber(string.match(v or '', '^(%d+)')) end
local function fence_of(v) return tonumber(string.match(v or '', ':(%d+)$')) end
local function was_forced(key, owner)
  local list = redis.call('HGET', key, 'forced')
  return list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) ~= nil or false
end
--@key
local rw = redis.call('HMGET', KEYS[1], 'w', 'wu', 'i', 'iu')
local writer, writer_until, intent, intent_until = rw[1], tonumber(rw[2]), rw[3], tonumber(rw[4])
local writer_live = writer and writer_until and writer_until > now_ms
local intent_live = intent and intent_until and intent_until > now_ms
local function role_of(owner)
  if writer == owner then return 'w', writer_until or 0 end
  local value = redis.call('HGET', KEYS[1], 'r:' .. owner)
  if value then return 'r', until_of(value) or 0, value end
  return nil, 0
end
local function set_until(owner, role, ends, value)
  if role == 'w' then
    redis.call('HSET', KEYS[1], 'wu', string.format('%.0f', ends))
  else
    redis.call('HSET', KEYS[1], 'r:' .. owner,
      string.format('%.0f', ends) .. ':' .. string.format('%.0f', fence_of(value) or 0))
  end
end
local function forget(owner, role)
  if role == 'w' then redis.call('HDEL', KEYS[1], 'w', 'wu')
  else redis.call('HDEL', KEYS[1], 'r:' .. owner, 'rs') end
  if redis.call('HDEL', KEYS[1], 'c:' .. owner) == 1 then
    local prefix = 'h:' .. owner .. ':'
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
      if string.sub(field, 1, #prefix) == prefix then redis.call('HDEL', KEYS[1], field) end
    end
  end
end
local function settle()
  local left = redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], 'fence')
    - redis.call('HEXISTS', KEYS[1], 'rs')
    - redis.call('HEXISTS', KEYS[1], 'forced')
  local ends = now_ms
  if redis.call('HEXISTS', KEYS[1], 'i') == 1 then
    left = left - 2
    local iu = tonumber(redis.call('HGET', KEYS[1], 'iu'))
    if iu and iu > ends then ends = iu end
  end
  if left <= 0 then keep(KEYS[1], lock[3], ends) end
end
local function announce(how)
  if how == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif how == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end

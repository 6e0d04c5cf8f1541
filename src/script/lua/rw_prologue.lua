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
-- One `HMGET` per key reads what every script needs (`rw`): `w`, `wu`, `i`, `iu`, then
-- `r:<ARGV[1]>`, `c:<ARGV[1]>` (ARGV[1] is the owner token in every script but rw_withdraw and
-- rw_force_unlock, which do not use them), `forced` and `rs`.
-- `writer_live`, `intent_live`; `role()` → `'w'|'r'|nil, lease end, reader value` of the owner
-- ARGV[1]; `holds` its hold count (nil for one hold); `set_until(owner, role, ends, value)`;
-- `forget(owner, role, also)` removes an entry and its holds (a reader's also `rs`, and the
-- field `also` if given, in the same `HDEL`; for the owner ARGV[1] it looks for no `c:` field
-- when `holds` says there is none); `extra` the fields that are no hold (`fence`, `i`, `iu`,
-- `forced`, `rs`, `waiters`: their values, nil when absent), as read and as the script changes
-- them since (a script that writes or deletes one updates it); `waiting()` after a refusal sets
-- `waiters` (the lock prologue reads it as `lock[5]`) unless set, so the next release,
-- downgrade or withdrawal announces, and removes it (as the mutex's `waiters`);
-- `raise(fence, ends)` (raise.lua, inserted before this snippet) the key's expiry, never
-- shortened (a live entry may need it); `settle()` after a release: when no writer or
-- reader entry is left (the hash's length, `HLEN`, less the `extra` fields), the key expires
-- `grace` after now (or after a live intent's end).
-- `until_of(value)` and `fence_of(value)` read a reader entry; `was_forced(owner)` is true when
-- `forced` names the owner; `announce(how)` publishes an empty message on the lock's channel
-- (`s` SPUBLISH, `p` PUBLISH). `until_of` and `fence_of` run once per script call (above the
-- `--@key` line, see prologue.lua), the rest once per key. Numbers go to commands as Lua
-- numbers where they pass exactly (below 2^53); only a value joined into a string is formatted.
local function until_of(v) return tonumber(string.match(v or '', '^(%d+)')) end
local function fence_of(v) return tonumber(string.match(v or '', ':(%d+)$')) end
--@key
local rw = redis.call('HMGET', KEYS[1], 'w', 'wu', 'i', 'iu', 'r:' .. ARGV[1], 'c:' .. ARGV[1],
  'forced', 'rs')
local writer, writer_until, intent, intent_until = rw[1], tonumber(rw[2]), rw[3], tonumber(rw[4])
local writer_live = writer and writer_until and writer_until > now_ms
local intent_live = intent and intent_until and intent_until > now_ms
local holds = tonumber(rw[6])
local extra = {fence = lock[3], i = rw[3], iu = rw[4], forced = rw[7], rs = rw[8], waiters = lock[5]}
local function was_forced(owner)
  return rw[7] and string.find(' ' .. rw[7] .. ' ', ' ' .. owner .. ' ', 1, true) ~= nil or false
end
local function role()
  if writer == ARGV[1] then return 'w', writer_until or 0 end
  if rw[5] then return 'r', until_of(rw[5]) or 0, rw[5] end
  return nil, 0
end
local function set_until(owner, role, ends, value)
  if role == 'w' then
    redis.call('HSET', KEYS[1], 'wu', ends)
  else
    redis.call('HSET', KEYS[1], 'r:' .. owner,
      string.format('%.0f', ends) .. ':' .. (string.match(value or '', ':(%d+)$') or '0'))
  end
end
local function forget(owner, role, also)
  local fields = {'w', 'wu'}
  if role ~= 'w' then
    fields = {'r:' .. owner, 'rs'}
    extra.rs = nil
  end
  if also then
    fields[#fields + 1] = also
    extra[also] = nil
  end
  if owner == ARGV[1] then
    if not holds then return redis.call('HDEL', KEYS[1], unpack(fields)) end
    fields[#fields + 1] = 'c:' .. owner
    redis.call('HDEL', KEYS[1], unpack(fields))
  else
    redis.call('HDEL', KEYS[1], unpack(fields))
    if redis.call('HDEL', KEYS[1], 'c:' .. owner) == 0 then return end
  end
  local prefix = 'h:' .. owner .. ':'
  fields = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, #prefix) == prefix then fields[#fields + 1] = field end
  end
  for n = 1, #fields, 512 do
    redis.call('HDEL', KEYS[1], unpack(fields, n, math.min(n + 511, #fields)))
  end
end
local function settle()
  local left = redis.call('HLEN', KEYS[1])
  for _, present in pairs(extra) do
    if present then left = left - 1 end
  end
  local ends = now_ms
  local iu = tonumber(extra.iu)
  if extra.i and iu and iu > ends then ends = iu end
  if left <= 0 then keep(KEYS[1], lock[3], ends) end
end
local function waiting()
  if not lock[5] then redis.call('HSET', KEYS[1], 'waiters', 1) end
end
local function announce(how)
  if how == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif how == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end

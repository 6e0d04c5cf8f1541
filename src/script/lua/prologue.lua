-- The prologue every mutex and fair-lock script shares (inserted after its `#!lua` line): the
-- server's time, the lock's state and its key's lifetime. It defines no function (a function a
-- script defines costs the server about 1.5k instructions per call): the helpers `keep`,
-- `clear` and `store` are in keep.lua, a snippet of the scripts that call them; the mutex's
-- acquire and release inline what their common paths need instead.
--
-- Key layout 2 (docs/design.md, "Key layout"): the lock is a hash whose field `until` packs its
-- whole state, "<lease end ms> <fence> <owner>" followed by ` h<holds>` when the lock is
-- re-entered and ` w<waiters>` when an acquire found it busy since it was last freed (lease end
-- 0 and owner empty for a free lock: "0 <fence> "); one `HGET` reads it and one `HSET` writes
-- it. The other fields are the rare paths' own: `h:<id>` (a re-entered lock's holds),
-- `forced` (force_unlock.lua), and a queue's places (acquire.lua, fair.lua). Layout 1 (fencelock
-- before layout 2) kept `owner`, `until`, `fence`, `holds` and `waiters` as fields: a script of
-- layout 1 fails on a layout-2 key before any write (its `until` is not a number), and a
-- layout-1 key met here is converted in place when no layout-1 client holds it (the fence, a
-- queue's places, with the `q` mark, and any other waiters mark kept), or refused with an error
-- reply naming the layout while one does. The conversion is a write that comes before any
-- other refusal of the script (an idempotent one: a refused call leaves the key converted).
--
-- The part above the `--@key` line runs once per script call (a batch's keys share it, see
-- batch.lua), the part below once per key. `now_us` is `TIME` in microseconds, `now_ms` in
-- milliseconds (read once per script call: the keys of a batch share it, so a lease may start
-- up to one batch's run time early, which only shortens it); `lock` is the state as a table
-- {owner, until, fence, holds, waiters} (strings, nil where absent: `until` nil for a free lock,
-- `fence` '0' for none yet), `owner` and `expires` its first two (`expires` a number, or false
-- without a lease end); `live` is true when `owner` holds an unexpired lease; `lock[4]` is the
-- hold count of a re-entered lock (absent for one hold); `lock[5]` is set when an acquire found
-- the lock busy since it was last freed (a waiter may listen: the release announces).
--
-- The last `ARGV` of every lock script is the key's expiry grace in ms (`grace`, a number), or
-- empty to keep the key for good (`grace` false); the key-expiry rule is keep.lua's. `memo`
-- (declared before the prologue, one table per script call, shared by the keys of a batch)
-- caches what one call reads once; `grace` is set anew for each key. Numbers below 2^53 go to
-- `redis.call` formatted with `%d` (exact, and cheaper than a Lua number or `%.0f`).
local now_us, now_ms
do
  local now = redis.call('TIME')
  now_us = now[1] * 1000000 + now[2]
  now_ms = (now_us - now_us % 1000) / 1000
end
local grace
--@key
grace = ARGV[#ARGV]
grace = grace ~= '' and grace + 0
local lock
do
  local state = redis.call('HGET', KEYS[1], 'until')
  local u, f, o, marks
  if state then u, f, o, marks = string.match(state, '^(%d+) (%d+) (%S*)(.*)$') end
  if u then
    local holds, waiters
    if marks == ' wq' then
      waiters = 'q'
    elseif marks ~= '' then
      holds = string.match(marks, ' h(%d+)')
      waiters = string.match(marks, ' w(%S+)')
    end
    -- One constructor: a table grown field by field costs the server about 2.5k more.
    lock = {o ~= '' and o or nil, u ~= '0' and u or nil, f, holds, waiters}
  elseif state or redis.call('HEXISTS', KEYS[1], 'fence') == 1 then
    -- A layout-1 key (see above).
    local old = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'waiters')
    if old[1] and (tonumber(old[2]) or 0) > now_ms then
      return redis.error_reply('ERR fencelock: ' .. KEYS[1] .. ' is held by a client of key layout 1 (fields owner/until/fence); this client uses key layout 2: let the older clients stop (see "Key layout" in docs/design.md)')
    end
    local gone, queued = {'owner', 'fence', 'holds', 'waiters'}, old[4] == 'q'
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
      local kind = string.sub(field, 1, 2)
      if kind == 'h:' then gone[#gone + 1] = field elseif kind == 'q:' then queued = true end
    end
    redis.call('HDEL', KEYS[1], unpack(gone))
    local mark = old[4]
    if queued then mark = 'q' elseif mark and not string.match(mark, '^%S+$') then mark = nil end
    lock = {nil, nil, string.format('%d', tonumber(old[3]) or 0), nil, mark}
    redis.call('HSET', KEYS[1], 'until', '0 ' .. lock[3] .. ' ' .. (mark and ' w' .. mark or ''))
  else
    lock = {nil, nil, '0', nil, nil}
  end
end
local owner, expires = lock[1], lock[2] and lock[2] + 0
local live = owner and expires and expires > now_ms

-- The lock prologue's helpers (inserted after prologue.lua in the scripts that call them; the
-- mutex's acquire and release inline what their common paths need instead, so they define
-- none: see prologue.lua). They are defined once per script call (the part above `--@key`).
--
-- `store(key, s)` writes the state `s` = {owner, until, fence, holds, waiters} (as the
-- prologue's `lock`: strings or numbers, nil where absent) into the field `until` of `key`
-- in key layout 2 (prologue.lua), and any further field-value pairs given after `s` in the same
-- `HSET`. The caller's table is its own: `store` keeps no copy.
--
-- `clear(key, lock)` removes the hold: the state keeps only `lock`'s fence, and for a
-- re-entered lock (`lock[4]` set) the `h:<id>` hold fields go too; `forced` (the owner token a
-- forced unlock freed, see force_unlock.lua) and a queue's places (acquire.lua) stay. `lock`
-- itself is not changed.
--
-- The key-expiry rule: `keep(key, fence, ends)` is called after every write that grants or
-- extends. In a call that granted (the fence rule set `memo.shift`) it sets the key to expire at
-- `max(ends, fence as ms) + grace`, the fence read as server time (`fence - memo.shift` µs),
-- where `ends` is the lease end (or now, for a freed lock): in clock and hybrid modes the next
-- grant after the key expired starts above the fence, as the clock has passed it by `grace`.
-- Any other write sets it to max(`ends`, fence as ms) + grace when the fence read as ms is at
-- most 1 ms ahead of `ends` (clock mode, a fence granted in the current millisecond rounding up;
-- this may lower it), else only raises the expiry to `ends + grace` (or sets it on a key without
-- one): the grant's expiry already covers the fence, which for an epoch-clock fence is far
-- ahead of the clock. Without a grace it removes any expiry. A release only removes fields and
-- leaves the expiry alone.
local function keep(key, fence, ends)
  if not grace then return redis.call('PERSIST', key) end
  fence = (fence or 0) + 0
  if not memo.shift and fence > (ends + 1) * 1000 then
    local current = redis.call('PEXPIRETIME', key)
    if current < ends + grace then redis.call('PEXPIREAT', key, string.format('%d', ends + grace)) end
    return
  end
  local fence_ms = math.ceil((fence - (memo.shift or 0)) / 1000)
  if fence_ms > ends then ends = fence_ms end
  redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
end
local function store(key, s, ...)
  local v = string.format('%d %d ', tonumber(s[2]) or 0, tonumber(s[3]) or 0) .. (s[1] or '')
  if s[4] then v = v .. ' h' .. s[4] end
  if s[5] then v = v .. ' w' .. s[5] end
  redis.call('HSET', key, 'until', v, ...)
end
local function clear(key, lock)
  if lock[4] then
    local gone = {}
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
    end
    if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  end
  redis.call('HSET', key, 'until', '0 ' .. lock[3] .. ' ')
end
--@key

-- The prologue every lock script shares (inserted after its `#!lua` line): the server's
-- time, the lock's state and its key's lifetime.
--
-- The part above the `--@key` line runs once per script call (a batch's keys share it, see
-- batch.lua), the part below once per key. `now_us` is `TIME` in microseconds, `now_ms` in
-- milliseconds (read once per script call: the keys of a batch share it, so a lease may start
-- up to one batch's run time early, which only shortens it); `lock` is `HMGET KEYS[1] owner
-- until fence holds waiters`, `owner` and `expires` its first two; `live` is true when `owner`
-- holds an unexpired lease; `lock[4]` is the hold count of a re-entered lock (absent for one hold);
-- `lock[5]` is set when an acquire found the lock busy since it was last freed (a waiter may
-- listen: the release announces). `clear(KEYS[1], lock)` removes the hold: `owner`, `until`,
-- `waiters`, and a re-entered lock's `holds` and `h:<id>` fields; `fence`, `forced` (the owner
-- token a forced unlock freed, see force_unlock.lua) and a queue's places stay.
--
-- The last `ARGV` of every lock script is the key's expiry grace in ms, or empty to keep the
-- key for good. `keep(key, fence, ends)` is called after every write that grants or extends.
-- In a call that granted (the fence rule set `memo.shift`) it sets the key to expire at
-- `max(ends, fence as ms) + grace`, the fence read as server time (`fence - memo.shift` µs),
-- where `ends` is the lease end (or now, for a freed lock): in clock and hybrid modes the next
-- grant after the key expired starts above the fence, as the clock has passed it by `grace`.
-- Any other write sets it to `ends + grace` when the fence read as ms is behind `ends` (clock
-- mode), else only raises the expiry to that (or sets it on a key without one): the grant's
-- expiry already covers the fence, which for an epoch-clock fence is far ahead of the clock. Without a grace it removes any expiry. A release only removes fields and
-- leaves the expiry alone. `memo` (declared before the prologue, one table per script call,
-- shared by the keys of a batch) caches what one call reads once; `grace` is set anew for
-- each key.
local now_us, now_ms
do
  local now = redis.call('TIME')
  now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  now_ms = math.floor(now_us / 1000)
end
local grace
local function keep(key, fence, ends)
  if not grace then return redis.call('PERSIST', key) end
  if not memo.shift and math.ceil((tonumber(fence) or 0) / 1000) > ends then
    local current = redis.call('PEXPIRETIME', key)
    if current < 0 or current < ends + grace then
      redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
    end
    return
  end
  local fence_ms = math.ceil(((tonumber(fence) or 0) - (memo.shift or 0)) / 1000)
  if fence_ms > ends then ends = fence_ms end
  redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
end
local function clear(key, lock)
  if not lock[4] then return redis.call('HDEL', key, 'owner', 'until', 'waiters') end
  local gone = {'owner', 'until', 'waiters', 'holds'}
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
  end
  redis.call('HDEL', key, unpack(gone))
end
--@key
grace = tonumber(ARGV[#ARGV])
local lock = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'holds', 'waiters')
local owner, expires = lock[1], tonumber(lock[2])
local live = owner and expires and expires > now_ms

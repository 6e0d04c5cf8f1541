-- The prologue every lock script shares (inserted after its `#!lua` line): the server's
-- time, the lock's state and its key's lifetime. It defines no function (a function a script
-- defines costs the server about 1.5k instructions per call): the helpers `keep` and `clear`
-- are in keep.lua, a snippet of the scripts that call them; the mutex's acquire and release
-- inline their uncontended use instead.
--
-- The part above the `--@key` line runs once per script call (a batch's keys share it, see
-- batch.lua), the part below once per key. `now_us` is `TIME` in microseconds, `now_ms` in
-- milliseconds (read once per script call: the keys of a batch share it, so a lease may start
-- up to one batch's run time early, which only shortens it); `lock` is `HMGET KEYS[1] owner
-- until fence holds waiters`, `owner` and `expires` its first two (`expires` a number, or false
-- without `until`); `live` is true when `owner` holds an unexpired lease; `lock[4]` is the hold
-- count of a re-entered lock (absent for one hold); `lock[5]` is set when an acquire found the
-- lock busy since it was last freed (a waiter may listen: the release announces).
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
local lock = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'holds', 'waiters')
local owner, expires = lock[1], lock[2] and lock[2] + 0
local live = owner and expires and expires > now_ms

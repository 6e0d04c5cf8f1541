-- The prologue of the primitives that keep their own fields in their hash (the read-write lock
-- and the semaphore), in place of the lock prologue (prologue.lua, which also reads the mutex's
-- fields `owner until fence holds waiters` and defines helpers every script pays for): the
-- server's time and the key's expiry grace, nothing read from the key and no function defined
-- (in Redis 7.0 each function a script defines costs about 1k instructions per call: a script
-- takes only the snippets whose functions it calls). Each primitive reads what it uses in its
-- own one `HMGET`.
--
-- The part above the `--@key` line runs once per script call (a batch's keys share it, see
-- batch.lua), the part below once per key. `now_us`, `now_ms`: `TIME` in µs and ms, read once
-- per script call, as in prologue.lua. `grace` is the last `ARGV` as a number (the key's expiry
-- grace in ms), nil to keep the key for good; set anew for each key.
--
-- Numbers go to commands as strings formatted with `%d` in the scripts built on it: exact below
-- 2^53, and cheaper than a Lua number (which Redis 7.0 converts with `%.17g`) or `%.0f`; a
-- decimal argument is turned into a number by arithmetic (`ARGV[2] + 0`, the same conversion as
-- `tonumber`, without a function call) where the contract says it is one.
local now_us, now_ms
do
  local now = redis.call('TIME')
  now_us = now[1] * 1000000 + now[2]
  now_ms = math.floor(now_us / 1000)
end
local grace
--@key
grace = ARGV[#ARGV]
if grace == '' then grace = nil else grace = grace + 0 end

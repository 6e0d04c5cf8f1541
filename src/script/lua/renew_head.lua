-- The head every watchdog renew script shares (renew, fair_renew, fair_renew_place, rw_renew:
-- inserted after the script's `#!lua` line, in place of the lock prologue, since these scripts
-- loop over ARGV triples of many keys): `now_ms` is `TIME` in milliseconds, read once per call;
-- `grace` the expiry grace, the last ARGV (nil: keep keys for good); `codes` the reply, one
-- code per triple, which the script fills.
local now = redis.call('TIME')
local now_ms = math.floor((tonumber(now[1]) * 1000000 + tonumber(now[2])) / 1000)
local grace = tonumber(ARGV[#ARGV])
local codes = {}

-- The read-write lock's state read with one `HGETALL` (in place of rw_prologue.lua, for a script
-- that reads every field anyway: rw_write, which looks at every reader). It defines what
-- rw_prologue.lua defines (`reader_field` too), from the same fields (`rw[1..10]`: `w`, `wu`, `i`, `iu`,
-- `r:<ARGV[1]>`, `c:<ARGV[1]>`, `forced`, `rs`, `fence`, `waiters`, nil when absent), and `all`,
-- the hash as `HGETALL` returned it (field, value, ...). One call instead of `HMGET` + `HGETALL`.
--@key
local reader_field = 'r:' .. ARGV[1]
local all = redis.call('HGETALL', KEYS[1])
local rw = {}
do
  local count = 'c:' .. ARGV[1]
  for n = 1, #all, 2 do
    local f = all[n]
    if f == 'w' then rw[1] = all[n + 1]
    elseif f == 'wu' then rw[2] = all[n + 1]
    elseif f == 'i' then rw[3] = all[n + 1]
    elseif f == 'iu' then rw[4] = all[n + 1]
    elseif f == reader_field then rw[5] = all[n + 1]
    elseif f == count then rw[6] = all[n + 1]
    elseif f == 'forced' then rw[7] = all[n + 1]
    elseif f == 'rs' then rw[8] = all[n + 1]
    elseif f == 'fence' then rw[9] = all[n + 1]
    elseif f == 'waiters' then rw[10] = all[n + 1] end
  end
end
local writer, writer_until, intent, intent_until = rw[1], tonumber(rw[2]), rw[3], tonumber(rw[4])
local writer_live = writer and writer_until and writer_until > now_ms
local intent_live = intent and intent_until and intent_until > now_ms
local holds = tonumber(rw[6])
local last_fence, waiters = rw[9], rw[10]

-- The read-write lock's state (after own_prologue.lua's code and the snippets before it): its
-- hash `fencelock:{NAME}:rw` holds `fence` (the one counter), the writer `w` (owner) and `wu`
-- (lease end ms), one field `r:<owner>` = `<lease end ms>:<fence>` per reader, the first
-- waiting writer's intent `i` (its wait id) and `iu` (intent lease end ms), and for an owner
-- with re-entered holds `c:<owner>` (hold count) and `h:<owner>:<id>` per hold (`<id>` empty for
-- the first), and `rs` (ms) while a read was refused at `MAX_READERS` live readers: the first of
-- them ends then, so until then (or until a reader entry goes) no read needs to count them again;
-- while a refused attempt waits for a release, `waiters` = 1; after a forced unlock that freed
-- live holds `forced` = the freed owners' tokens, space separated (see rw_force_unlock.lua; not a
-- hold: `settle` does not count it).
--
-- One `HMGET` per key reads what the scripts need (`rw`): `w`, `wu`, `i`, `iu`, then
-- `r:<ARGV[1]>`, `c:<ARGV[1]>` (ARGV[1] is the owner token in every script but rw_withdraw and
-- rw_force_unlock, which do not use them), `forced`, `rs`, `fence` and `waiters`: nothing else
-- is read before a script's own work (no lock prologue's `HMGET`). `writer`, `writer_until`,
-- `intent`, `intent_until` (numbers), `writer_live`, `intent_live`; `holds` the owner's hold
-- count (nil for one hold); `last_fence` the stored `fence` (a string, nil for none), `waiters`
-- the `waiters` field as read; `reader_field` is `r:<ARGV[1]>`. The fields that are no hold
-- (`i`, `iu`, `forced`, `rs`, `fence`, `waiters`: `rw[3]`, `rw[4]`, `rw[7]` to `rw[10]`) are
-- kept in step with the hash by a script that deletes or writes one (false once deleted):
-- `settle` (rw_entry.lua) counts them. It defines no function (see own_prologue.lua): the
-- helpers are in rw_forget.lua, rw_raise.lua, rw_lease.lua and rw_entry.lua, and each script
-- takes those it calls. Numbers go to commands formatted with `%d`.
--@key
local reader_field = 'r:' .. ARGV[1]
local rw = redis.call('HMGET', KEYS[1], 'w', 'wu', 'i', 'iu', reader_field, 'c:' .. ARGV[1],
  'forced', 'rs', 'fence', 'waiters')
local writer, writer_until, intent, intent_until = rw[1], tonumber(rw[2]), rw[3], tonumber(rw[4])
local writer_live = writer and writer_until and writer_until > now_ms
local intent_live = intent and intent_until and intent_until > now_ms
local holds = tonumber(rw[6])
local last_fence, waiters = rw[9], rw[10]

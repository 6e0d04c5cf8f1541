-- inspect: read the state of one key of any primitive kind (own prologue and the inspection
-- snippet first). Writes nothing (`no-writes`), so it may run on any node that has the key.
--
-- KEYS[1] the key. ARGV[1] its kind (`lock`, `rw`, `fair`, `sem`, `latch`), ARGV[2] expiry
-- grace (unused; every lock script's last ARGV).
--
-- Replies: the inspection array of `inspect.lua`.
#!lua flags=no-writes
return inspect(ARGV[1])

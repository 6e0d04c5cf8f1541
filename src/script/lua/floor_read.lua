-- floor_read: the start of the fence rule in the scripts that read the floor key (`acquire_floor`,
-- `lock_all_floor` and `handoff_floor`, inserted at fence.lua's `--@floor` line), which the client
-- sends in place of `acquire`, `lock_all` and `handoff` to a standalone server that may load
-- fencelock's Redis module. Such a module, loaded with `release-deletes yes`, deletes the key of a
-- lock its release frees and keeps the lock's fence in one floor key per key prefix,
-- `<prefix>:{floor}:floor` (the text of KEYS[1] before its first `{`, then `{floor}:floor`;
-- module/src/floor.rs); the module's grants read it, and so do these scripts: a lock without a
-- fence yet (`stored` 0: no key) in a clock mode (an expiry `grace` given) takes the floor as its
-- last fence. A floor key that is missing, not a string or not a decimal number of at most 19
-- digits counts as 0 (as the module reads it, `parse_u64`). Read once per script call
-- (`memo.floor`: a batch's or a multi-lock's keys share their client's prefix), with `redis.pcall`,
-- so a key of another type is no error. The floor key is not among the script's KEYS: on a
-- standalone server only (the client sends these scripts to no cluster).
if stored == 0 and grace then
  local high = memo.floor
  if not high then
    high = 0
    local open = string.find(KEYS[1], '{', 1, true)
    if open then
      local got = redis.pcall('GET', string.sub(KEYS[1], 1, open - 1) .. '{floor}:floor')
      if type(got) == 'string' and #got <= 19 and string.match(got, '^%d+$') then high = got + 0 end
    end
    memo.floor = high
  end
  if high > 0 then
    stored = high
    fence = high + 1
  end
end

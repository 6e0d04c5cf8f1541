-- The fence rule every granting script shares (inserted after the prologue's once-per-call part,
-- which defines `now_us`): `next_fence(stored, floor, mode, count, key)` is the next fence above
-- `stored`, the last fence granted (0 for none) in `key`; `count` (default 1) fences are taken
-- from it at once (a semaphore's many permits: `fence` .. `fence + count - 1`), all of which must
-- stay below 2^53.
--
-- In modes `epoch` and `hybrid` a grant with no stored fence first makes sure this node is not
-- importing the key's slot (a migration's `ASK` window): there a lock whose key expired on the
-- source would get this node's config epoch, which Redis raises only when the migration ends, and
-- when it is below the source's the fence would fall below the source's grants. A call with two
-- keys of the slot, one of them a name never written (`key .. ':~'`), is refused inside a script
-- in a slot that migrates (the importer answers that it cannot serve it, as it would answer
-- `TRYAGAIN`); on a node that owns the slot it is one `EXISTS`. The grant is then refused with
-- `TRYAGAIN` (a waiting acquire tries again until the migration ends or its timeout; a one-shot
-- call such as a latch's `set` returns it; docs/safety.md). Any other refusal of that call (an
-- ACL user without `exists`) is the grant's error reply as it is.
--
-- The fence is max(stored + 1, floor + 1, TIME µs + 1 in mode `clock`, cluster_my_epoch ×
-- 2^32 + 1 in mode `epoch` (cluster only), TIME µs + cluster_my_epoch × 2^34 + 1 in mode
-- `hybrid` (cluster only: the epoch term lifts every failover's tokens ≈ 4.8 h of µs above the
-- old master's, the clock term survives a restart without data)); mode `counter` is a plain
-- counter. In modes `clock` and `hybrid` it sets `memo.shift` (0, or epoch × 2^34): what to take
-- off a fence to read it as server µs, for the key's expiry (`keep`). Returns
-- `fence, behind` (behind: µs the stored fence was ahead of the clock term, else 0),
-- or `nil, error reply` (the caller returns it, before any write) when the fence would pass
-- 2^53 - 1 or the epoch cannot be read. The epoch is read once per call and kept in `memo`
-- (one table per script call: a batch of many keys pays for one `CLUSTER INFO`). All of it
-- runs once per script call (it ends with the `--@key` line, see prologue.lua).
--
-- The lines between the two `--@fence` lines are the rule itself, written without a `return`:
-- the mutex's acquire inlines them at its own `--@fence` line (`assemble::inline_fence`), where
-- `stored`, `floor`, `mode`, `count`, `fence` (= stored + 1) and `behind` (= 0) are locals, so
-- its grant creates no function; on failure they leave `fence` nil and `behind` the error.
-- The `--@floor` line is where the scripts that read the module's floor key (`acquire_floor`,
-- `lock_all_floor`, `handoff_floor`) insert floor_read.lua; in the others it is a comment.
local function next_fence(stored, floor, mode, count, key)
  local fence, behind = stored + 1, 0
--@fence
--@floor
  floor = tonumber(floor) or 0
  if mode == 'clock' then
    memo.shift = 0
    if now_us > floor then floor = now_us end
    if stored > now_us then behind = stored - now_us end
  elseif mode == 'epoch' or mode == 'hybrid' then
    local epoch = memo.epoch
    if not epoch then
      local ok, info = pcall(redis.call, 'CLUSTER', 'INFO')
      epoch = ok and tonumber(string.match(info, 'cluster_my_epoch:(%d+)'))
      memo.epoch = epoch
    end
    local refused = stored == 0 and epoch and redis.pcall('EXISTS', key, key .. ':~')
    if type(refused) == 'table' and not (string.find(refused.err, 'non local key', 1, true)
        or string.find(refused.err, 'rehashing', 1, true)) then
      fence, behind = nil, refused
    elseif type(refused) == 'table' then
      fence, behind = nil, redis.error_reply('TRYAGAIN fencelock: the slot of ' .. key .. ' is migrating and its last fence may be on the other node: try again when the migration ends')
    elseif not epoch then
      fence, behind = nil, redis.error_reply('ERR fencelock: epoch fence mode cannot read cluster_my_epoch from CLUSTER INFO')
    elseif mode == 'epoch' then
      if epoch >= 2097152 then
        fence, behind = nil, redis.error_reply('ERR fencelock: config epoch ' .. epoch .. ' leaves no room below 2^53 for epoch fences')
      elseif epoch * 4294967296 > floor then
        floor = epoch * 4294967296
      end
    else
      memo.shift = epoch * 17179869184
      local clock = now_us + memo.shift
      if clock > floor then floor = clock end
      if stored > clock then behind = stored - clock end
    end
  end
  if fence then
    if fence <= floor then fence = floor + 1 end
    if fence > 9007199254740991 - ((count or 1) - 1) then
      fence, behind = nil, redis.error_reply('ERR fencelock: the next fence would pass 2^53 - 1 (stored ' .. string.format('%d', stored) .. '): lower the floor')
    end
  end
--@fence
  return fence, behind
end
--@key

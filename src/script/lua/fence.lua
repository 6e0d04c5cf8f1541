-- The fence snippet every granting script shares (inserted after the prologue):
-- `next_fence(stored, floor, mode)` is the next fence token of a lock whose stored fence is
-- `stored`: max(stored + 1, floor + 1, TIME µs + 1 when mode is `clock`, cluster_my_epoch ×
-- 2^32 + 1 when mode is `epoch`). Returns `fence, behind` (behind: µs the stored fence was
-- ahead of the clock in clock mode, else 0), or `nil, error reply` when the epoch cannot be
-- read or the fence would pass 2^53 - 1. It reads only; the caller writes.
local function next_fence(stored, floor_arg, mode)
  local fence = stored + 1
  local floor = tonumber(floor_arg)
  local behind = 0
  if mode == 'clock' then
    if now_us > floor then floor = now_us end
    if stored > now_us then behind = stored - now_us end
  elseif mode == 'epoch' then
    local ok, info = pcall(redis.call, 'CLUSTER', 'INFO')
    local epoch = ok and tonumber(string.match(info, 'cluster_my_epoch:(%d+)'))
    if not epoch then
      return nil, redis.error_reply('ERR fencelock: epoch fence mode cannot read cluster_my_epoch from CLUSTER INFO')
    end
    if epoch >= 2097152 then
      return nil, redis.error_reply('ERR fencelock: config epoch ' .. epoch .. ' leaves no room below 2^53 for epoch fences')
    end
    if epoch * 4294967296 > floor then floor = epoch * 4294967296 end
  end
  if fence <= floor then fence = floor + 1 end
  if fence > 9007199254740991 then
    return nil, redis.error_reply('ERR fencelock: the next fence would pass 2^53 - 1 (stored ' .. string.format('%.0f', stored) .. '): lower the floor')
  end
  return fence, behind
end

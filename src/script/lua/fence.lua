-- The fence rule every granting script shares (inserted after the prologue).
--
-- `next_fence(stored, floor, mode, count)` returns the first of `count` consecutive fences
-- above `stored` (the instance's `fence` field, 0 when absent) and `floor` (decimal), raised in
-- `clock` mode to the server's TIME in µs and in `epoch` mode to cluster_my_epoch × 2^32, and
-- `behind` (µs the stored fence was ahead of the clock in clock mode, else 0). On failure it
-- returns nil and the error message (no write was made): the epoch cannot be read, or the last
-- fence would pass 2^53 - 1.
local function next_fence(stored, floor, mode, count)
  local fence = stored + 1
  floor = tonumber(floor) or 0
  local behind = 0
  if mode == 'clock' then
    if now_us > floor then floor = now_us end
    if stored > now_us then behind = stored - now_us end
  elseif mode == 'epoch' then
    local ok, info = pcall(redis.call, 'CLUSTER', 'INFO')
    local epoch = ok and tonumber(string.match(info, 'cluster_my_epoch:(%d+)'))
    if not epoch then
      return nil, 'ERR fencelock: epoch fence mode cannot read cluster_my_epoch from CLUSTER INFO'
    end
    if epoch >= 2097152 then
      return nil, 'ERR fencelock: config epoch ' .. epoch .. ' leaves no room below 2^53 for epoch fences'
    end
    if epoch * 4294967296 > floor then floor = epoch * 4294967296 end
  end
  if fence <= floor then fence = floor + 1 end
  if fence > 9007199254740991 - ((count or 1) - 1) then
    return nil, 'ERR fencelock: the next fence would pass 2^53 - 1 (stored ' .. string.format('%.0f', stored) .. '): lower the floor'
  end
  return fence, behind
end

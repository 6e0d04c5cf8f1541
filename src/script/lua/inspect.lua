-- The inspection snippet (inserted after the lock prologue, and after a primitive's own
-- snippets in the force-unlock scripts): `inspect(kind)` reads one key of any primitive kind
-- and writes nothing. `kind` is the key's last part: `lock` (mutex), `rw`, `fair`, `sem`,
-- `latch`.
--
-- Returns {exists, held, fence, lease ms, holds, waiters, a, b, c}: exists 1 when the key
-- exists; held 1 when a live hold exists (latch: armed with a count above zero); fence the
-- last fence granted (latch: its fence field), 0 for none; lease ms the longest live lease
-- left, -1 for none; holds the live holds (re-entered holds counted; semaphore: live
-- permits); waiters the waiters the key records, -1 for none recorded: fair places, the mutex's
-- live queue places (-1 when it has none), the rw writer intent (0 or 1), the semaphore
-- reservation (0 or 1), always -1 for a latch.
-- a, b, c by kind (-1 otherwise): rw: live readers, live writers (0 or 1); sem: stored limit
-- (0 for none), permits in use; latch: remaining count, current generation, opened generation
-- (0 for none).
local function inspect(kind)
  local flat = redis.call('HGETALL', KEYS[1])
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  if kind == 'lock' or kind == 'fair' then
    -- Key layout 2 (prologue.lua): the state packed in `until`; a layout-1 key as it was.
    local ends, fence, holder, marks = string.match(h['until'] or '', '^(%d+) (%d+) (%S*)(.*)$')
    if ends then
      h['until'], h['fence'], h['owner'] = ends, fence, holder ~= '' and holder or nil
      h['holds'] = string.match(marks, ' h(%d+)')
    end
  end
  local r = {#flat > 0 and 1 or 0, 0, tonumber(h['fence']) or 0, -1, 0, -1, -1, -1, -1}
  local function lease(ends)
    -- A lease end is whole milliseconds that fit Redis's expiry clock (a TTL of up to
    -- MAX_TTL, half of it, puts it past 2^53): anything else (`inf`, `1e300`, written by
    -- another program) is no live lease.
    if ends and ends > now_ms and ends < 9e18 and ends == math.floor(ends) then
      r[2] = 1
      if ends - now_ms > r[4] then r[4] = ends - now_ms end
      return true
    end
    return false
  end
  if kind == 'lock' or kind == 'fair' then
    if h['owner'] and lease(tonumber(h['until'])) then r[5] = tonumber(h['holds']) or 1 end
    -- Live queue places: the fair lock's, and the mutex's of waiting processes (acquire.lua),
    -- reported for a mutex only when there are some.
    local places = 0
    for field, value in pairs(h) do
      if string.sub(field, 1, 2) == 'q:' then
        local ends = tonumber(string.match(value, '^%d+ (%d+)$'))
        if ends and ends > now_ms then places = places + 1 end
      end
    end
    if kind == 'fair' or places > 0 then r[6] = places end
  elseif kind == 'rw' then
    r[6], r[7], r[8] = 0, 0, 0
    if h['w'] and lease(tonumber(h['wu'])) then
      r[8] = 1
      r[5] = r[5] + (tonumber(h['c:' .. h['w']]) or 1)
    end
    for field, value in pairs(h) do
      if string.sub(field, 1, 2) == 'r:' and lease(tonumber(string.match(value, '^(%d+)'))) then
        r[7] = r[7] + 1
        r[5] = r[5] + (tonumber(h['c:' .. string.sub(field, 3)]) or 1)
      end
    end
    local iu = tonumber(h['iu'])
    if h['i'] and iu and iu > now_ms then r[6] = 1 end
  elseif kind == 'sem' then
    r[6], r[7], r[8] = 0, tonumber(h['limit']) or 0, 0
    for field, value in pairs(h) do
      if string.match(field, '^p:%d+$') and lease(tonumber(string.match(value, '^%S+ (%d+) '))) then
        r[8] = r[8] + 1
      end
    end
    r[5] = r[8]
    local res = tonumber(string.match(h['r'] or '', '^%S+ %d+ (%d+)$'))
    if res and res > now_ms then r[6] = 1 end
  elseif kind == 'latch' then
    r[7], r[8], r[9] = tonumber(h['count']) or 0, tonumber(h['gen']) or 0, tonumber(h['opened']) or 0
    if r[8] > 0 and r[7] > 0 then r[2] = 1 end
  end
  return r
end

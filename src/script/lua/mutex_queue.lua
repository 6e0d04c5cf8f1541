-- The mutex's queue (inlined with fence.lua, raise.lua and fair.lua at the `--@queue` line of
-- the mutex's scripts, inside the block that meets a queue). The places are the fair lock's
-- (`q:<owner>` = "<seq> <place lease end ms>", `g:<owner>` its grant arguments, `qseq`), plus
-- an arrival index, so that the head is found without reading the whole queue: `s:<seq>` =
-- the owner that arrived as seq, and `qh`, the lowest seq that may still be queued.
--
-- `head(me, args, key)` reads `key`'s (KEYS[1] when nil) `qh`, `qseq` and, when `me` is given,
-- `me`'s place in one call, then
-- walks the index from `qh` up to `qseq`: the first entry whose place is there with the same seq
-- and a lease that has not ended is the head; index entries of places that are gone (granted,
-- withdrawn) are deleted on the way, and so are places whose lease ended. At most 64 entries a
-- call (the call's work stays bounded; the queued waiters re-check within 250 ms and their
-- acquires go on from where it stopped). With `args` the head's grant arguments are read with
-- its place (one call, for `handed`). Returns the head as {head, head_end, seq, args} or nil,
-- whether entries remain at or after the head (or after the 64), `qseq`, the seq the walk
-- stopped at (the head's, or the first not walked), and `me`'s place as read (nil when it has
-- none, or the walk deleted it).
-- `hand_head(how, stored, q, pending, last)`: the release's handoff, on a lock just freed (the
-- state's holds cleared; it writes the state itself, holding only the fence `stored` unless a
-- head is granted): the head (`q`, `pending` and `last` from a `head()` of this call, or read
-- here when `q` is nil) is granted the lock on the server and told so on its client's channel
-- (`handed`, fair.lua), its index entry goes and `qh` moves past it, and the key's expiry is
-- raised to cover the grant (never shortened: other places' leases need it); a stale head is
-- only woken. The state's waiters mark is `q` while entries remain, or, with no head found,
-- while the hash holds more fields than the queue's bookkeeping (places an older client took
-- without an index entry: they find the lock at their next look, by their own scripts).
-- True when a head was found.
-- `take(q, pending, last, me, fence, ttl)`: an acquire's grant of the free lock to its caller
-- `me`, the head `q` of a `head()` taken by this call (or, with no live place found, whoever
-- asks): `me`'s place, grant arguments and index entry go (a place of `me` the walk did not
-- reach, past its 64 entries, goes too: it must not be handed the lock later), `qh` moves past
-- the head, the state holds `me` with a lease of `ttl` ms and `fence`, marked `q` while entries
-- remain, and the key's expiry covers the grant (raised only while places remain).
-- `hold_place(me, seq, new, ends, latest)`: an acquire's busy caller `me` keeps its place:
-- arrival `seq` (a decimal string; a `new` one is `qseq` + 1, as read by this call), lease end
-- `ends`, and its grant arguments from the acquire's ARGV (TTL, place lease, floor, mode:
-- ARGV[2], [5], [3], [4], as both acquires take them), with its index entry and `qseq` when the
-- place is `new`, in one write; the state is marked `q`, and the key's expiry raised to cover
-- the place and `latest`.
local function head(me, args, key)
  key = key or KEYS[1]
  local at
  if me then
    at = redis.call('HMGET', key, 'qh', 'qseq', 'q:' .. me)
  else
    at = redis.call('HMGET', key, 'qh', 'qseq')
  end
  local h, last, mine = tonumber(at[1]) or 1, tonumber(at[2]) or 0, at[3] or nil
  local start, dead, found = h, {}, nil
  while h <= last and h < start + 64 do
    local who = redis.call('HGET', key, 's:' .. h)
    if who then
      local place, grant
      if args then
        local both = redis.call('HMGET', key, 'q:' .. who, 'g:' .. who)
        place, grant = both[1], both[2]
      else
        place = redis.call('HGET', key, 'q:' .. who)
      end
      local seq, ends
      if place then seq, ends = string.match(place, '^(%d+) (%d+)$') end
      seq, ends = tonumber(seq), tonumber(ends)
      if seq == h and ends and ends > now_ms then
        found = {head = who, head_end = ends, seq = h, args = grant}
        break
      end
      dead[#dead + 1] = 's:' .. h
      if seq == h then
        dead[#dead + 1] = 'q:' .. who
        dead[#dead + 1] = 'g:' .. who
        if who == me then mine = nil end
      end
    end
    h = h + 1
  end
  if #dead > 0 then redis.call('HDEL', key, unpack(dead)) end
  if h ~= start then redis.call('HSET', key, 'qh', h) end
  return found, h <= last, last, h, mine
end
local function hand_head(how, stored, q, pending, last)
  if q == nil then q, pending, last = head(nil, true) end
  if not q then
    -- More than `until`, `qseq` and `qh` left: places the index does not list may wait (an older
    -- client's, without an `s:` entry), so the lock stays marked queued for their next look.
    if pending or redis.call('HLEN', KEYS[1]) > 3 then
      store(KEYS[1], {nil, nil, stored, nil, 'q'})
    else
      store(KEYS[1], {nil, nil, stored})
    end
    return false
  end
  local ends, fence = handed(q, how, stored, q.seq < last and 'q' or nil, q.seq)
  if ends then
    raise(fence, ends)
  else
    store(KEYS[1], {nil, nil, stored, nil, 'q'})
  end
  return true
end
local function take(q, pending, last, me, fence, ttl)
  local ends = now_ms + ttl
  local granted = {me, ends, fence}
  if (q and q.seq < last) or (not q and pending) then granted[5] = 'q' end
  if q then
    redis.call('HDEL', KEYS[1], 'q:' .. me, 'g:' .. me, 's:' .. q.seq)
    store(KEYS[1], granted, 'qh', string.format('%d', q.seq + 1))
  else
    redis.call('HDEL', KEYS[1], 'q:' .. me, 'g:' .. me)
    store(KEYS[1], granted)
  end
  if granted[5] then raise(fence, ends) else keep(KEYS[1], fence, ends) end
end
local function hold_place(me, seq, new, ends, latest)
  local value = seq .. ' ' .. string.format('%d', ends)
  local args = ARGV[2] .. ' ' .. ARGV[5] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
  if new then
    redis.call('HSET', KEYS[1], 'q:' .. me, value, 'g:' .. me, args, 's:' .. seq, me, 'qseq', seq)
  else
    redis.call('HSET', KEYS[1], 'q:' .. me, value, 'g:' .. me, args)
  end
  if lock[5] ~= 'q' then
    lock[5] = 'q'
    store(KEYS[1], lock)
  end
  if ends > latest then latest = ends end
  raise(lock[3], latest)
end

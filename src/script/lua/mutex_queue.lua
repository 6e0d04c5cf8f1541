-- The mutex's queue (inlined with fence.lua, raise.lua and fair.lua at the `--@queue` line of
-- the mutex's scripts, inside the block that meets a queue). The places are the fair lock's
-- (`q:<owner>` = "<seq> <place lease end ms>", `g:<owner>` its grant arguments, `qseq`), plus
-- an arrival index, so that the head is found without reading the whole queue: `s:<seq>` =
-- the owner that arrived as seq, and `qh`, the lowest seq that may still be queued.
--
-- `head()` walks the index from `qh` up to `qseq`: the first entry whose place is there with the
-- same seq and a lease that has not ended is the head; index entries of places that are gone
-- (granted, withdrawn) are deleted on the way, and so are places whose lease ended. At most 64
-- entries a call (the call's work stays bounded; the queued waiters re-check within 250 ms and
-- their acquires go on from where it stopped). Returns the head as {head, head_end, seq} or
-- nil, whether entries remain at or after the head (or after the 64), `qseq`, and the seq the
-- walk stopped at (the head's, or the first not walked).
-- `hand_head(how, stored)`: the release's handoff, on a lock just freed (its state holds only
-- the fence `stored`): the head is granted the lock on the server and told so on its client's
-- channel (`handed`, fair.lua), its index entry goes and `qh` moves past it, and the key's
-- expiry is raised to cover the grant (never shortened: other places' leases need it); a stale
-- head is only woken. The state's waiters mark is `q` while entries remain, or, with no head
-- found, while the hash holds more fields than the queue's bookkeeping (places an older client
-- took without an index entry: they find the lock at their next look, by their own scripts).
-- True when a head was found.
-- `take(q, pending, last, me, fence, ttl)`: an acquire's grant of the free lock to its caller
-- `me`, the head `q` of a `head()` taken by this call (or, with no live place found, whoever
-- asks): `me`'s place, grant arguments and index entry go (a place of `me` the walk did not
-- reach, past its 64 entries, goes too: it must not be handed the lock later), `qh` moves past
-- the head, the state holds `me` with a lease of `ttl` ms and `fence`, marked `q` while entries
-- remain, and the key's expiry covers the grant (raised only while places remain).
-- `hold_place(me, seq, new, ends, latest)`: an acquire's busy caller `me` keeps its place:
-- arrival `seq` (a decimal string), lease end `ends`, and its grant arguments from the
-- acquire's ARGV (TTL, place lease, floor, mode: ARGV[2], [5], [3], [4], as both acquires take
-- them), with its index entry when the place is `new`, in one write; the state is marked `q`,
-- and the key's expiry raised to cover the place and `latest`.
local function head()
  local at = redis.call('HMGET', KEYS[1], 'qh', 'qseq')
  local h, last = tonumber(at[1]) or 1, tonumber(at[2]) or 0
  local start, dead, found = h, {}, nil
  while h <= last and h < start + 64 do
    local who = redis.call('HGET', KEYS[1], 's:' .. h)
    if who then
      local place = redis.call('HGET', KEYS[1], 'q:' .. who)
      local seq, ends
      if place then seq, ends = string.match(place, '^(%d+) (%d+)$') end
      seq, ends = tonumber(seq), tonumber(ends)
      if seq == h and ends and ends > now_ms then
        found = {head = who, head_end = ends, seq = h}
        break
      end
      dead[#dead + 1] = 's:' .. h
      if seq == h then
        dead[#dead + 1] = 'q:' .. who
        dead[#dead + 1] = 'g:' .. who
      end
    end
    h = h + 1
  end
  if #dead > 0 then redis.call('HDEL', KEYS[1], unpack(dead)) end
  if h ~= start then redis.call('HSET', KEYS[1], 'qh', h) end
  return found, h <= last, last, h
end
local function hand_head(how, stored)
  local q, pending, last = head()
  if not q then
    -- More than `until`, `qseq` and `qh` left: places the index does not list may wait (an older
    -- client's, without an `s:` entry), so the lock stays marked queued for their next look.
    if pending or redis.call('HLEN', KEYS[1]) > 3 then
      store(KEYS[1], {nil, nil, stored, nil, 'q'})
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
    redis.call('HSET', KEYS[1], 'q:' .. me, value, 'g:' .. me, args, 's:' .. seq, me)
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

-- The fair lock's queue snippet (inserted after the prologue and the fence snippet). The fair
-- lock is one hash: the mutex's state (`until`, prologue.lua), plus `qseq` (the arrival counter)
-- and one field `q:<owner>` = "<seq> <place lease end ms>" per waiting place, with the arrival
-- index of mutex_queue.lua (`s:<seq>`, `qh`). The hot paths (fair_acquire, fair_release, and
-- the mutex's acquire and release) find the head through that index (mutex_queue.lua's `head`
-- and `hand_head`, built on `handed` below); the rare ones (fair_withdraw, the forced unlocks,
-- inspect) read every place with `scan` and hand the lock on with `hand`.
--
-- `scan(me)` reads every place, deletes the dead ones (lease ended) and returns a table:
-- `head` (owner of the live place with the lowest seq, or nil), `head_end` (its lease end),
-- `latest` (the latest lease end of the live places other than `me`'s, 0 if none), `mine`
-- (`me`'s seq, or nil), `mine_end`, `ahead` (live places with a lower seq than `me`'s),
-- `count` (live places, `me`'s included).
-- `raise(fence, ends)` (raise.lua, inserted before this snippet) is the expiry a live place
-- needs, never shortened.
-- `wake(owner, how, message)` announces on the channel of `owner`'s client, `<key>:w:<client>`
-- (`<client>`: the owner token's first 8 characters; same hash tag), so a process that waits on
-- the lock again keeps one subscription: `s` SPUBLISH, `p` PUBLISH, anything else not at all;
-- the message is empty for a plain wake-up, else "<owner> " and `message`.
-- A waiting place may carry its grant arguments, `g:<owner>` = "<TTL ms> <place lease ms>
-- <floor> <fence mode>" (fair_acquire writes them with the place; deleted with it).
-- `hand(q, how, stored, latest)` grants the free lock to the head of `q` (a `scan` taken after
-- the lock was freed) on the server, the handoff of issue 25: when the head's place carries its
-- arguments and is fresh (its lease ends at least two thirds of its length from now: renewed
-- within the watchdog's last period, so its owner was alive a moment ago), the head's place
-- goes, the head becomes the owner with a lease of its TTL and the next fence above `stored`
-- (the fence rule, as fair_acquire; the state written with keep.lua's `store`, with the
-- waiters mark `mark` of `handed(q, how, stored, mark)` if one is given), and the grant is announced on the head's channel as
-- "<owner> <fence> <behind µs> <lease ms>": the waiter holds the lock on receipt. Otherwise (no head, a
-- stale place, an older client's place without arguments, a fence error) the head, if any, is
-- only woken and takes the lock with its own fair_acquire, as before. Either way it sets the
-- key's lifetime to cover `latest` (the latest lease end the key must outlive) and the grant:
-- `raise` after a grant (its fence counts), else `keep` with `stored`. It leaves the state's
-- waiters mark `q` (fair_acquire.lua) while live places remain: on the head's grant when others
-- are queued behind it, on the free lock when the head was only woken. True when it granted.
local function scan(me)
  local fields = redis.call('HGETALL', KEYS[1])
  local q = {latest = 0, ahead = 0}
  local dead, live_places = {}, {}
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, 1, 2) == 'q:' then
      local who = string.sub(field, 3)
      local seq, ends = string.match(fields[i + 1], '^(%d+) (%d+)$')
      seq, ends = tonumber(seq), tonumber(ends)
      if not ends or ends <= now_ms then
        dead[#dead + 1] = field
        dead[#dead + 1] = 'g:' .. who
      else
        live_places[#live_places + 1] = seq
        if who == me then
          q.mine, q.mine_end = seq, ends
        elseif ends > q.latest then
          q.latest = ends
        end
        if not q.head_seq or seq < q.head_seq then
          q.head, q.head_seq, q.head_end = who, seq, ends
        end
      end
    end
  end
  if #dead > 0 then redis.call('HDEL', KEYS[1], unpack(dead)) end
  q.count = #live_places
  if q.mine then
    for _, seq in ipairs(live_places) do
      if seq < q.mine then q.ahead = q.ahead + 1 end
    end
  end
  return q
end
local function wake(who, how, message)
  local channel = KEYS[1] .. ':w:' .. string.sub(who, 1, 8)
  if message then message = who .. ' ' .. message else message = '' end
  if how == 's' then redis.call('SPUBLISH', channel, message)
  elseif how == 'p' then redis.call('PUBLISH', channel, message) end
end
local function handed(q, how, stored, mark, seq)
  if not q.head then return nil end
  local head = q.head
  local args = q.args
  if args == nil then args = redis.call('HGET', KEYS[1], 'g:' .. head) end
  local ttl, place, floor, mode
  if args then ttl, place, floor, mode = string.match(args, '^(%d+) (%d+) (%d+) (%S+)$') end
  ttl, place = tonumber(ttl), tonumber(place)
  local fence, behind
  if ttl and ttl > 0 and place and place > 0 then
    if (q.head_end - now_ms) * 3 >= place * 2 then
      fence, behind = next_fence(tonumber(stored) or 0, floor, mode, nil, KEYS[1])
    end
  end
  if not fence then
    wake(head, how)
    return nil
  end
  local ends = now_ms + ttl
  if seq then
    -- The head came from the arrival index (mutex_queue.lua): its entry goes and `qh` moves past
    -- it in the same calls.
    redis.call('HDEL', KEYS[1], 'q:' .. head, 'g:' .. head, 's:' .. seq)
    store(KEYS[1], {head, ends, fence, nil, mark}, 'qh', string.format('%d', seq + 1))
  else
    redis.call('HDEL', KEYS[1], 'q:' .. head, 'g:' .. head)
    store(KEYS[1], {head, ends, fence, nil, mark})
  end
  wake(head, how, string.format('%d %d %d', fence, behind, ttl))
  return ends, fence
end
local function hand(q, how, stored, latest)
  local ends, fence = handed(q, how, stored, q.count > 1 and 'q' or nil)
  if not ends then
    if q.head then store(KEYS[1], {nil, nil, stored, nil, 'q'}) end
    keep(KEYS[1], stored, latest)
    return false
  end
  if ends > latest then latest = ends end
  raise(fence, latest)
  return true
end

-- The fair lock's queue snippet (inserted after the prologue and the fence snippet). The fair
-- lock is one hash: the mutex's `owner`, `until`, `fence`, plus `qseq` (the arrival counter)
-- and one field `q:<owner>` = "<seq> <place lease end ms>" per waiting place.
--
-- `scan(me)` reads every place, deletes the dead ones (lease ended) and returns a table:
-- `head` (owner of the live place with the lowest seq, or nil), `head_end` (its lease end),
-- `latest` (the latest lease end of the live places other than `me`'s, 0 if none), `mine`
-- (`me`'s seq, or nil), `mine_end`, `ahead` (live places with a lower seq than `me`'s),
-- `count` (live places, `me`'s included).
-- `raise(fence, ends)` (raise.lua, inserted before this snippet) is the expiry a live place
-- needs, never shortened.
-- `wake(owner, how)` announces on `owner`'s own channel, `<key>:w:<owner>` (same hash tag):
-- `s` SPUBLISH, `p` PUBLISH, anything else not at all.
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
local function wake(who, how)
  local channel = KEYS[1] .. ':w:' .. who
  if how == 's' then redis.call('SPUBLISH', channel, '')
  elseif how == 'p' then redis.call('PUBLISH', channel, '') end
end

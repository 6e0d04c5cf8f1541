-- A re-entered lock's hold fields removed, for the mutex scripts that inline keep.lua's `clear`
-- on their common path instead of defining it (inserted at their `--@clear` line, inside the
-- branch where `lock[4]` is set): the `h:<id>` hold fields go; the caller writes the state
-- (prologue.lua), and `forced` and a queue's places stay (as keep.lua's `clear`).
do
  local gone = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
  end
  if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end
end

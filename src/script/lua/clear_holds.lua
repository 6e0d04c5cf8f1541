-- A re-entered lock's hold removed, for the mutex scripts that inline keep.lua's `clear` on
-- their common path instead of defining it (inserted at their `--@clear` line, inside the branch
-- where `lock[4]` is set): `owner`, `until`, `waiters`, `holds` and the `h:<id>` hold fields go;
-- `fence`, `forced` and a queue's places stay (as keep.lua's `clear`).
do
  local gone = {'owner', 'until', 'waiters', 'holds'}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
  end
  redis.call('HDEL', KEYS[1], unpack(gone))
end

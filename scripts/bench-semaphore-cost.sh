#!/usr/bin/env bash
# Issue 21: what the semaphore's scripts cost the server, this work tree against an earlier
# commit (default d3040d1, before the bounded-work change). Assembles each version's
# semaphore_acquire, _release and _extend from src/script/lua/ as the library does (prologue,
# fence rule, semaphore state, script; headers dropped), starts one redis-server on PORT
# (default 7931), sends each workload with `redis-cli` pipelined, and prints the server's
# `usec_per_call` of EVALSHA (INFO commandstats; wall time inside the server, so a loaded
# machine inflates both versions alike). Stops the server by pid on exit.
#   PORT=7931 BASE=d3040d1 CALLS=2000 scripts/bench-semaphore-cost.sh
# Results: docs/benchmarks.md, "Semaphore: what a call costs the server".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
port=${PORT:-7931}
base=${BASE:-d3040d1}
n=${CALLS:-2000}
dir=$(mktemp -d)
pid=

stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -rf "$dir"
}
trap stop EXIT

# Prints script $2 of revision $1 (`work`: the work tree) as the library sends it.
assemble() {
  python3 - "$1" "$2" <<'PY'
import subprocess, sys
rev, name = sys.argv[1], sys.argv[2]
def get(path):
    if rev == 'work':
        return open(path).read()
    return subprocess.check_output(['git', 'show', rev + ':' + path]).decode()
def without_header(text):
    while text.startswith('--') and not text.startswith('--@'):
        text = text.split('\n', 1)[1] if '\n' in text else ''
    return text
key_marker = '--@key\n'
shebang, body = without_header(get('src/script/lua/%s.lua' % name)).split('\n', 1)
call = key = ''
for part in ['prologue', 'fence', 'semaphore']:
    text = without_header(get('src/script/lua/%s.lua' % part))
    at = 0 if text.startswith(key_marker) else text.find('\n' + key_marker) + 1
    if at > 0 or text.startswith(key_marker):
        call += text[:at]
        key += text[at + len(key_marker):]
    else:
        key += text
sys.stdout.write((shebang + '\nlocal memo = {}\n' + call + key + body).rstrip('\n'))
PY
}

redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >"$dir/redis.log" 2>&1 &
pid=$!
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done
per_call() { cli info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'; }

for rev in "$base" work; do
  cli flushall >/dev/null
  cli script flush >/dev/null
  acquire=$(cli script load "$(assemble "$rev" semaphore_acquire)")
  release=$(cli script load "$(assemble "$rev" semaphore_release)")
  extend=$(cli script load "$(assemble "$rev" semaphore_extend)")
  # The extend's holder argument: the owner token, plus its permit numbers since the change.
  holder="h5 5"
  if [ "$rev" != work ] && ! git show "$rev:src/script/lua/semaphore.lua" | grep -q sem_mine; then
    holder="h5"
  fi

  # 64 holders of one permit each (numbers 0..63) of a semaphore of 128, for good.
  for i in $(seq 0 63); do
    echo "EVALSHA $acquire 1 s{a} h$i 1 128 600000 0 clock \"\" 10000"
  done | cli >/dev/null
  cli config resetstat >/dev/null
  for i in $(seq 1 "$n"); do
    echo "EVALSHA $acquire 1 s{a} o$i 1 128 600000 0 clock \"\" 10000"
    echo "EVALSHA $release 1 s{a} o$i 64 p 10000"
  done | cli >/dev/null
  pairs=$(per_call)
  cli config resetstat >/dev/null
  for _ in $(seq 1 "$n"); do
    echo "EVALSHA $extend 1 s{a} \"$holder\" 600000 10000"
  done | cli >/dev/null
  extends=$(per_call)

  # All 128 permits taken by their own owners and released, then single acquire + release.
  for i in $(seq 0 127); do
    echo "EVALSHA $acquire 1 s{b} b$i 1 128 600000 0 clock \"\" 10000"
  done | cli >/dev/null
  for i in $(seq 0 127); do echo "EVALSHA $release 1 s{b} b$i $i p 10000"; done | cli >/dev/null
  cli config resetstat >/dev/null
  for i in $(seq 1 "$n"); do
    echo "EVALSHA $acquire 1 s{b} o$i 1 128 600000 0 clock \"\" 10000"
    echo "EVALSHA $release 1 s{b} o$i 0 p 10000"
  done | cli >/dev/null
  burst=$(per_call)
  echo "$rev: acquire/release with 64 holders ${pairs} µs/call; extend among 64 holders ${extends} µs/call; acquire/release after 128 released ${burst} µs/call (fields left: $(cli hlen 's{b}'))"
done

#!/usr/bin/env bash
# Memory per lock key (docs/design.md, "Key lifetime and memory"): runs the acquire script
# through redis-benchmark on random names against a standalone server and a cluster-enabled
# server that owns every slot, and prints used_memory per key while held and after release
# (the release script's HDEL of owner and until, applied to every key).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
port=${PORT:-7450}
cargo build --quiet --release --bin fencelock
acquire=$(target/release/fencelock script acquire)
dir=$(mktemp -d)
pid=""
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  pid=""
}
trap 'stop; rm -rf "$dir"' EXIT
measure() { # $1 label, rest: extra redis-server args
  local label=$1; shift
  rm -rf "$dir"/*
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@"
  wait_for_server "$port" "$dir/redis.log"
  pid=$(cat "$dir/redis.pid")
  if [ "$*" != "" ]; then
    redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
    wait_for_cluster_ok "$port" "$dir/redis.log"
  fi
  local sha before keys held released
  sha=$(redis-cli -p "$port" script load "$acquire")
  before=$(redis-cli -p "$port" info memory | grep '^used_memory:' | cut -d: -f2 | tr -d '\r')
  redis-benchmark -p "$port" -c 20 -n 100000 -r 100000000 -q \
    EVALSHA "$sha" 1 "fencelock:{order:__rand_int__}:lock" 0123456789abcdef0123456789abcdef 600000 0 clock 10000 >/dev/null
  keys=$(redis-cli -p "$port" dbsize)
  held=$(redis-cli -p "$port" info memory | grep '^used_memory:' | cut -d: -f2 | tr -d '\r')
  redis-cli -p "$port" eval "for _, k in ipairs(redis.call('KEYS', 'fencelock:*')) do redis.call('HDEL', k, 'owner', 'until') end" 0 >/dev/null
  released=$(redis-cli -p "$port" info memory | grep '^used_memory:' | cut -d: -f2 | tr -d '\r')
  local one
  one=$(redis-cli -p "$port" randomkey)
  echo "$label: $keys keys; held $(( (held - before) / keys )) B/lock, released $(( (released - before) / keys )) B/lock (MEMORY USAGE of one released key: $(redis-cli -p "$port" memory usage "$one") B)"
  stop
}
echo "redis $(redis-server --version | grep -o 'v=[0-9.]*')"
measure standalone
measure cluster --cluster-enabled yes --cluster-config-file nodes.conf

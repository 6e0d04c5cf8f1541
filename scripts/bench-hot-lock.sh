#!/usr/bin/env bash
# Issue 25: a hot lock across processes. ONE lock, N separate client processes with one task
# each (N = 2, 8, 32), for the fencelock mutex, the mutex with LockOptions::linger (`linger`),
# the fencelock fair lock and rslock side by side in one run (examples/hot_lock.rs). Starts its
# own standalone server on a free port from BASE_PORT (default 7400) and stops it (by pid) on exit.
#   BASE_PORT=7400 SECONDS_PER_RUN=10 HOLD_MS=0 PROCS="2 8 32" [HOT_LOCK=binary] [TARGET=cluster] [SPAWNED=1] scripts/bench-hot-lock.sh
# LIBS=fencelock,linger,fair,rslock (the default) chooses the libraries (a binary built before
# `linger` existed takes LIBS=fencelock,fair,rslock).
# SPAWNED=1 runs each client's loop as a spawned task (hot_lock --spawned) instead of on the
# process's main thread. MODULE=/path/to/libfencelock_module.so loads fencelock's module into
# the server(s) (scripts/build-module.sh builds it): the fencelock clients then use it.
# TARGET=cluster runs against a 3-master/3-replica cluster on BASE_PORT+1..+6 instead
# (scripts/cluster.sh; the lock's slot on one master, as every single lock is).
# Results: docs/benchmarks.md, "A hot lock across processes (issue 25)".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
port=$(free_port "${BASE_PORT:-7400}")
seconds=${SECONDS_PER_RUN:-10}
hold=${HOLD_MS:-0}
procs=${PROCS:-2 8 32}
spawned=()
[ -n "${SPAWNED:-}" ] && spawned=(--spawned)
dir=$(mktemp -d)

target=${TARGET:-standalone}
stop() {
  if [ "$target" = cluster ]; then
    scripts/cluster.sh down --base-port $((port + 1)) >/dev/null 2>&1 || true
  fi
  stop_server_in "$dir"
  rm -rf "$dir"
}
trap stop EXIT

# HOT_LOCK=path runs a binary built before (e.g. a copy of an earlier commit's) instead.
hot=${HOT_LOCK:-}
if [ -z "$hot" ]; then
  CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --example hot_lock
  hot=${CARGO_TARGET_DIR:-target}/release/examples/hot_lock
fi

load_module=()
if [ -n "${MODULE:-}" ]; then
  load_module=(--loadmodule "$(module_path "$MODULE")")
fi
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "${load_module[@]}"
wait_for_server "$port" "$dir/redis.log"
url="redis://127.0.0.1:$port"
if [ "$target" = cluster ]; then
  REDIS_ARGS="${load_module[*]}" scripts/cluster.sh up --base-port $((port + 1)) >/dev/null
  url="redis://127.0.0.1:$((port + 1)),redis://127.0.0.1:$((port + 2)),redis://127.0.0.1:$((port + 3))"
fi

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "port $port, target $target, hold ${hold} ms, ${seconds}s per measurement${MODULE:+, module loaded}"
for n in $procs; do
  "$hot" --url "$url" --target "$target" --seconds "$seconds" --hold-ms "$hold" --procs "$n" "${spawned[@]}" \
    --libs ${LIBS:-fencelock,linger,fair,rslock}
done | tee "$dir/lines"

echo "== ratios (this run)"
field() { # field LIB PROCS KEY
  { grep "^hot .* lib=$1 procs=$2 " "$dir/lines" || true; } | head -1 | tr ' ' '\n' |
    { grep "^$3=" || true; } | cut -d= -f2
}
for n in $procs; do
  r=$(field rslock "$n" grants/s)
  for lib in fencelock linger fair; do
    f=$(field $lib "$n" grants/s)
    if [ -n "$f" ] && [ -n "$r" ] && [ "$r" != 0 ]; then
      echo "ratio procs=$n ${lib}/rslock=$(echo "scale=2; $f / $r" | bc -l) ($f / $r)"
    fi
  done
done

#!/usr/bin/env bash
# The client's work per acquire + release pair, counted in instructions (deterministic enough to
# decide between designs, unlike CPU time on a shared machine): the speed benchmark's one-task
# latency loop (`examples/speed.rs latency`, one lock at a time, fresh names) run under
# valgrind's callgrind twice, with LOW and HIGH measured pairs; the difference of the two totals
# over HIGH - LOW pairs is one pair's work in the client process (every thread: the caller's,
# the runtime's workers, the connection tasks), without start-up, warm-up and shutdown. The
# server is a plain redis-server (not under valgrind) on a free port from PORT (default 7970),
# stopped by pid on exit; MODULE=path loads fencelock's module into it (then `fencelock` runs
# through the module, `fencelock-scripts` through the scripts).
#   PORT=7970 LOW=1000 HIGH=3000 LIBS="fencelock fencelock-scripts rslock" scripts/bench-client-cost.sh
#   SPEED=/path/to/an/older/speed scripts/bench-client-cost.sh   (that build of examples/speed.rs)
# Prints one line per library: `client-cost lib=<lib> instructions/pair=N`.
# Results: docs/benchmarks.md, "What one pair costs the client".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
  echo "installing valgrind with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
port=$(free_port "${PORT:-7970}")
low=${LOW:-1000}
high=${HIGH:-3000}
libs=${LIBS:-fencelock fencelock-scripts rslock}
if [ "$high" -le "$low" ]; then
  echo "HIGH ($high) must be above LOW ($low)" >&2
  exit 2
fi
dir=$(mktemp -d)

stop() {
  stop_server_in "$dir"
  rm -rf "$dir"
}
trap stop EXIT

speed=${SPEED:-}
if [ -z "$speed" ]; then
  CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --example speed
  speed=${CARGO_TARGET_DIR:-target}/release/examples/speed
fi

load_module=()
if [ -n "${MODULE:-}" ]; then
  load_module=(--loadmodule "$(module_path "$MODULE")")
fi
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "${load_module[@]}"
wait_for_server "$port" "$dir/redis.log"

# Total instructions of one run of `speed latency --pairs $2` for library $1.
count() {
  local out="$dir/callgrind.$1.$2"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$speed" --url "redis://127.0.0.1:$port" --libs "$1" latency --pairs "$2" \
    >"$dir/speed.log" 2>"$dir/valgrind.log" || {
    cat "$dir/speed.log" "$dir/valgrind.log" >&2
    exit 1
  }
  redis-cli -p "$port" flushall >/dev/null
  sed -n 's/^summary: //p' "$out"
}

echo "redis v=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), port $port, pairs $low and $high${MODULE:+, module loaded}"
for lib in $libs; do
  a=$(count "$lib" "$low")
  b=$(count "$lib" "$high")
  echo "client-cost lib=$lib pairs=$((high - low)) instructions/pair=$(((b - a) / (high - low)))"
done

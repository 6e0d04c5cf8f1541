#!/usr/bin/env bash
# Cost of each fence mode: redis-benchmark runs the acquire script (EVALSHA, 50 clients, random
# lock names, 1 ms leases so nearly every call is a grant) against one cluster-enabled
# redis-server that owns every slot. Prints requests per second per mode (docs/benchmarks.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
port=${PORT:-7400}
requests=${REQUESTS:-300000}
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --cluster-enabled yes --cluster-config-file nodes.conf --daemonize yes --pidfile "$dir/redis.pid" \
  --logfile "$dir/redis.log"
stop() {
  stop_server_in "$dir"
  rm -rf "$dir"
}
trap stop EXIT
wait_for_server "$port" "$dir/redis.log"
redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
wait_for_cluster_ok "$port" "$dir/redis.log"
cargo build --quiet --release --bin fencelock
sha=$(redis-cli -p "$port" script load "$(target/release/fencelock script acquire)")
echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $requests calls, 50 clients"
for mode in counter clock epoch; do
  grace=""  # the last argument: key expiry grace in ms (clock mode), empty to keep keys
  if [ "$mode" = clock ]; then grace=10000; fi
  rps=$(redis-benchmark -p "$port" -c 50 -n "$requests" -r 100000000 --csv \
    EVALSHA "$sha" 1 "bench:{__rand_int__}:lock" owner 1 0 "$mode" "$grace" | tail -1 | cut -d, -f2 | tr -d '"')
  echo "$mode: $rps calls/s"
done

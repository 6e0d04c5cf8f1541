#!/usr/bin/env bash
# Starts, stops or shows a local 3-master/3-replica Redis Cluster on 127.0.0.1.
#   scripts/cluster.sh up|down|status [--base-port PORT]   (default 7000: ports 7000-7005)
# Data, logs and pid files live in .cluster/PORT/ at the repository root. REDIS_ARGS adds
# arguments to every node's redis-server (e.g. REDIS_ARGS="--loadmodule /path/to/module.so").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/lib.sh"

action=${1:-}
shift || true
base=7000
while [ $# -gt 0 ]; do
  case "$1" in
    --base-port) base=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
ports=$(seq "$base" $((base + 5)))
dir_of() { echo "$root/.cluster/$1"; }
cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

running() { cli "$1" ping 2>/dev/null | grep -q PONG; }

wait_for() { # wait_for DESCRIPTION SECONDS COMMAND...
  local what=$1 limit=$2; shift 2
  local until=$((SECONDS + limit))
  until "$@"; do
    if [ $SECONDS -ge $until ]; then echo "timed out waiting for $what" >&2; return 1; fi
    sleep 0.1
  done
}

cluster_ok() {
  for p in $ports; do
    cli "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
    [ "$(cli "$p" cluster nodes 2>/dev/null | grep -c .)" -eq 6 ] || return 1
  done
}

replicas_synced() {
  local synced=0
  for p in $ports; do
    local info; info=$(cli "$p" info replication 2>/dev/null | tr -d '\r')
    if grep -q '^role:slave' <<<"$info"; then
      grep -q '^master_link_status:up' <<<"$info" || return 1
      grep -q '^master_sync_in_progress:0' <<<"$info" || return 1
      synced=$((synced + 1))
    fi
  done
  [ "$synced" -eq 3 ]
}

up() {
  ensure_redis
  if cluster_ok 2>/dev/null && replicas_synced; then
    echo "cluster already up on 127.0.0.1:$base-$((base + 5))"; return 0
  fi
  for p in $ports; do
    local d; d=$(dir_of "$p")
    if running "$p"; then continue; fi
    rm -rf "$d"; mkdir -p "$d"
    redis-server --port "$p" --bind 127.0.0.1 --daemonize yes --dir "$d" \
      --pidfile "$d/redis.pid" --logfile "$d/redis.log" --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --cluster-replica-validity-factor 0 ${REDIS_ARGS:-}
  done
  for p in $ports; do wait_for "redis on port $p" 20 running "$p"; done
  if ! cluster_ok 2>/dev/null; then
    local nodes=""; for p in $ports; do nodes="$nodes 127.0.0.1:$p"; done
    # shellcheck disable=SC2086
    redis-cli --cluster create $nodes --cluster-replicas 1 --cluster-yes >/dev/null
  fi
  wait_for "cluster state ok" 60 cluster_ok
  wait_for "replicas in sync" 60 replicas_synced
  echo "cluster up on 127.0.0.1:$base-$((base + 5))"
}

down() {
  for p in $ports; do
    local d; d=$(dir_of "$p")
    if [ -f "$d/redis.pid" ]; then
      local pid; pid=$(cat "$d/redis.pid")
      kill -CONT "$pid" 2>/dev/null || true
      kill "$pid" 2>/dev/null || true
      local until=$((SECONDS + 10))
      while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $until ]; do sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$d"
  done
  echo "cluster on 127.0.0.1:$base-$((base + 5)) is down"
}

status() {
  for p in $ports; do
    if running "$p"; then
      echo "127.0.0.1:$p $(cli "$p" info replication | tr -d '\r' | grep '^role:') $(cli "$p" cluster info | tr -d '\r' | grep '^cluster_state:')"
    else
      echo "127.0.0.1:$p down"
    fi
  done
}

case "$action" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status [--base-port PORT]" >&2; exit 2 ;;
esac

#!/bin/sh
# Entrypoint of the `fencelock` service in docker-compose.yml (image stage `cluster-client`):
# forwards 127.0.0.1:<port> to each node given in FENCELOCK_FORWARD ("port=host:port ..."), waits
# until every forward reaches its node, then runs `fencelock "$@"` in its place (so it gets the
# signals). The cluster announces its nodes as 127.0.0.1:<port> (for clients on the host); these
# forwards make the same addresses work inside this container.
set -eu
for pair in ${FENCELOCK_FORWARD:-}; do
  port=${pair%%=*}
  socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "TCP:${pair#*=}" &
done
for pair in ${FENCELOCK_FORWARD:-}; do
  port=${pair%%=*}
  tries=0
  until socat -u OPEN:/dev/null "TCP:127.0.0.1:$port" 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -ge 100 ]; then
      echo "forward-and-run: 127.0.0.1:$port does not reach ${pair#*=}" >&2
      exit 69
    fi
    sleep 0.1
  done
done
exec fencelock "$@"

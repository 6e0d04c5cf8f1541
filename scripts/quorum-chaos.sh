#!/usr/bin/env bash
# The quorum lock's fault table (docs/safety.md, "Quorum lock under faults (commit round vs
# none)"): five standalone redis-servers on ports from 8000 (--port), four workers on two
# QuorumClients, one fault per run, each run once with the commit round and once without it
# (commit-less Redlock). Prints a markdown table. Arguments go to the quorum_chaos example, e.g.
#   scripts/quorum-chaos.sh --grants 400
#   scripts/quorum-chaos.sh --grants 1000 --faults clock+5s,clock-5s --ttl-ms 500
# Faults: none, kill1, kill2, kill3, restart-empty, restart-delayed, pause, clock+5s, clock-5s
# (the clock faults need gcc: they preload tests/common/clockshim.c into one server).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_build_tools
ensure_redis
ensure_test_tools
cargo run --quiet --release --example quorum_chaos -- "$@"

# Shared helpers for fencelock's scripts. Source it; do not run it.

# Installs what building Rust code here needs besides the toolchain: a C compiler and the C
# library's headers (rustc links with `cc`; the ring crate and the clock shim compile C).
ensure_build_tools() {
  if command -v cc >/dev/null && [ -e /usr/include/stdio.h ]; then
    return 0
  fi
  echo "installing gcc and libc6-dev with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
}

# Installs redis-server and redis-cli with apt-get when either is missing.
ensure_redis() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return 0
  fi
  echo "installing redis-server with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  # Debian's package starts a service on 6379; fencelock starts its own servers.
  if command -v service >/dev/null; then service redis-server stop >/dev/null 2>&1 || true; fi
}

# Installs the PostgreSQL server with apt-get when it is missing (tests/postgres.rs starts its
# own server on a free port and needs only the binaries and the `postgres` system user).
ensure_postgres() {
  if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && id postgres >/dev/null 2>&1; then
    return 0
  fi
  echo "installing postgresql with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  # Debian's package starts a cluster on 5432; fencelock's tests start their own.
  if command -v service >/dev/null; then service postgresql stop >/dev/null 2>&1 || true; fi
}

# Installs the tools the tests call besides the servers: openssl (certificates for the TLS
# tests), util-linux's `script` (a pseudo-terminal for the exec terminal test) and tmux
# (`fencelock top` under a terminal, tests/cli_ops.rs).
ensure_test_tools() {
  # openssl: TLS test certificates; script/tmux: terminal tests; ip (iproute2): the network
  # namespaces of tests/faults.rs; gcc and the C headers: its clock-offset shim; procps: kill
  # and ps (pausing servers, a terminal test; `command -v kill` finds the shell's builtin, so ps
  # is what is looked for).
  if command -v openssl >/dev/null && command -v script >/dev/null && command -v tmux >/dev/null \
    && command -v ip >/dev/null && command -v gcc >/dev/null && [ -e /usr/include/stdio.h ] \
    && command -v ps >/dev/null; then
    return 0
  fi
  echo "installing openssl, bsdutils, tmux, iproute2, gcc, libc6-dev and procps with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl bsdutils tmux iproute2 gcc \
    libc6-dev procps >/dev/null
}

# Prints the first port from $1 up on which nothing answers or listens.
free_port() {
  local port=$1
  while redis-cli -p "$port" ping >/dev/null 2>&1 || ss -ltn 2>/dev/null | grep -q ":$port "; do
    port=$((port + 1))
  done
  echo "$port"
}

# Prints the absolute path of the module file $1 (servers run in directories of their own, so
# a relative path would not load); fails with a message when there is no such file.
module_path() {
  [ -f "$1" ] || { echo "MODULE=$1: no such file" >&2; return 1; }
  echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}

# Runs the command $4... every 50 ms until it succeeds, at most $1 seconds; then prints "$2
# within $1 s" and the end of the log file $3 (a server that aborted at start, e.g. a module it
# could not load) and fails.
poll_until() {
  local seconds=$1 what=$2 log=$3 tries=$(($1 * 20))
  shift 3
  until "$@"; do
    tries=$((tries - 1))
    if [ "$tries" -le 0 ]; then
      echo "$what within $seconds s; the end of $log:" >&2
      tail -n 5 "$log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.05
  done
}

answers_ping() { redis-cli -p "$1" ping >/dev/null 2>&1; }
cluster_state_ok() { redis-cli -p "$1" cluster info 2>/dev/null | grep -q cluster_state:ok; }

# Waits until the server on port $1 answers PING, at most 20 s (else shows the end of its log $2).
wait_for_server() {
  poll_until 20 "redis-server on port $1 did not answer" "$2" answers_ping "$1"
}

# Waits until the single-node cluster on port $1 reports cluster_state:ok (its slots just
# assigned), at most $3 seconds (default 20; else shows the end of its log $2).
wait_for_cluster_ok() {
  poll_until "${3:-20}" "the cluster node on port $1 did not reach cluster_state:ok" "$2" cluster_state_ok "$1"
}

# Stops the server whose pid file is $1/redis.pid (if any) and waits until it has exited.
stop_server_in() {
  local pid
  pid=$(cat "$1/redis.pid" 2>/dev/null || true)
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
}

# Shared helpers for fencelock's scripts. Source it; do not run it.

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

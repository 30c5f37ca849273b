#!/usr/bin/env bash
# Redis (Debian's redis-server) on loopback, for tests and local use.
#   scripts/redis.sh start|stop|status
# Idempotent: `start` returns at once when Redis already answers on the port.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
home="${RLWATCH_REDIS_HOME:-$root/.local/redis}"
port="${RLWATCH_REDIS_PORT:-6379}"

die() { echo "redis.sh: $*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  if port_open "$port"; then echo "redis.sh: Redis already up on 127.0.0.1:$port"; return 0; fi
  command -v redis-server >/dev/null 2>&1 \
    || die "redis-server is not installed (Debian: apt-get install redis-server; scripts/services.sh install does it)"
  mkdir -p "$home"
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$home" \
    --pidfile "$home/redis.pid" --logfile "$home/redis.log" --save "" --appendonly no >/dev/null
  for _ in $(seq 1 50); do
    port_open "$port" && { echo "redis.sh: Redis up on 127.0.0.1:$port"; return 0; }
    sleep 0.1
  done
  tail -20 "$home/redis.log" >&2; die "Redis did not open port $port within 5 s"
}

stop() {
  if [ -f "$home/redis.pid" ] && kill -0 "$(cat "$home/redis.pid")" 2>/dev/null; then
    kill "$(cat "$home/redis.pid")"; echo "redis.sh: stopped"
  else
    echo "redis.sh: not running"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if port_open "$port"; then echo "up on 127.0.0.1:$port"; else echo "down"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Everything the integration tests and a local `rlwatch worker` need, on this machine.
#   scripts/services.sh install   # Debian's redis-server (apt) if missing; checks Java and Maven
#   scripts/services.sh start     # Kafka (KRaft, loopback) and Redis, idempotent
#   scripts/services.sh stop
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

install() {
  if ! command -v redis-server >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || { echo "services.sh: redis-server missing and no apt-get: install Redis 6+ yourself" >&2; exit 1; }
    echo "services.sh: installing redis-server (Debian package) ..."
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  fi
  command -v java >/dev/null 2>&1 || { echo "services.sh: Java 17+ is needed for Kafka (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null 2>&1 || { echo "services.sh: Maven is needed to resolve Kafka (apt-get install maven)" >&2; exit 1; }
}

case "${1:-}" in
  install) install ;;
  start) "$here/redis.sh" start; "$here/kafka.sh" start ;;
  stop) "$here/kafka.sh" stop; "$here/redis.sh" stop ;;
  status) "$here/redis.sh" status; "$here/kafka.sh" status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac

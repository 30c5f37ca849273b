#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs rlwatch and what the tests need into the
# virtualenv .venv (scripts/install.sh all), starts Apache Kafka and Redis on loopback, runs unit
# and integration tests. Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh all
venv="${RLWATCH_VENV:-$PWD/.venv}"
export PATH="$venv/bin:$PATH"          # `rlwatch` and the tests' python are the virtualenv's
py="$venv/bin/python"
scripts/services.sh install
scripts/services.sh start
# The dashboard's browser test: Debian's Chromium, node and playwright-core (web/frontend); promtool checks /metrics.
pkgs=""; command -v chromium >/dev/null || pkgs="$pkgs chromium"; command -v node >/dev/null || pkgs="$pkgs nodejs npm"
command -v promtool >/dev/null || pkgs="$pkgs prometheus"
if [ -n "$pkgs" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $pkgs >/dev/null
fi
(cd web/frontend && npm ci --no-audit --no-fund --loglevel=error)
set +e
"$py" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, starts Apache Kafka and
# Redis on loopback, runs unit and integration tests. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e ".[all]"
scripts/services.sh install
scripts/services.sh start
# The dashboard's browser test: Debian's Chromium, node and playwright-core (web/frontend); promtool checks /metrics.
pkgs=""; command -v chromium >/dev/null || pkgs="$pkgs chromium"; command -v node >/dev/null || pkgs="$pkgs nodejs npm"
command -v promtool >/dev/null || pkgs="$pkgs prometheus"
[ -z "$pkgs" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null; }
(cd web/frontend && npm ci --no-audit --no-fund --loglevel=error)
set +e
python3 -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"

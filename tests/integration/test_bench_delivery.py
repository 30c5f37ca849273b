"""The delivery benchmark runs on a real redis-server and prints what it measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_delivery_benchmark_counts_round_trips_and_cpu_per_alert(services):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_delivery.py"), "--runs", "4",
                          "--steps", "200", "--rounds", "1", "--redis", services["redis"]],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    head = re.search(r"(\d+) alerts, (\d+) firing \((\d+) with commands\), (\d+) brake commands", out.stdout)
    assert head and int(head.group(1)) > 0 and int(head.group(3)) > 0, out.stdout
    row = re.search(r"^\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                    + re.escape(str(ROOT)) + "$", out.stdout, re.M)
    assert row, out.stdout
    notify_trips, notify_cpu, brake_trips, brake_cpu, tick_trips, tick_cpu = map(float, row.groups())
    # the alerts cost the outbox round trips (those notified together share theirs); a firing
    # alert's brake one script (a new connection's set-up is counted apart; on a fresh Redis
    # the first brake loads the script too)
    assert notify_trips > 0 and 1 <= brake_trips < 2 and notify_cpu > 0 and brake_cpu > 0
    setup = re.search(r"connection set-up round trips, all passes: (\d+)", out.stdout)
    assert setup and int(setup.group(1)) > 0, out.stdout
    assert tick_trips >= 1 and tick_cpu > 0      # at least the unacknowledged brakes are read

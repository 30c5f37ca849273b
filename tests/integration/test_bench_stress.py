"""The rebalance stress (bench/stress_rebalance.py) still runs against the real broker: a cycle
of a second worker joining and leaving is two rebalances of the first, and it reports them."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.integration.conftest import ROOT


def test_the_rebalance_stress_counts_the_first_workers_rebalances_and_quiet_recoveries(services):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "stress_rebalance.py"), "--cycles",
                          "1", "--hold", "4", "--hog", "0", "--runs", "4", "--rate", "50"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = re.search(r"^(\d+) cycles, (\d+) rebalances of the first worker; workers whose table "
                     r"recovery went quiet: (\d+) of (\d+)", out.stdout, re.M)
    assert last, out.stdout
    cycles, rebalances, quiet, workers = map(int, last.groups())
    assert (cycles, workers) == (1, 2) and rebalances >= 3 and quiet == 0, out.stdout

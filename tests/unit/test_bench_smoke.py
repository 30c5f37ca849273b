"""The core's benchmark still runs (benchmarks are not timed in tests, but they must not rot):
a tiny fleet through every reader, slice by slice, with the figures it promises printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fleet_benchmark_prints_every_reader_and_both_ratios():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fleet_replay.py"), "--runs", "2",
                          "--steps", "60", "--repeats", "1", "--slices", "5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for reader in ("json.loads loop", "reference detector", "rlwatch core"):
        assert re.search(rf"^{re.escape(reader)}\s+[\d,]+$", text, re.M), text
    assert re.search(r"rlwatch / json.loads floor:\s+\d+\.\d\d", text), text
    assert re.search(r"rlwatch / reference detector:\s+\d+\.\d\d", text), text
    native = re.search(r"alerts: native (\d+), pure (\d+)", text)
    if native:     # the native and the pure core raise the same alerts on the same file
        assert native.group(1) == native.group(2)

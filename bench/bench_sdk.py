"""Time that ``Monitor.log`` adds to a training step, and the memory the SDK holds in an outage
(``python bench/bench_sdk.py``).

1. Latency of one ``Monitor.log(step, metrics)`` call with 30 metrics, p50 / p99 / p99.9 /
   max over ``--calls`` calls (default 200 000) in a tight loop (the worst case: the sender
   thread is busy the whole time and competes for the GIL), in three settings printed side by
   side with a plain-Python baseline that does the irreducible part of the job (build the same
   event dict and append it to a bounded deque), so that the figures read as ratios:

   * broker up: Apache Kafka at 127.0.0.1:9092 (started with scripts/services.sh if down), a
     fresh topic per run;
   * broker down: a Monitor pointed at a closed port (127.0.0.1:1);
   The metrics dict is built outside the timed region (the training code builds it anyway).

2. Memory held by the SDK during a long outage: 1 000 000 ``log`` calls against the closed
   port with ``buffer_size=10000``; traced Python memory (tracemalloc) and RSS after 10k, 100k
   and 1M calls, after ``close()`` and once the sender thread has ended. It must stay flat once
   the buffer is full.

Targets: p50 < 20 us, p99 < 200 us. ``--profile`` prints where the time of ``log`` goes.
Options: ``--calls N``, ``--memory-calls N`` (default 1 000 000), ``--quick``, ``--no-kafka``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import socket
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections import deque

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from producers import Monitor  # noqa: E402 - after the sys.path insert

N_METRICS = 30
NAMES = [f"group{i % 6}/metric_{i}" for i in range(N_METRICS)]
TARGET_P50_US, TARGET_P99_US = 20.0, 200.0


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ensure_kafka() -> bool:
    if port_open(9092):
        return True
    print("bench_sdk: Kafka is down; starting it with scripts/services.sh start ...", file=sys.stderr)
    subprocess.run([os.path.join(ROOT, "scripts", "services.sh"), "start"], check=False, timeout=300)
    return port_open(9092)


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def metrics_for(step: int) -> dict:
    base = step * 1e-3
    return {name: base + i for i, name in enumerate(NAMES)}


class Baseline:
    """The least a non-blocking logger must do: build the event, append it to a bounded queue."""

    def __init__(self, capacity=10_000):
        self.q = deque(maxlen=capacity)
        self.clock = time.time

    def log(self, step, metrics):
        self.q.append({"schema": 1, "kind": "step", "run_id": "bench", "rank": 0, "step": step,
                       "ts": self.clock(), "metrics": dict(metrics)})


def timed(log, calls: int, warmup: int = 2000) -> list[int]:
    pc = time.perf_counter_ns
    for s in range(warmup):
        log(s, metrics_for(s))
    lat = [0] * calls
    for s in range(calls):
        m = metrics_for(s)
        t0 = pc()
        log(s, m)
        lat[s] = pc() - t0
    return lat


def summary(lat: list[int]) -> dict:
    lat = sorted(lat)
    n = len(lat)

    def q(p):
        return lat[min(n - 1, int(p * n))] / 1e3

    return {"p50": q(0.50), "p99": q(0.99), "p99.9": q(0.999), "max": lat[-1] / 1e3,
            "over_1ms": sum(1 for x in lat if x > 1_000_000), "n": n}


def timer_overhead_ns(n=200_000) -> float:
    pc = time.perf_counter_ns
    lat = []
    for _ in range(n):
        t0 = pc()
        lat.append(pc() - t0)
    lat.sort()
    return lat[n // 2]


def run_monitor(kafka: str, calls: int, topic: str) -> tuple[dict, dict]:
    mon = Monitor("bench-sdk", kafka=kafka, redis=False, topic=topic, heartbeat_seconds=0,
                  buffer_size=10_000)
    try:
        lat = timed(mon.log, calls)
        info = {"dropped": mon.dropped, "sent": mon.sender.sent, "pending": mon.sender.pending(),
                "failures": mon.sender.failures}
    finally:
        mon.close(timeout=3.0)
    return summary(lat), info


def memory_run(calls: int) -> list[tuple[str, float, float]]:
    """(label, traced MB, RSS MB) during a long outage."""
    gc.collect()
    rows = [("before Monitor()", 0.0, rss_mb())]
    tracemalloc.start()
    t_base = tracemalloc.get_traced_memory()[0]
    mon = Monitor("bench-mem", kafka="127.0.0.1:1", redis=False, heartbeat_seconds=0, buffer_size=10_000)
    marks = {10_000, 100_000, calls}
    for s in range(calls):
        mon.log(s, metrics_for(s))
        if s + 1 in marks:
            rows.append((f"after {s + 1:>9,} logs (dropped {mon.dropped:,})",
                         (tracemalloc.get_traced_memory()[0] - t_base) / 2**20, rss_mb()))
    mon.close(timeout=1.0)
    gc.collect()
    rows.append(("after close() returned", (tracemalloc.get_traced_memory()[0] - t_base) / 2**20, rss_mb()))
    # a connection attempt in flight (kafka-python's bootstrap, up to bootstrap_timeout_ms=30 s)
    # keeps the sender thread, and so its buffer, alive after close() returned
    thread, t0 = mon.sender._thread, time.monotonic()
    thread.join(60)
    waited = time.monotonic() - t0
    del mon, thread
    gc.collect()
    rows.append((f"after the sender thread ended ({waited:.1f} s later)",
                 (tracemalloc.get_traced_memory()[0] - t_base) / 2**20, rss_mb()))
    tracemalloc.stop()
    return rows


def profile_log(calls: int) -> str:
    mon = Monitor("bench-prof", kafka="127.0.0.1:1", redis=False, heartbeat_seconds=0)
    ms = [metrics_for(s) for s in range(1000)]
    prof = cProfile.Profile()
    prof.enable()
    for s in range(calls):
        mon.log(s, ms[s % 1000])
    prof.disable()
    mon.close(timeout=1.0)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--memory-calls", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="20k calls, 200k memory calls")
    ap.add_argument("--no-kafka", action="store_true", help="skip the broker-up run")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.memory_calls = 20_000, 200_000

    print(f"Monitor.log latency, {N_METRICS} metrics per call, {args.calls:,} calls per setting "
          f"(tight loop), Python {sys.version.split()[0]}, timer overhead "
          f"{timer_overhead_ns():.0f} ns (included below)\n")
    results: list[tuple[str, dict, dict | None]] = []
    base = Baseline()
    results.append(("baseline: dict + deque.append", summary(timed(base.log, args.calls)), None))
    if not args.no_kafka:
        if ensure_kafka():
            topic = f"rlwatch.bench.{uuid.uuid4().hex[:8]}"
            s, info = run_monitor("127.0.0.1:9092", args.calls, topic)
            results.append(("Monitor.log, broker up", s, info))
        else:
            print("bench_sdk: Kafka could not be started; broker-up run left out\n", file=sys.stderr)
    s, info = run_monitor("127.0.0.1:1", args.calls, "rlwatch.bench.down")
    results.append(("Monitor.log, broker down", s, info))

    b = results[0][1]
    head = f"{'setting':32s} {'p50 us':>8s} {'p99 us':>8s} {'p99.9 us':>9s} {'max us':>9s} {'>1ms':>5s}   x baseline (p50, p99)"
    print(head)
    print("-" * len(head))
    for name, s, _ in results:
        ratio = f"{s['p50'] / b['p50']:.1f}x, {s['p99'] / b['p99']:.1f}x"
        print(f"{name:32s} {s['p50']:8.2f} {s['p99']:8.2f} {s['p99.9']:9.1f} {s['max']:9.0f} "
              f"{s['over_1ms']:5d}   {ratio}")
    print()
    for name, _, info in results:
        if info:
            print(f"{name}: {info['sent']:,} sent, {info['dropped']:,} dropped (buffer full), "
                  f"{info['pending']:,} pending at the end, {info['failures']} send failures")
    ok = True
    for name, s, _ in results[1:]:
        good = s["p50"] < TARGET_P50_US and s["p99"] < TARGET_P99_US
        ok &= good
        print(f"{name}: p50 {s['p50']:.2f} us (target < {TARGET_P50_US:.0f}), p99 {s['p99']:.2f} us "
              f"(target < {TARGET_P99_US:.0f}): {'OK' if good else 'MISSED'}")

    print(f"\nMemory held during an outage: {args.memory_calls:,} logs to a closed port, "
          f"buffer_size=10000")
    print(f"{'':44s} {'traced MB':>10s} {'RSS MB':>8s}")
    rows = memory_run(args.memory_calls)
    for label, traced, rss in rows:
        print(f"{label:44s} {traced:10.1f} {rss:8.1f}")
    full = [r for r in rows if r[0].startswith("after ") and " logs " in r[0]]
    bounded = full[-1][1] <= full[0][1] * 1.25 + 1.0
    print(f"bounded: {'yes' if bounded else 'NO'} (traced memory after the last mark vs after 10k: "
          f"{full[-1][1]:.1f} MB vs {full[0][1]:.1f} MB; {full[0][1] * 2**20 / 10_000:.0f} bytes per buffered event)")
    ok &= bounded

    if args.profile:
        print("\nWhere the time of Monitor.log goes (cProfile, broker down, tottime):")
        print(profile_log(100_000))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Cost of the whole pure pipeline per event: parse + all 37 built-in rules, per run.

Side by side in one run: parsing alone (the floor any processor pays), and parse + process
for simulated PPO step events (about 32 metrics, 64-sample dists, 3 categories) and for a
lean event of 10 metrics (a typical user's). Prints microseconds per event and the ratios.

    python bench/bench_processor.py [--steps N]
"""
from __future__ import annotations

import argparse
import statistics
import time

from producers.sim import SimConfig, simulate
from contract.events import dump_event, parse_event
from rules.loader import load_pack
from streams.processor import Pipeline


def timed(fn, repeats: int = 3) -> float:
    best = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t)
    return min(best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args()
    pack = load_pack("rlhf")
    full = [dump_event(e) for e in simulate(SimConfig(run_id="bench", seed=1), args.steps)
            if e["kind"] == "step"]
    keep = ["kl/mean", "reward/mean", "reward/std", "entropy/mean", "loss/policy", "loss/value",
            "ppo/clip_frac", "response/length_mean", "grad_norm/actor", "lr/actor"]
    lean = []
    for raw in full:
        ev = parse_event(raw, 0.0)
        lean.append(dump_event({"schema": 1, "kind": "step", "run_id": "lean", "step": ev.step,
                                "ts": ev.ts, "metrics": {k: ev.metrics[k] for k in keep}}))

    rows = []
    for name, events in (("PPO step, 32 metrics + dists + groups", full), ("lean step, 10 metrics", lean)):
        n = len(events)
        parse_only = timed(lambda: [parse_event(r, 0.0) for r in events]) / n

        def run():
            p = Pipeline(pack)
            for r in events:
                p.feed(parse_event(r, 0.0), 0.0)
        whole = timed(run, repeats=2) / n
        rows.append((name, parse_only * 1e6, whole * 1e6))

    print(f"{'event':40s} {'parse only':>12s} {'parse+rules':>12s} {'ratio':>7s} {'events/s/core':>14s}")
    for name, p, w in rows:
        print(f"{name:40s} {p:10.1f}us {w:10.1f}us {w / p:6.1f}x {1e6 / w:14.0f}")


if __name__ == "__main__":
    main()

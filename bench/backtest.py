"""Backtest of the built-in pack: detection delay per failure mode and false alarms.

* Simulated faults (producers/simulator.py), several seeds each: steps from the onset to the
  first alert of the fault's own rule at any tier, and at its catalog tier.
* Healthy simulated PPO and GRPO runs, several seeds: alerts per 1,000 steps by tier.
* The published TRL runs in ../shared/real-logs with their labels: first alert vs onset for
  the faulty ones, anything orange or above on the healthy ones.

    python bench/backtest.py [--seeds 3] [--healthy-steps 2000]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from producers.simulator import FAULTS, SimConfig, effective_algo, simulate
from contract.alert import severity_rank
from contract.events import parse_event
from contract.presets import get_preset
from rlwatch.replay import replay
from rules.loader import load_pack, with_preset
from streams.processor import Pipeline

ONSET = 300
REAL = Path(__file__).resolve().parents[2] / "shared" / "real-logs"


def run_sim(pack, fault, seed, steps, algo="ppo"):
    world = 4 if fault in ("rank_outlier", "param_hash_mismatch") else 1
    cfg = SimConfig(run_id=f"bt-{fault}-{seed}", fault=fault, onset=ONSET, seed=seed,
                    algo=effective_algo(algo, fault), world_size=world)
    p, fired, last = Pipeline(pack), [], 0.0
    for raw in simulate(cfg, steps):
        ev = parse_event(raw, raw["ts"])
        last = max(last, ev.ts)
        fired += [a for a in p.feed(ev, ev.ts) if a.state == "firing"]
    if fault == "run_stalled":
        fired += [a for a in p.tick(last + 600) if a.state == "firing"]
    return fired


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--healthy-steps", type=int, default=2000)
    args = ap.parse_args()
    pack = load_pack("rlhf")
    tiers = {r.id: max((t.severity for t in r.tiers), key=severity_rank) for r in pack.rules}

    print(f"Simulated faults (onset step {ONSET}, {args.seeds} seeds, 600 steps after onset)")
    print(f"{'rule':28s} {'caught':>7s} {'delay any tier':>15s} {'delay top tier':>15s}")
    delays = []
    for fault in [f for f in FAULTS if f != "healthy"]:
        any_d, top_d = [], []
        for seed in range(args.seeds):
            fired = [a for a in run_sim(pack, fault, seed, ONSET + 600) if a.rule == fault]
            if fired:
                any_d.append(max(0, min(a.step for a in fired) - ONSET))
            top = [a for a in fired if a.severity == tiers[fault]]
            if top:
                top_d.append(max(0, min(a.step for a in top) - ONSET))
        delays += any_d
        med = lambda d: f"{statistics.median(d):.0f}" if d else "-"
        print(f"{fault:28s} {len(any_d):>3d}/{args.seeds:<3d} {med(any_d):>15s} {med(top_d):>15s}")
    print(f"median detection delay over all faults: {statistics.median(delays):.0f} steps\n")

    print(f"Healthy simulated runs ({args.seeds} seeds x {args.healthy_steps} steps)")
    for algo in ("ppo", "grpo"):
        counts, steps = Counter(), 0
        for seed in range(args.seeds):
            for a in run_sim(pack, "healthy", 100 + seed, args.healthy_steps, algo):
                counts[(a.severity, a.rule)] += 1
            steps += args.healthy_steps
        per_k = {s: sum(n for (sev, _), n in counts.items() if sev == s) * 1000 / steps
                 for s in ("yellow", "orange", "red", "black")}
        rules = sorted({r for (_, r) in counts})
        print(f"  {algo}: alerts per 1,000 steps: " + ", ".join(f"{k} {v:.2f}" for k, v in per_k.items())
              + (f"  (rules: {', '.join(rules)})" if rules else ""))

    labels_file = REAL / "labels.json"
    if labels_file.exists():
        print("\nPublished TRL runs (../shared/real-logs)")
        labels = json.loads(labels_file.read_text())
        for name, lab in sorted(labels.items()):
            preset = get_preset(lab["preset"])
            p = with_preset(pack, preset)
            res = replay([REAL / name], p, preset)
            firing = [a for a in res.alerts if a.state == "firing"]
            loud = [a for a in firing if severity_rank(a.severity) >= 2]
            first = min((a.step for a in firing), default=None)
            worst = max((a.severity for a in firing), key=severity_rank, default="none")
            onset = lab.get("onset")
            delay = "" if first is None or onset is None else f" delay {first - onset}"
            print(f"  {name:40s} {lab['label']:16s} first alert {first}{delay}, worst {worst}, "
                  f"orange+ {len(loud)}: {sorted({a.rule for a in loud})}")


if __name__ == "__main__":
    main()

"""What a worker spends on one run when it restarts: the run's state read from the table
(``decode_state``), the run rebuilt from it (``Processor.load_state``: its rules compiled, its
statistics loaded) and the run's first events after the restart (its windows rebuilt from the
statistics), and what it spends writing the state before each offset commit
(``to_state(packed=True)`` and ``encode_state``). Milliseconds per run, best of several rounds,
and what that makes for a fleet of 1,250 runs of 8 ranks (a 10,000-GPU fleet).

A restarted worker restores each run when the run's first event comes (and its liveness timer
all of them): with a fleet, that time is most of the wait between "Ready" and processing again
(``bench/bench_restart.py`` measures the whole restart through Kafka).

``--against DIR`` measures another checkout (its native module built) in turns with this one,
each in a process of its own, and prints the ratios.

    python bench/bench_restore.py [--runs 48] [--steps 400] [--rounds 5] [--against DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEET = 1250
PHASES = ("decode", "load_state", "first events", "write")


def measure(runs: int, steps: int, rounds: int) -> dict[str, float]:
    """Milliseconds per run of each phase, best of ``rounds``, in this process's tree."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fleet_replay import fleet_lines

    from contract.events import parse_event
    from contract.settings import Settings
    from rules.loader import load_pack
    from streams.heap import Heap
    from streams.processor import Processor
    from streams.state_codec import decode_state, encode_state

    lines = fleet_lines(runs, steps)
    half = len(lines) // 2
    proc = Processor(load_pack(Settings().rules))
    states: dict = {}
    for i, raw in enumerate(lines[:half]):
        ev = parse_event(raw, 1e9 + i)
        st = states.get(ev.run_id) or states.setdefault(ev.run_id, proc.new_state(ev.run_id))
        proc.process(st, ev, ev.ts)
    Heap().install()      # the worker's collector policy (streams.heap)
    blobs = {r: encode_state(st.to_state(packed=True)) for r, st in states.items()}
    firsts: dict = {}
    for i, raw in enumerate(lines[half:]):
        ev = parse_event(raw, 2e9 + i)
        firsts.setdefault((ev.run_id, ev.rank), ev)
    pc = time.perf_counter
    best = dict.fromkeys(PHASES, float("inf"))
    for _ in range(rounds):
        took = dict.fromkeys(PHASES, 0.0)
        restored = []
        for run_id, blob in blobs.items():
            a = pc()
            data = decode_state(blob)
            b = pc()
            st = proc.load_state(data)
            c = pc()
            for rank in range(8):
                ev = firsts.get((run_id, rank))
                if ev is not None:
                    proc.process(st, ev, ev.ts)
            d = pc()
            took["decode"] += b - a
            took["load_state"] += c - b
            took["first events"] += d - c
            restored.append(st)
        a = pc()
        for st in restored:
            encode_state(st.to_state(packed=True))
        took["write"] = pc() - a
        for st in restored:
            st.release()
        for k in PHASES:
            best[k] = min(best[k], took[k] / len(blobs) * 1e3)
    return best


def child(tree: str, args) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, __file__, "--child", "--runs", str(args.runs),
                          "--steps", str(args.steps), "--rounds", str(args.rounds)],
                         env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--steps", type=int, default=400, help="steps of each run (restarted halfway)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=2, help="with --against: turns of each tree")
    ap.add_argument("--against", metavar="DIR", help="another checkout, measured in turns")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(measure(args.runs, args.steps, args.rounds)))
        return
    trees = [("this tree", str(ROOT))] + ([("--against", str(Path(args.against).resolve()))]
                                         if args.against else [])
    got: dict[str, dict[str, float]] = {}
    for _ in range(args.turns if args.against else 1):
        for name, tree in trees:
            r = child(tree, args)
            got[name] = {k: min(r[k], got.get(name, r)[k]) for k in PHASES}
    print(f"{args.runs} runs x 8 ranks, restored after {args.steps // 2} steps; ms per run, best of "
          f"{args.rounds} rounds{' and ' + str(args.turns) + ' turns' if args.against else ''}")
    print(f"{'':12s}" + "".join(f"{k:>14s}" for k in PHASES) + f"{'restore':>10s}"
          + f"{'x ' + format(FLEET, ',') + ' runs':>16s}")
    for name, _ in trees:
        r = got[name]
        restore = r["decode"] + r["load_state"] + r["first events"]
        print(f"{name:12s}" + "".join(f"{r[k]:14.3f}" for k in PHASES) + f"{restore:10.3f}"
              + f"{restore * FLEET / 1e3:14.2f} s")
    if args.against:
        a, b = got["this tree"], got["--against"]
        ra = sum(a[k] for k in PHASES[:3])
        rb = sum(b[k] for k in PHASES[:3])
        print("ratio      " + "".join(f"{a[k] / b[k]:14.2f}" for k in PHASES) + f"{ra / rb:10.2f}")


if __name__ == "__main__":
    main()

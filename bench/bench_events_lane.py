"""The worker's events lane in process: ``process_batch`` of ``rlwatch worker`` over the bench
fleet, without Kafka, so that two versions of it compare with the noise of one process.

Through Kafka (``bench_worker_kafka.py``) the worker shares this host's CPUs with the broker, its
own consumer thread and the brake thread, and one round's figure swings by several per cent:
a change worth 5 % of the lane can read as anything from -3 % to +5 % there. Here the lane
runs as the worker builds it (``streams.app.build_app``: the core, the snapshot recorder, the
fleet view, the run states, the alerts with their snapshots serialised), over the fleet in
blocks of ``--batch`` records as its consumer hands them over, a run at a time, with the cycle
collector as the worker sets it (``streams.heap``); what needs a broker or Redis is answered at
once (Kafka takes every send, the brake thread only counts).

Each measurement is a process of its own (``--tree DIR`` runs that tree's worker,
``PYTHONPATH=DIR``); with several trees they take turns, ``--rounds`` times, and the medians and
each tree's ratio to the first are printed. The fleet's timestamps are moved to the last hour
(a step from too long ago is not a routine one).

    python bench/bench_events_lane.py [--runs 48] [--steps 800] [--batch 20000] [--rounds 3]
                                      [--tree <an older tree> ...]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


def fleet(runs: int, steps: int) -> list[bytes]:
    """The bench fleet (bench_fleet_replay), its timestamps moved into the last hour."""
    sys.path.insert(0, str(HERE))
    from bench_fleet_replay import fleet_lines

    lines = fleet_lines(runs, steps)
    first = json.loads(lines[0])["ts"]
    start = time.time() - 3600
    out = []
    for raw in lines:
        event = json.loads(raw)
        event["ts"] = start + (event["ts"] - first) * 0.001    # (a fleet's hours in seconds)
        out.append(json.dumps(event).encode())
    return out


def child(path: str, batch: int, passes: int = 1, turn_every: int = 0) -> dict:
    """One pass of this process's worker (its tree is on ``sys.path``) over the fleet in
    ``path``: events per second of wall and of CPU, and the worker's counters. With
    ``passes`` > 1 the fleet is taken again as other runs (each run id prefixed with the pass:
    the same work, on fresh run states), for an instruction count by difference
    (``bench_instructions.py --lane``). With ``turn_every``, the lane gives the loop a turn
    every that many records instead of every ``LANE_TURN_SECONDS`` of work: under callgrind,
    which runs the code about 50 times slower, a turn by the clock would come 50 times as
    often per record as it does at full speed."""
    import faust.topics
    from aiokafka.structs import ConsumerRecord
    from faust.types import TP

    import streams.app as worker
    import streams.batch_lane as batch_lane
    from contract.settings import Settings
    from streams.batch_lane import LaneBatch

    if turn_every:
        records_seen = [0]

        def due(self) -> bool:
            records_seen[0] += 1
            return records_seen[0] % turn_every == 0
        batch_lane.Turns.due = due

    with open(path, "rb") as f:
        lines = pickle.load(f)

    async def send(topic, *, key=None, value=None, **kw):   # Kafka takes every send at once
        taken = asyncio.get_running_loop().create_future()
        taken.set_result(None)
        return taken

    class Brakes:        # the brake thread: nothing to brake here
        def submit(self, alert, done):
            pass

    class Consumer:      # what a LaneBatch asks of its consumer
        def __init__(self):
            from types import SimpleNamespace
            self.app = SimpleNamespace(flow_control=SimpleNamespace(is_active=lambda: True),
                                       consumer_generation_id=1)

        def ack_lane(self, batch, start, stop):
            return stop - start

    faust.topics.Topic.send = send
    worker.build_brake_thread = lambda *a: Brakes()
    worker.RunStates.flush_run = lambda self, run_id: None     # (the table needs a producer)
    settings = Settings(redis="redis://127.0.0.1:1/0")
    app = worker.build_app(settings)
    lane = app.batch_lanes[settings.events_topic]
    topic = settings.events_topic
    records = []
    for p in range(passes):
        for raw in lines:
            if p:
                raw = raw.replace(b'"run_id": "', f'"run_id": "p{p}-'.encode(), 1)
            # the key, the run id as json.dumps wrote it (cut out: an instruction count of the
            # lane takes the difference of one pass and two, these records' making included)
            key = raw.split(b'"run_id": "', 1)[1].split(b'"', 1)[0]
            records.append(ConsumerRecord(topic, 0, len(records), 0, 0, key, raw, None, 0,
                                          len(raw), ()))
    tps = {0: TP(topic, 0)}
    heap = getattr(app, "rlwatch_heap", None)
    if heap is not None:     # the collector as `rlwatch worker` sets it (streams.heap)
        heap.install()

    async def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for k in range(0, len(records), batch):
            await lane(LaneBatch(records[k:k + batch], Consumer(), topic, tps, 1))
        return time.perf_counter() - wall, time.process_time() - cpu

    wall, cpu = asyncio.run(run())
    return {"events": len(records), "wall": wall, "cpu": cpu,
            "counters": dict(app.rlwatch_counters)}


def measure(tree: Path, path: str, batch: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", path,
                          "--batch", str(batch)], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the events lane of {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=20000,
                    help="records per batch handed to the lane (the worker's batches when behind "
                    "are about this size and larger)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], type=Path, metavar="DIR",
                    help="also run this tree's events lane (repeatable), to compare in one run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--turn-every", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.passes, args.turn_every)))
        return
    if args.batch < 1 or args.rounds < 1:
        raise SystemExit("--batch and --rounds must be at least 1")
    trees = [ROOT, *(t.resolve() for t in args.tree)]
    for t in trees[1:]:
        if not (t / "streams" / "app.py").exists():
            raise SystemExit(f"{t} is not an rlwatch tree (no streams/app.py)")
    lines = fleet(args.runs, args.steps)
    print(f"fleet: {args.runs} runs x {args.steps} steps: {len(lines)} events, "
          f"{sum(map(len, lines)) / len(lines):.0f} bytes on average; batches of {args.batch}")
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(lines, f)
        path = f.name
    try:
        got: dict[Path, list[dict]] = {t: [] for t in trees}
        for r in range(args.rounds):
            for t in trees:          # in turns: a host whose speed drifts weighs on all alike
                m = measure(t, path, args.batch)
                got[t].append(m)
                print(f"round {r + 1}: {label(t):30s} {m['events'] / m['wall']:>10,.0f} events/s "
                      f"{m['events'] / m['cpu']:>10,.0f} per CPU second  {m['counters']}")
    finally:
        os.unlink(path)
    first = got[ROOT]
    print(f"over {args.rounds} round(s) (median):")
    for t in trees:
        rates = [m["events"] / m["wall"] for m in got[t]]
        line = f"  {label(t):30s} {statistics.median(rates):>10,.0f} events/s"
        if t is not ROOT:
            ratios = [a["wall"] / b["wall"] for a, b in zip(got[t], first)]
            faster = sum(x > 1 for x in ratios)
            line += (f"; this tree / {label(t)}: {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}-{max(ratios):.3f}), faster in {faster} of {len(ratios)}")
        print(line)


def label(tree: Path) -> str:
    return "this tree" if tree == ROOT else str(tree)


if __name__ == "__main__":
    main()

"""Instructions per event of the core, counted (valgrind's callgrind), not timed.

On a shared host the speed of the machine drifts, by as much as two times between runs, so
events per second compare well only inside one run. An instruction count does not drift: this
counts the instructions of one pass of the fleet of ``bench_fleet_replay.py`` through the whole
core as the worker takes events (``Pipeline.feed_raw``, the built-in pack), for
one tree or several side by side (``--tree`` an older copy of the code, e.g. a
``git worktree``), and their ratios.

One pass is the difference of a process making two passes and one making one (start-up, the
imports and the fleet's making cancel out), with hash randomisation and address-space
randomisation off, so that a count repeats to within about 0.2 %. It counts the native core's
instructions too. Slow (callgrind runs the code about 50 times slower): a few minutes.

``--lane`` counts the worker's events lane instead (``bench_events_lane.py``: ``process_batch``
of ``rlwatch worker`` as it takes a fetched batch, a run's rank steps at once, without Kafka),
whose speed in events per second swings by 10 % from round to round on this kind of host: a
change of a few per cent shows only as a count. One pass there is the difference of a process
taking the fleet once and one taking it twice (the second time as other runs, on fresh run
states); the lane's turns come every ``LANE_TURN_RECORDS`` records, not by the clock.

    python bench/bench_instructions.py [--runs 6] [--steps 400] [--lane] [--tree OLD_TREE ...]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[1] + "/bench")
from bench_fleet_replay import fleet_lines
try:    # the events as the worker reads them (a plain step as a WireStep)
    from contract.events import read_event as parse_event
except ImportError:     # a tree from before read_event
    from contract.events import parse_event
from rules.loader import load_pack
from streams.processor import Pipeline, tune_gc
lines = fleet_lines(int(sys.argv[2]), int(sys.argv[3]))
pack = load_pack("rlhf")
tune_gc()
now = parse_event(lines[-1], 0.0).ts     # (the fleet's events are in time order)
for _ in range(int(sys.argv[4])):
    pipe = Pipeline(pack)
    if hasattr(pipe, "feed_raw"):    # as the worker takes events
        for raw in lines:
            pipe.feed_raw(raw, now)
    else:     # a tree from before feed_raw
        for raw in lines:
            ev = parse_event(raw, 0.0)
            pipe.feed(ev, ev.ts)
print(len(lines))
"""


#: the lane's turns, every this many records (about what 10 ms of work takes at full speed: by
#: the clock, under callgrind, they would come about 50 times as often)
LANE_TURN_RECORDS = 1000


def count(tree: Path, runs: int, steps: int, passes: int, lane: str | None = None) -> tuple[int, int]:
    """(instructions, events of one pass) of a process making ``passes`` passes with
    ``tree``'s code: through ``Pipeline.feed_raw``, or through the events lane over the fleet
    pickled in ``lane``."""
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree))
    if lane is None:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-c", CHILD, str(tree), str(runs), str(steps), str(passes)]
    else:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(ROOT / "bench" / "bench_events_lane.py"), "--child", lane, "--passes", str(passes),
               "--turn-every", str(LANE_TURN_RECORDS)]
    if shutil.which("setarch"):
        cmd = ["setarch", "-R", *cmd]      # the same addresses every time
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"callgrind failed for {tree}:\n{out.stderr[-2000:]}")
    if lane is None:
        return int(found.group(1)), int(out.stdout.split()[-1])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["counters"]["events"] != got["events"]:
        raise SystemExit(f"the events lane of {tree} took {got['counters']['events']} of "
                         f"{got['events']} events")
    return int(found.group(1)), got["events"] // passes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--tree", action="append", default=[], type=Path,
                    help="another copy of the code to count beside this one (repeatable)")
    ap.add_argument("--lane", action="store_true",
                    help="count the worker's events lane (bench_events_lane.py) instead of "
                    "Pipeline.feed_raw")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    trees = [ROOT, *[t.resolve() for t in args.tree]]
    jobs = [(t, p) for t in trees for p in (1, 2)]
    lane = None
    if args.lane:
        sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
        from bench_events_lane import fleet

        with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
            pickle.dump(fleet(args.runs, args.steps), f)
            lane = f.name
    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            got = dict(zip(jobs, pool.map(lambda j: count(j[0], args.runs, args.steps, j[1], lane),
                                          jobs)))
    finally:
        if lane is not None:
            os.unlink(lane)
    per_event = {}
    for t in trees:
        (one, n), (two, _) = got[(t, 1)], got[(t, 2)]
        per_event[t] = (two - one) / n
    what = "the events lane" if args.lane else "parse + core"
    print(f"fleet: {args.runs} runs x {args.steps} steps x 8 ranks: {got[(ROOT, 1)][1]} events; "
          f"instructions of one pass ({what}) per event")
    for t in trees:
        print(f"  {per_event[t]:10,.0f}  {per_event[t] / per_event[ROOT]:.3f}  {t}")


if __name__ == "__main__":
    main()

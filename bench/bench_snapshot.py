"""Incident snapshots: what a firing alert costs the worker's events lane to build.

A firing alert with the ``snapshot`` action carries the run's recent steps. The worker keeps
each step as the bytes it came in (``streams.snapshot.SnapshotRecorder.observe(event, raw)``)
and reads the metrics and batch ids of the steps a snapshot shows again from them
(``contract.events.kept_step_values``) when the alert fires, on the events lane.

Over the fleet of ``bench_fleet_replay.py`` (one run in four sends "NaN" for half its steps),
through the core with the built-in pack, this prints side by side in one run:

* per firing alert: ``attach_snapshot`` and the alert's JSON (what ``publish`` does), in CPU
  milliseconds, for the first ``--alerts`` alerts with a snapshot, each built once as it fires:
  by a recorder that keeps the steps it read again (``read_rows``: the alerts of a run come in
  bursts, and their snapshots show mostly the same steps) beside one that reads them again for
  every snapshot (``read_rows=0``);
* per kept step read again, in CPU microseconds, for the steps with numbers only and for those
  with non-finite spellings: ``kept_step_values`` beside ``parse_event`` of the same bytes
  (what reading a kept step cost before it had a decoder of its own, and what a step with
  spellings cost until it had one too), and the ratio.

    python bench/bench_snapshot.py [--runs 12] [--steps 400] [--alerts 60] [--repeats 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_fleet_replay import fleet_lines  # noqa: E402

from contract.events import kept_step_values, parse_event  # noqa: E402
from rules.loader import load_pack  # noqa: E402
from streams.processor import Pipeline, tune_gc  # noqa: E402
from streams.snapshot import SnapshotRecorder, attach_snapshot  # noqa: E402


def best(repeats: int, work) -> float:
    """The least CPU time of ``repeats`` calls of ``work``."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        work()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--alerts", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    lines = fleet_lines(args.runs, args.steps)
    tune_gc()
    pipe, recorder = Pipeline(load_pack("rlhf")), SnapshotRecorder(max_runs=10_000)
    unread = SnapshotRecorder(max_runs=10_000, read_rows=0)   # every snapshot reads its steps again
    firing, steps = [], []
    spent = {"kept read": 0.0, "each read again": 0.0}
    for raw in lines:
        event = parse_event(raw, 0.0)
        recorder.observe(event, raw)
        unread.observe(event, raw)
        if event.kind == "step":
            steps.append(raw)
        for alert in pipe.feed(event, event.ts):
            if alert.state == "firing" and "snapshot" in alert.actions and len(firing) < args.alerts:
                # as the worker builds it: once, when the alert fires (the two recorders in
                # turns, so that a drifting machine weighs on both alike)
                state = pipe.runs[alert.run_id]
                order = ((recorder, "kept read"), (unread, "each read again"))
                for rec, label in order if len(firing) % 2 else order[::-1]:
                    t = time.process_time()
                    attach_snapshot(alert, rec, state).to_json()
                    spent[label] += time.process_time() - t
                firing.append((alert, state))
    if not firing:
        sys.exit("no alert with a snapshot fired: use more steps")
    print(f"fleet: {args.runs} runs x {args.steps} steps, {len(lines)} events; "
          f"{len(firing)} firing alerts with a snapshot")
    print("snapshot + alert JSON, built when each alert fires, CPU ms per alert: steps read "
          f"once while among the last {recorder.read_rows} read: {spent['kept read'] / len(firing) * 1e3:.3f}; "
          f"each snapshot reading its steps again: {spent['each read again'] / len(firing) * 1e3:.3f}")

    spelt = [raw for raw in steps if b'"NaN"' in raw or b'nfinity"' in raw]
    plain = [raw for raw in steps if raw not in set(spelt)][:len(spelt) * 4 or 5000]
    print(f"one kept step read again, CPU us:      kept_step_values   parse_event   ratio")
    for label, rows in (("numbers only", plain), ("non-finite spellings", spelt)):
        if not rows:
            print(f"  {label:24s} (none in this fleet)")
            continue
        kept = best(args.repeats, lambda: [kept_step_values(r) for r in rows]) / len(rows)
        whole = best(args.repeats, lambda: [parse_event(r, 0.0) for r in rows]) / len(rows)
        print(f"  {label:24s} {kept * 1e6:14.1f} {whole * 1e6:13.1f} {kept / whole:8.2f}"
              f"   ({len(rows)} steps)")


if __name__ == "__main__":
    main()

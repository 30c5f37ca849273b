"""Writing and reading the alerts of a fleet as JSON, the ways side by side.

Replays the fleet of ``bench_fleet_replay.py`` through the core with the worker's snapshot
recorder, attaches each firing alert's snapshot as the worker does before publishing it
(``streams.snapshot.attach_snapshot``), then times, per alert, in CPU microseconds (best of
``--repeats`` passes over all the alerts, the ways taking turns alert by alert):

* ``model_dump`` + ``strict_json`` (``json.dumps`` of the dump, walked for non-finite values
  when it refuses one): how ``Alert.to_json`` wrote alerts before;
* ``model_dump_json`` (pydantic's serializer in Rust, ``ser_json_inf_nan="strings"``): how it
  writes them now (``Alert.to_json``);
* an incident as ``RedisIncidents.save`` writes it: ``json.dumps`` of the record (the way
  before) and ``pydantic_core.to_json`` (now), with the incident built by ``make_incident``.

Every alert's two texts are checked to read back (``json.loads``) as the same value; the run
stops with the first that does not. Prints the figures for all alerts and for those carrying a
snapshot, and the ratios.

    python bench/bench_alert_json.py [--runs 12] [--steps 400] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_fleet_replay import fleet_lines  # noqa: E402

from alerts.incidents import make_incident  # noqa: E402
from contract.alert import Alert  # noqa: E402
from contract.events import parse_event, record_json  # noqa: E402
from rules.loader import load_pack  # noqa: E402
from streams.processor import Pipeline, tune_gc  # noqa: E402
from streams.snapshot import SnapshotRecorder, attach_snapshot  # noqa: E402


def fleet_alerts(runs: int, steps: int) -> list[Alert]:
    pipe = Pipeline(load_pack("rlhf"))
    recorder = SnapshotRecorder()
    out = []
    for raw in fleet_lines(runs, steps):
        ev = parse_event(raw, 0.0)
        recorder.observe(ev)
        for a in pipe.feed(ev, ev.ts):
            out.append(attach_snapshot(a, recorder, pipe.runs.get(a.run_id)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    alerts = fleet_alerts(args.runs, args.steps)
    if not alerts:
        raise SystemExit(f"the fleet of {args.runs} runs x {args.steps} steps raised no alert: "
                         "nothing to time (more --runs or --steps)")
    tune_gc()
    snap = [("snapshot" in (a.model_extra or {})) for a in alerts]
    incidents = [make_incident(a.model_copy(update={"snapshot": None}), (a.model_extra or {}).get("snapshot"),
                               0.0, ["pause"]) for a in alerts]
    for a in alerts:    # the same value, whichever way it was written
        old, new = a.to_json_standard(), a.to_json()
        if json.loads(old) != json.loads(new):
            raise SystemExit(f"alert {a.rule} of {a.run_id} at step {a.step}: the two texts differ")
    for inc in incidents:
        if json.loads(json.dumps(inc, allow_nan=False)) != json.loads(record_json(inc)):
            raise SystemExit(f"incident {inc['id']}: the two texts differ")
    ways = {"alert: model_dump + strict_json (before)": lambda i: alerts[i].to_json_standard(),
            "alert: model_dump_json (now)": lambda i: alerts[i].to_json(),
            "incident: json.dumps (before)": lambda i: json.dumps(incidents[i], allow_nan=False),
            "incident: pydantic_core.to_json (now)": lambda i: record_json(incidents[i])}
    best = {w: [math.inf] * len(alerts) for w in ways}
    clock = time.process_time
    for _ in range(args.repeats):
        for i in range(len(alerts)):
            for name, f in ways.items():
                t = clock()
                for _ in range(5):
                    f(i)
                best[name][i] = min(best[name][i], (clock() - t) / 5)
    n_snap = sum(snap)
    size = sum(len(alerts[i].to_json()) for i in range(len(alerts)) if snap[i]) / max(1, n_snap)
    print(f"{len(alerts)} alerts of {args.runs} runs, {n_snap} with a snapshot "
          f"({size / 1000:.1f} kB of JSON on average)")
    print(f"{'CPU microseconds per alert':44s} {'all':>9s} {'snapshot':>9s}")
    means = {}
    for name in ways:
        all_ = 1e6 * sum(best[name]) / len(alerts)
        with_ = 1e6 * sum(t for t, s in zip(best[name], snap) if s) / max(1, n_snap)
        means[name] = (all_, with_)
        print(f"{name:44s} {all_:9.1f} {with_:9.1f}")
    names = list(ways)
    for before, now in ((names[0], names[1]), (names[2], names[3])):
        print(f"{now.split(':')[0]}: before / now {means[before][0] / means[now][0]:5.1f}x "
              f"(with a snapshot {means[before][1] / means[now][1]:5.1f}x)")


if __name__ == "__main__":
    main()

"""Detection must not change: record every alert of a fixed set of runs, compare with a record.

Runs the processor over

* the fleet of ``bench/bench_fleet_replay.py`` (12 interleaved 8-rank PPO/GRPO runs);
* the same fleet with each run's state written out and read back (``to_state``, the worker's
  table codec ``streams.state_codec``, ``load_state``) every few hundred events, as a restarted
  worker would;
* every labelled file of the real logs (``../shared/real-logs``) through the backtest's replay
  path (``rlwatch.backtest.replay_labelled``);
* simulated runs: every fault of the simulator (its first algorithm, one seed, logging every
  step; a few logging every 5 steps) and healthy PPO, GRPO and DPO runs;

and writes every alert (all its fields) as JSON lines. ``--against FILE`` compares with an
earlier record and prints the first differences (exit status 1 when anything differs).

    python bench/check_same_alerts.py --out /tmp/alerts-before.jsonl
    python bench/check_same_alerts.py --out /tmp/alerts-after.jsonl --against /tmp/alerts-before.jsonl

``--pack FILE`` reads a copy of the pack (to compare code changes while the built-in pack is
being tuned); by default the built-in ``rlhf``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REAL_LOGS = HERE.parent.parent / "shared" / "real-logs"
PACK = "rlhf"


def _record(case: str, alerts) -> list[str]:
    out = []
    for a in alerts:
        d = a.model_dump()
        out.append(json.dumps({"case": case, **d}, sort_keys=True, default=repr))
    return out


def fleet_case(roundtrip: int = 0) -> list[str]:
    from bench_fleet_replay import fleet_lines
    try:    # the events as the worker reads them (a plain step as a WireStep)
        from contract.events import read_event as parse_event
    except ImportError:     # a tree from before read_event
        from contract.events import parse_event
    from rules.loader import load_pack
    from streams.processor import Pipeline
    from streams.state_codec import decode_state, encode_state

    pipe = Pipeline(load_pack(PACK))
    alerts = []
    lines = fleet_lines(12, 400)
    now = parse_event(lines[-1], 0.0).ts     # (in time order: no event's ts is replaced)
    for i, raw in enumerate(lines):
        if hasattr(pipe, "feed_raw"):     # as the worker takes events
            alerts += pipe.feed_raw(raw, now)
        else:
            ev = parse_event(raw, 0.0)
            alerts += pipe.feed(ev, ev.ts)
        if roundtrip and i % roundtrip == roundtrip - 1:
            st = pipe.runs[json.loads(raw)["run_id"]]
            data = decode_state(encode_state(st.to_state(packed=True)))   # as the worker's table does
            pipe.runs[st.run_id] = pipe.processor.load_state(data)
    return _record(f"fleet{'-roundtrip' if roundtrip else ''}", alerts)


def real_case(name: str) -> list[str]:
    from rlwatch.backtest import load_labels, replay_labelled
    from rules.loader import load_pack

    label = next(lab for lab in load_labels(REAL_LOGS) if lab.run == name)
    r = replay_labelled(REAL_LOGS, label, load_pack(PACK))
    return _record(f"real:{name}", r.alerts)


def sim_case(spec: tuple) -> list[str]:
    from rlwatch.backtest import SimCase, run_sim
    from rules.loader import load_pack

    fault, algo, seed, every = spec
    _, alerts, _, _ = run_sim(SimCase(fault, algo, seed, every), load_pack(PACK))
    return _record(f"sim:{fault}:{algo}:{seed}:{every}", alerts)


def cases() -> list[tuple]:
    from producers.sim import FAULTS
    from rlwatch.backtest import load_labels

    out: list[tuple] = [("fleet", 0), ("fleet", 301)]
    out += [("real", lab.run) for lab in load_labels(REAL_LOGS)]
    for fid, f in FAULTS.items():
        if fid == "healthy":
            continue
        out.append(("sim", (fid, f.algos[0], 1001, 1)))
    for algo in ("ppo", "grpo", "dpo"):
        out.append(("sim", ("healthy", algo, 1002, 1)))
    for fid in ("kl_above_target", "entropy_collapse", "reward_collapse", "nan_inf", "rank_outlier",
                "category_imbalance", "prompt_extreme_reward"):
        out.append(("sim", (fid, FAULTS[fid].algos[0], 1003, 5)))
    out.append(("sim", ("nan_inf:skipped_step", "ppo", 1004, 1)))
    return out


def run(case: tuple) -> list[str]:
    kind, arg = case
    if kind == "fleet":
        return fleet_case(arg)
    if kind == "real":
        return real_case(arg)
    return sim_case(arg)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--against")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pack", default="rlhf")
    args = ap.parse_args()
    global PACK
    PACK = args.pack
    # everything imported before the workers fork: an edit to the tree during a check is not seen
    import bench_fleet_replay  # noqa: F401
    import rlwatch.backtest  # noqa: F401
    import rlwatch.replay  # noqa: F401
    import streams.processor  # noqa: F401
    from rules.loader import load_pack
    load_pack(PACK)
    t = time.time()
    todo = cases()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        results = list(ex.map(run, todo))
    lines = [line for res in results for line in res]
    Path(args.out).write_text("".join(line + "\n" for line in lines))
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    per = {}
    for line in lines:
        c = json.loads(line)["case"]
        per[c] = per.get(c, 0) + 1
    print(f"{len(todo)} cases, {len(lines)} alerts, sha256 {digest}, {time.time() - t:.0f} s")
    if not args.against:
        return 0
    old = Path(args.against).read_text().splitlines()
    if old == lines:
        print("SAME: every alert identical")
        return 0
    print(f"DIFFERENT: {len(old)} alerts before, {len(lines)} now")
    shown = 0
    by_case_old: dict[str, list[str]] = {}
    by_case_new: dict[str, list[str]] = {}
    for line in old:
        by_case_old.setdefault(json.loads(line)["case"], []).append(line)
    for line in lines:
        by_case_new.setdefault(json.loads(line)["case"], []).append(line)
    for c in sorted(set(by_case_old) | set(by_case_new)):
        a, b = by_case_old.get(c, []), by_case_new.get(c, [])
        if a == b:
            continue
        print(f"  {c}: {len(a)} -> {len(b)} alerts")
        for x, y in zip(a + [None] * len(b), b + [None] * len(a)):
            if x != y and shown < 12:
                shown += 1
                print(f"    before: {x}\n    after:  {y}")
                break
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

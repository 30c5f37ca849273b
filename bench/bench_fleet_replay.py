"""A fleet through the whole core: parse + processor + the full built-in pack, per core.

Simulates a fleet of interleaved PPO/GRPO runs (8 ranks each, about 32 metrics, per-sample
dists and groups on rank 0, samples and checkpoints), writes it as one JSON Lines file, and
times these readers of that same file in one run:

* a bare ``json.loads`` loop (the parse floor: no reader of JSON can go faster in Python);
* a simple reference detector: plain Python, dicts and deques, 17 rules (below, about 200 lines);
* rlwatch: ``Pipeline.feed_raw`` (the events as the worker reads them) with the built-in pack;
* the same, with each block of ``--batch`` events (20,000) taken a run at a time, as the
  worker's events lane takes a fetched batch: "rlwatch core by run" (the ratio to the pass in
  the file's order is what keeping a run's state in the caches for several steps gives);
* when the native core is in use (streams._native), the same rlwatch pass with the pure Python
  core (``streams.signals.PyBank``, and the Python per-sample statistics, text scores and
  compiled conditions): "rlwatch core (pure)".

The readers take the file in slices, in turns, each slice timed on its own, so that a
shared machine whose speed drifts during the run weighs on all of them alike. Prints events
per CPU second of each and rlwatch's ratios to the other two. ``--profile`` adds a cProfile
top 15 of the rlwatch pass; ``--by-kind``, the mean cost and the share of each kind of event
(a routine step of a rank other than 0, a step of rank 0, samples...) in one more pass. The
garbage collector is set as the worker sets it (``streams.processor.tune_gc``) for all the
readers; ``--default-gc`` keeps Python's defaults.

    python bench/bench_fleet_replay.py [--runs 12] [--steps 400] [--batch 20000] [--profile] [--by-kind]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

from contract.events import dump_event

try:    # the events as the worker reads them (a plain step as a WireStep)
    from contract.events import read_event
except ImportError:     # a tree from before read_event
    from contract.events import parse_event as read_event
from producers.sim import SimConfig, simulate
from rules.loader import load_pack
from streams.batch_lane import LaneBatch
from streams.processor import Pipeline

try:
    from streams.signals import CORE, PyBank
except ImportError:   # a tree from before the native bank
    CORE, PyBank = "pure", None

try:
    from streams.processor import tune_gc
except ImportError:   # a tree from before tune_gc (to measure the before figure)
    tune_gc = None

FAULTS = ("healthy", "kl_above_target", "entropy_collapse", "reward_collapse", "nan_inf",
          "length_hacking", "grad_norm_anomaly", "rank_outlier", "value_shift", "healthy",
          "clip_frac_high", "truncation_rising")


def fleet_lines(runs: int, steps: int) -> list[bytes]:
    """Events of ``runs`` simulated runs, interleaved by time, as JSON lines."""
    events = []
    for i in range(runs):
        cfg = SimConfig(run_id=f"fleet-{i:02d}", algo="grpo" if i % 4 == 3 else "ppo",
                        fault=FAULTS[i % len(FAULTS)], onset=steps // 2, seed=100 + i,
                        world_size=8, samples_every=10, checkpoint_every=50)
        for ev in simulate(cfg, steps):
            ev["ts"] = ev["ts"] + 0.013 * i      # runs started at slightly different times
            events.append(ev)
    events.sort(key=lambda e: e["ts"])
    return [dump_event(e) for e in events]


# -- the reference detector --------------------------------------------------------------------

def _median(xs) -> float:
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class _Run:
    def __init__(self):
        self.hist: dict[str, deque] = {}
        self.start: dict[str, list] = {}
        self.count: dict[str, int] = {}
        self.firing: set[str] = set()
        self.ranks: dict[int, dict] = {}
        self.last_step = -1


class ReferenceDetector:
    """17 plain rules on plain dicts: what a careful engineer writes in an afternoon."""

    WINDOW = 50

    def __init__(self, kl_target: float = 0.05):
        self.kl_target = kl_target
        self.runs: dict[str, _Run] = {}
        self.alerts = 0

    def _push(self, r: _Run, name: str, x: float) -> deque:
        h = r.hist.get(name)
        if h is None:
            h = r.hist[name] = deque(maxlen=self.WINDOW)
            r.start[name] = []
        if len(r.start[name]) < 20:
            r.start[name].append(x)
        h.append(x)
        return h

    def _fire(self, r: _Run, rule: str, cond: bool, need: int = 1) -> None:
        c = r.count.get(rule, 0) + 1 if cond else 0
        r.count[rule] = c
        if c >= need and rule not in r.firing:
            r.firing.add(rule)
            self.alerts += 1
        elif not cond and rule in r.firing:
            r.firing.discard(rule)

    def _ratio_to_start(self, r: _Run, name: str, h: deque) -> float:
        st = r.start.get(name)
        if not st or len(st) < 20 or len(h) < 5:
            return math.nan
        base = _median(st)
        return _median(list(h)[-5:]) / base if base else math.nan

    def feed(self, ev: dict) -> None:
        if ev.get("kind") != "step":
            return
        r = self.runs.get(ev["run_id"])
        if r is None:
            r = self.runs[ev["run_id"]] = _Run()
        m = ev.get("metrics") or {}
        rank = ev.get("rank", 0)
        # 1. NaN/Inf on any rank
        self._fire(r, f"nan/{rank}", any(isinstance(v, str) or not math.isfinite(v) for v in m.values()))
        if (ev.get("world_size") or 1) > 1:
            rs = r.ranks.setdefault(ev["step"], {})
            rs[rank] = (m.get("grad_norm/actor"), (ev.get("hashes") or {}).get("actor"))
            if len(rs) >= ev["world_size"]:
                del r.ranks[ev["step"]]
                g = [v[0] for v in rs.values() if isinstance(v[0], float)]
                med = _median(g) if g else math.nan
                # 2. rank outlier, 3. hash mismatch
                self._fire(r, "rank_outlier", bool(g) and med > 0 and max(g) / med > 3)
                h = {v[1] for v in rs.values() if v[1]}
                self._fire(r, "hash_mismatch", len(h) > 1)
            for s in [s for s in r.ranks if s < ev["step"] - 8]:
                del r.ranks[s]
        if rank != 0 or ev["step"] <= r.last_step:
            return
        r.last_step = ev["step"]
        f = {k: v for k, v in m.items() if isinstance(v, float) and math.isfinite(v)}
        t = self.kl_target
        if "kl/mean" in f:
            h = self._push(r, "kl/mean", f["kl/mean"])
            last3 = _median(list(h)[-3:])
            self._fire(r, "kl_yellow", f["kl/mean"] > 1.5 * t, 5)          # 4
            self._fire(r, "kl_red", last3 > 2.5 * t)                         # 5
            self._fire(r, "kl_black", last3 > 0.2)                           # 6
            self._fire(r, "kl_zero", len(h) > 30 and max(list(h)[-5:]) < 1e-6
                       and _median(h) > 1e-3)                                # 7
        if "entropy/mean" in f:
            h = self._push(r, "entropy/mean", f["entropy/mean"])
            self._fire(r, "entropy_collapse", self._ratio_to_start(r, "entropy/mean", h) < 0.2, 3)  # 8
        if "reward/mean" in f:
            h = self._push(r, "reward/mean", f["reward/mean"])
            if len(h) >= 30:
                prev = list(h)[:-1]
                mu = sum(prev) / len(prev)
                sd = math.sqrt(sum((x - mu) ** 2 for x in prev) / (len(prev) - 1)) or 1e-12
                self._fire(r, "reward_spike", (f["reward/mean"] - mu) / sd > 5)    # 9
                n = len(h)
                tm = (n - 1) / 2
                xm = sum(h) / n
                slope = sum((i - tm) * (x - xm) for i, x in enumerate(h)) / (n * (n * n - 1) / 12)
                self._fire(r, "reward_degradation", slope * n / max(abs(xm), 1e-12) < -0.2, 10)  # 10
        if "reward/std" in f:
            h = self._push(r, "reward/std", f["reward/std"])
            self._fire(r, "reward_collapse", self._ratio_to_start(r, "reward/std", h) < 0.1, 5)  # 11
        for name, rule in (("grad_norm/actor", "grad_norm"), ("loss/value", "value_loss"),
                           ("gpu/mem_allocated_gb", "gpu_memory")):
            if name in f:
                h = self._push(r, name, f[name])
                if len(h) >= 20:
                    med = _median(list(h)[:-1])
                    limit = {"grad_norm": 10, "value_loss": 10, "gpu_memory": 1.25}[rule]
                    self._fire(r, rule, med > 0 and f[name] / med > limit, 2)   # 12, 13, 14
        if "ppo/clip_frac" in f:
            self._fire(r, "clip_frac_high", f["ppo/clip_frac"] > 0.6)             # 15
        if "response/truncated_frac" in f:
            self._fire(r, "truncation", f["response/truncated_frac"] > 0.5, 3)    # 16
        if "response/length_mean" in f:
            h = self._push(r, "response/length_mean", f["response/length_mean"])
            self._fire(r, "length_hacking",
                       self._ratio_to_start(r, "response/length_mean", h) > 1.3, 10)  # 17


# -- timing --------------------------------------------------------------------------------------

def by_run(lines: list[bytes], block: int) -> list[bytes]:
    """``lines`` with the events of each block of ``block`` in the order the worker's events
    lane takes a fetched batch (``LaneBatch.by_key``, the record key being the run): a run at
    a time, each run's in order, the runs in the order they first come."""
    out: list[bytes] = []
    for i in range(0, len(lines), max(1, block)):
        part = lines[i:i + block]
        batch = LaneBatch([SimpleNamespace(key=read_event(raw, 0.0).run_id) for raw in part],
                          None, "", {}, 0)
        out += [part[j] for j in batch.by_key()]
    return out


def kind_of(raw: bytes, routine: bool) -> str:
    """The kind of an event for :func:`by_kind` (read again, outside the timed call)."""
    if routine:
        return "routine rank step"
    ev = read_event(raw, 0.0)
    if ev.kind == "step":
        return "rank-0 step" if ev.rank == 0 else "other rank step"
    return f"{ev.kind} (rank {ev.rank})" if ev.kind == "samples" else ev.kind


def by_kind(lines: list[bytes], pack, now: float) -> str:
    """One ``Pipeline.feed_raw`` pass over ``lines``, each event timed on its own: per kind of
    event (a routine step of a rank other than 0, which ``RunState.rank_step`` takes; a step
    of rank 0, which runs the step rules; any other step, e.g. one with a non-finite value;
    samples; the rest), how many, the mean CPU microseconds and the share of the pass. Where a
    faster core has to start: the timing adds about a microsecond to each event."""
    pipe = Pipeline(pack)
    clock = time.process_time_ns
    count: dict[str, int] = {}
    spent: dict[str, int] = {}
    for raw in lines:
        before = pipe.routine
        t = clock()
        pipe.feed_raw(raw, now)
        dt = clock() - t
        k = kind_of(raw, pipe.routine > before)
        count[k] = count.get(k, 0) + 1
        spent[k] = spent.get(k, 0) + dt
    total = sum(spent.values()) or 1
    out = [f"{'kind of event':22s} {'events':>8s} {'mean us':>9s} {'share':>7s}"]
    for k in sorted(spent, key=spent.get, reverse=True):
        out.append(f"{k:22s} {count[k]:8d} {spent[k] / count[k] / 1000:9.1f} {100 * spent[k] / total:6.1f}%")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slices", type=int, default=40,
                    help="slices of the file the readers take in turns (each timed on its own)")
    ap.add_argument("--batch", type=int, default=20_000,
                    help="events per block for 'rlwatch core by run' (the worker's events lane "
                         "got batches of about 19,500 events of the bench fleet when behind)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--by-kind", action="store_true",
                    help="also time each event of one more rlwatch pass, and print the mean and "
                         "the share of the pass per kind of event")
    ap.add_argument("--default-gc", action="store_true",
                    help="keep Python's default garbage-collector settings")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.jsonl"
        path.write_bytes(b"\n".join(fleet_lines(args.runs, args.steps)) + b"\n")
        lines = path.read_bytes().splitlines()
    n = len(lines)
    pack = load_pack("rlhf")
    if not args.default_gc and tune_gc is not None:
        tune_gc()   # what the worker does after start-up; applies to all the readers alike
    alerts: dict[str, int] = {}

    def bare():
        loads = json.loads

        def feed(chunk):
            for raw in chunk:
                loads(raw)
        return feed, lambda: None

    def reference():
        det = ReferenceDetector()

        def feed(chunk):
            for raw in chunk:
                det.feed(json.loads(raw))
        return feed, lambda: det.alerts

    now = read_event(lines[-1], 0.0).ts     # (the fleet's events are in time order)

    def rlwatch():
        pipe = Pipeline(pack)
        fired = [0]

        def feed(chunk):
            for raw in chunk:
                fired[0] += len(pipe.feed_raw(raw, now))

        def feed_before(chunk):     # a tree from before feed_raw
            for raw in chunk:
                ev = read_event(raw, 0.0)
                fired[0] += len(pipe.feed(ev, ev.ts))
        return (feed if hasattr(pipe, "feed_raw") else feed_before), lambda: fired[0]

    def rlwatch_pure():
        """The same pass with the pure Python core (streams.signals.PyBank, and the Python
        spearman, moments and compiled conditions), side by side with the native one: the
        module's names are swapped for each of its slices and put back after."""
        import streams.run

        pure = {"Bank": PyBank, "spearman": getattr(streams.run, "py_spearman", None),
                "Moments": getattr(streams.run, "_Moments", None),
                "Series": getattr(streams.run, "PySeries", None),
                "update_group": getattr(streams.run, "py_update_group", None),
                "repetition_score": getattr(__import__("streams.text").text, "py_repetition_score", None),
                "_native_join": None, "_native_scan": None, "_native_compare_call": None,
                "read_rank_step": None}
        saved = {k: getattr(streams.run, k) for k in pure if hasattr(streams.run, k)}
        import streams.processor
        # the native reader, called straight by feed_raw (a tree from before: through streams.run)
        reader = getattr(streams.processor, "read_routine", None)
        inner, done = rlwatch()

        def feed(chunk):
            for k in saved:
                if pure[k] is not None or k.startswith("_native") or k == "read_rank_step":
                    setattr(streams.run, k, pure[k])
            if reader is not None:
                streams.processor.read_routine = lambda raw: None
            try:
                inner(chunk)
            finally:
                for k, v in saved.items():
                    setattr(streams.run, k, v)
                if reader is not None:
                    streams.processor.read_routine = reader
        return feed, done

    size = max(1, -(-n // max(1, args.slices)))
    chunks = [lines[i:i + size] for i in range(0, n, size)]
    # the same events, each block of --batch taken a run at a time, as the worker's events lane
    # takes a fetched batch (streams.batch_lane.LaneBatch.by_key), cut into slices of the same size
    grouped = by_run(lines, args.batch) if hasattr(LaneBatch, "by_key") else []  # (an older tree)
    grouped_chunks = [grouped[i:i + size] for i in range(0, n, size)]

    def rlwatch_by_run():
        inner, done = rlwatch()
        mine = iter(grouped_chunks)

        def feed(_chunk):       # its own slice of the same size, in turn with the others
            inner(next(mine))
        return feed, done

    readers = (("json.loads loop", bare), ("reference detector", reference), ("rlwatch core", rlwatch))
    if grouped:
        readers += (("rlwatch core by run", rlwatch_by_run),)
    if CORE == "native":
        readers += (("rlwatch core (pure)", rlwatch_pure),)
    # the readers take the file slice by slice, in turns (the order turning too), each slice
    # timed on its own: the machine's speed, which drifts on a shared host, is the same for
    # all of them; best total of --repeats passes
    best = {name: math.inf for name, _ in readers}
    clock = time.process_time
    for _ in range(args.repeats):
        made = [(name, *make()) for name, make in readers]
        spent = dict.fromkeys(best, 0.0)
        for k, chunk in enumerate(chunks):
            turn = made[k % len(made):] + made[:k % len(made)]
            for name, feed, _done in turn:
                t = clock()
                feed(chunk)
                spent[name] += clock() - t
        for name, _feed, done in made:
            best[name] = min(best[name], spent[name])
            alerts[name] = done()
    rates = {name: n / t for name, t in best.items()}
    sizes = [len(x) for x in lines]
    print(f"fleet: {args.runs} runs x {args.steps} steps x 8 ranks: {n} events, "
          f"{statistics.mean(sizes):.0f} bytes per event on average")
    print(f"{'reader':22s} {'events/s':>12s}")
    for name, rate in rates.items():
        print(f"{name:22s} {rate:12,.0f}")
    core = rates["rlwatch core"]
    print(f"rlwatch / json.loads floor:     {core / rates['json.loads loop']:.2f}")
    print(f"rlwatch / reference detector:   {core / rates['reference detector']:.2f}")
    if "rlwatch core by run" in rates:
        print(f"rlwatch by run / in order:      {rates['rlwatch core by run'] / core:.2f} "
              f"(blocks of {args.batch} events; alerts: {alerts['rlwatch core by run']} and "
              f"{alerts['rlwatch core']})")
    print(f"alerts: reference {alerts['reference detector']} state changes, "
          f"rlwatch {alerts['rlwatch core']} alerts")
    print(f"signal bank: {CORE}")
    if "rlwatch core (pure)" in rates:
        print(f"rlwatch native / pure bank:     {core / rates['rlwatch core (pure)']:.2f} "
              f"(alerts: native {alerts['rlwatch core']}, pure {alerts['rlwatch core (pure)']})")

    if args.by_kind:
        print(by_kind(lines, pack, now))

    if args.profile:
        prof = cProfile.Profile()
        feed, _done = rlwatch()
        prof.enable()
        feed(lines)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())


if __name__ == "__main__":
    main()

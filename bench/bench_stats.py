"""Cost of the streaming statistics (``python bench/bench_stats.py``).

1. Cost per ``update`` (and per ``get``) of each statistic, in ns.
2. Cost, per step event of 30 metrics, of the statistics the built-in rules need, next to the
   cost of merely ``json.loads``-parsing the same events (measured in the same run, interleaved,
   best of several rounds):

   * every metric: EMA, RollingMean(50) + RollingStd(50), RobustZ(100), RollingMedian(100)
   * 5 metrics:    MannKendall(50), ``get()`` every step
   * 3 metrics:    RelativeDrop(200)
   * 2 metrics:    Flatline(500)
   * 1 metric:     Autocorrelation(200), ``get()`` every 10 steps

   Two variants: "update only" (plus the ``get()`` calls listed above) and "update + get all"
   (every statistic read every step, as if each had a rule evaluated each step).

Times are CPU time of the benchmark process (``time.process_time_ns``), best of the rounds.

Options: ``--events N`` (default 3000), ``--rounds R`` (default 5), ``--quick``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from streams.stats import (
    EMA,
    Autocorrelation,
    Cusum,
    DDSketch,
    Flatline,
    MannKendall,
    PageHinkley,
    RelativeDrop,
    RelativeRise,
    RobustZ,
    RollingMAD,
    RollingMax,
    RollingMean,
    RollingMedian,
    RollingMin,
    RollingQuantile,
    RollingStd,
    RollingVar,
    SignFlipRate,
    WarmupBaseline,
    ZScore,
)

N_METRICS = 30

# CPU time of this process: on a shared machine it is far steadier than wall-clock time (time
# spent descheduled is not counted), and it is what bounds throughput on a dedicated core.
_clock = time.process_time_ns


def _series(n: int, seed: int = 0) -> list[float]:
    rnd = random.Random(seed)
    level = 1.0
    out = []
    for _ in range(n):
        level += rnd.gauss(0.0, 0.01)
        out.append(level + rnd.gauss(0.0, 0.1))
    return out


def per_update_table(n: int) -> list[tuple[str, float, float]]:
    makers = [
        ("EMA(alpha=0.1)", lambda: EMA(alpha=0.1)),
        ("RollingMean(50)", lambda: RollingMean(50)),
        ("RollingVar(50)", lambda: RollingVar(50)),
        ("RollingStd(50)", lambda: RollingStd(50)),
        ("RollingMin(50)", lambda: RollingMin(50)),
        ("RollingMax(50)", lambda: RollingMax(50)),
        ("RollingMedian(100)", lambda: RollingMedian(100)),
        ("RollingQuantile(100, 0.9)", lambda: RollingQuantile(100, 0.9)),
        ("RollingMAD(100)", lambda: RollingMAD(100)),
        ("RobustZ(100)", lambda: RobustZ(100)),
        ("ZScore(100)", lambda: ZScore(100)),
        ("WarmupBaseline(100)", lambda: WarmupBaseline(100)),
        ("DDSketch(0.01)", lambda: DDSketch(0.01)),
        ("MannKendall(50)", lambda: MannKendall(50)),
        ("PageHinkley()", lambda: PageHinkley()),
        ("Cusum()", lambda: Cusum()),
        ("RelativeDrop(200)", lambda: RelativeDrop(200)),
        ("RelativeRise(200)", lambda: RelativeRise(200)),
        ("Flatline(500)", lambda: Flatline(500)),
        ("Autocorrelation(200)", lambda: Autocorrelation(200, 50)),
        ("SignFlipRate(50)", lambda: SignFlipRate(50)),
    ]
    xs = _series(n, seed=1)
    rows = []
    for name, make in makers:
        best_u = best_g = math.inf
        for _ in range(3):
            st = make()
            upd = st.update
            gc.disable()
            t0 = _clock()
            for x in xs:
                upd(x)
            t1 = _clock()
            gc.enable()
            best_u = min(best_u, (t1 - t0) / n)
            # get() after each update (caches are invalidated by the update)
            st = make()
            upd = st.update
            get = st.get
            m = min(n, 2000)
            for x in xs[:m]:
                upd(x)
            t0 = _clock()
            for x in xs[:m]:
                upd(x)
                get()
            t1 = _clock()
            best_g = min(best_g, (t1 - t0) / m - best_u)
        rows.append((name, best_u, max(best_g, 0.0)))
    return rows


class MetricStats:
    """The statistics the built-in rules keep for one metric."""

    __slots__ = ("ema", "mean", "std", "rz", "med", "mk", "drop", "flat", "ac", "all_gets")

    def __init__(self, i: int):
        self.ema = EMA(alpha=0.1)
        self.mean = RollingMean(50)
        self.std = RollingStd(50)
        self.rz = RobustZ(100)
        self.med = RollingMedian(100)
        self.mk = MannKendall(50) if i < 5 else None
        self.drop = RelativeDrop(200) if i < 3 else None
        self.flat = Flatline(500) if i < 2 else None
        self.ac = Autocorrelation(200, 50) if i == 0 else None


def make_events(n: int) -> list[str]:
    rnd = random.Random(7)
    names = [f"metric_{i:02d}/value" for i in range(N_METRICS)]
    levels = [rnd.uniform(0.1, 10.0) for _ in range(N_METRICS)]
    out = []
    for step in range(n):
        metrics = {}
        for j, name in enumerate(names):
            levels[j] += rnd.gauss(0.0, 0.01)
            metrics[name] = levels[j] + rnd.gauss(0.0, 0.1)
        ev = {
            "type": "step",
            "run_id": "run-bench",
            "step": step,
            "rank": 0,
            "ts": 1_700_000_000.0 + step,
            "metrics": metrics,
        }
        out.append(json.dumps(ev))
    return out


def parse_only(raw: list[str]) -> float:
    loads = json.loads
    t0 = _clock()
    for r in raw:
        loads(r)
    return (_clock() - t0) / len(raw) / 1000.0


def stats_loop(parsed: list[dict], table: dict[str, MetricStats], read_all: bool) -> float:
    t0 = _clock()
    for ev in parsed:
        step = ev["step"]
        for name, x in ev["metrics"].items():
            ms = table[name]
            ms.ema.update(x)
            ms.mean.update(x)
            ms.std.update(x)
            ms.rz.update(x)
            ms.med.update(x)
            if read_all:
                ms.ema.get()
                ms.mean.get()
                ms.std.get()
                ms.rz.get()
                ms.med.get()
            mk = ms.mk
            if mk is not None:
                mk.update(x)
                mk.get()
            if ms.drop is not None:
                ms.drop.update(x)
                if read_all:
                    ms.drop.get()
            if ms.flat is not None:
                ms.flat.update(x)
                if read_all:
                    ms.flat.get()
            ac = ms.ac
            if ac is not None:
                ac.update(x)
                if step % 10 == 0:
                    ac.get()
    return (_clock() - t0) / len(parsed) / 1000.0


def event_bench(n_events: int, rounds: int) -> None:
    warm = 600  # fills every window (the largest is 500)
    raw = make_events(warm + n_events)
    parsed = [json.loads(r) for r in raw]
    names = list(parsed[0]["metrics"])
    results: dict[str, list[float]] = {"parse": [], "upd": [], "all": []}
    for _ in range(rounds):
        for variant in ("upd", "all"):
            table = {name: MetricStats(i) for i, name in enumerate(names)}
            stats_loop(parsed[:warm], table, read_all=True)
            gc.collect()
            gc.disable()
            results[variant].append(stats_loop(parsed[warm:], table, variant == "all"))
            gc.enable()
        gc.collect()
        gc.disable()
        results["parse"].append(parse_only(raw[warm:]))
        gc.enable()
    p = min(results["parse"])
    u = min(results["upd"])
    a = min(results["all"])
    n_stats = 5 * N_METRICS + 5 + 3 + 2 + 1
    print()
    print(
        f"Per step event, {N_METRICS} metrics, {n_stats} statistic objects "
        f"({n_events} events after a {warm}-event warm-up, best of {rounds} rounds)"
    )
    print(f"  {'json.loads only':44s} {p:8.1f} us/event")
    print(
        f"  {'stats: update (+ MK get, AC get every 10)':44s} {u:8.1f} us/event"
        f"   ratio to parse {u / p:5.2f}x   -> {1e6 / u:9,.0f} events/s"
    )
    print(
        f"  {'stats: update + get() of every statistic':44s} {a:8.1f} us/event"
        f"   ratio to parse {a / p:5.2f}x   -> {1e6 / a:9,.0f} events/s"
    )
    print(
        f"  target: < 50 us/event (20,000 events/s): "
        f"update-only {'MET' if u < 50 else 'NOT met'}, "
        f"update+get-all {'MET' if a < 50 else 'NOT met'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--updates", type=int, default=20000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.events, args.rounds, args.updates = 500, 2, 3000
    print(f"Python {sys.version.split()[0]} on {sys.platform}")
    print()
    print(f"{'statistic':28s} {'update ns':>10s} {'+get ns':>10s}")
    for name, u, g in per_update_table(args.updates):
        print(f"{name:28s} {u:10.0f} {g:10.0f}")
    event_bench(args.events, args.rounds)


if __name__ == "__main__":
    main()

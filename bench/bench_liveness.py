"""The worker's liveness pass over a fleet that is only in its table (as right after a
restart): how long the event loop stands still at most while the pass restores the runs (a
brake raised meanwhile waits that long), beside the same pass in one go (no turns: the pass
before streams.liveness), measured in turns.

    python bench/bench_liveness.py [--runs 1250] [--steps 200] [--turns 3]

Prints, per way: the pass's wall time, the longest stall of the event loop during it, and the
runs restored.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.events import parse_event  # noqa: E402
from producers.sim import SimConfig, simulate  # noqa: E402
from rules.loader import load_pack  # noqa: E402
from streams.app import RunStates  # noqa: E402
from streams.liveness import LIVENESS_SLICE, liveness_pass  # noqa: E402
from streams.processor import Processor, tune_gc  # noqa: E402


def table_of(processor: Processor, runs: int, steps: int) -> dict[bytes, bytes]:
    """``runs`` 8-rank runs of ``steps`` steps each, written to a table as the worker does."""
    table: dict[bytes, bytes] = {}
    states = RunStates(table, processor, limit=runs + 1)
    events = list(simulate(SimConfig(run_id="tmpl", world_size=8, samples_every=10), steps))
    for i in range(runs):
        run_id = f"live-{i:05d}"
        st = states.get(run_id)
        for ev in events:
            ev = dict(ev, run_id=run_id)
            e = parse_event(ev, ev["ts"])
            processor.process(st, e, e.ts)
        states.touch(run_id)
    states.flush()
    states.forget()
    return table


async def one_pass(processor: Processor, table: dict, slice_: int, now: float) -> tuple[float, float, int]:
    states = RunStates(table, processor)
    stalls = [0.0]
    stop = asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0)
            t = time.perf_counter()
            stalls[0] = max(stalls[0], t - last)
            last = t

    task = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()

    async def alerted(st, alerts):
        pass

    done = await liveness_pass(states, processor, [k.decode() for k in table], now,
                               ttl_seconds=1e9, active=lambda: True, alerted=alerted,
                               expired=lambda run_id: None, slice_=slice_)
    wall = time.perf_counter() - t0
    stop.set()
    await task
    return wall, stalls[0], done.restored


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1250)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    processor = Processor(load_pack("rlhf"))
    t = time.perf_counter()
    table = table_of(processor, args.runs, args.steps)
    print(f"table: {args.runs} runs x {args.steps} steps x 8 ranks, "
          f"{sum(map(len, table.values())) / len(table) / 1024:.1f} KB per run "
          f"(built in {time.perf_counter() - t:.1f} s)")
    tune_gc()
    ways = ((f"in slices of {LIVENESS_SLICE} runs", LIVENESS_SLICE), ("in one go", len(table) + 1))
    best: dict[str, tuple] = {}
    for turn in range(args.turns):
        for name, slice_ in (ways if turn % 2 == 0 else ways[::-1]):
            got = asyncio.run(one_pass(processor, table, slice_, time.time()))
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    print(f"{'pass':24s} {'wall s':>8s} {'longest stall ms':>17s} {'restored':>9s}")
    for name, (wall, stall, restored) in best.items():
        print(f"{name:24s} {wall:8.2f} {stall * 1e3:17.1f} {restored:9d}")
    a, b = best[ways[0][0]], best[ways[1][0]]
    print(f"longest stall, slices / one go: {a[1] / b[1]:.3f}; wall: {a[0] / b[0]:.2f}")


if __name__ == "__main__":
    main()

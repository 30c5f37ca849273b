"""A run state's write and read in the worker's table: JSON text (earlier workers) beside
MessagePack (``streams.state_codec``), side by side in one run.

Builds the state of a real 8-rank run (simulated PPO or GRPO with dists, samples, checkpoints
and a fault that fires alerts, through the whole core with the built-in pack), then times
``encode`` (what ``RunStates._write`` does after ``to_state()``, before each offset commit and on
each alert; the worker's own write, ``to_state(packed=True)`` with each bank's MessagePack made
by the bank, is timed beside it) and ``decode`` (what a restarted worker does once per run before ``load_state``),
best of several repeats, in microseconds per state, with the sizes and the ratios.

    python bench/bench_state_codec.py [--algo ppo] [--steps 400] [--fault kl_above_target]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.events import parse_event  # noqa: E402
from producers.sim import SimConfig, simulate  # noqa: E402
from rules.loader import load_pack  # noqa: E402
from streams.processor import Pipeline  # noqa: E402
from streams.signals import CORE  # noqa: E402
from streams.state_codec import decode_state, encode_state  # noqa: E402


def real_state(algo: str, fault: str, steps: int):
    pipe = Pipeline(load_pack("rlhf"))
    cfg = SimConfig(run_id=f"codec-{algo}", algo=algo, fault=fault, onset=steps // 2, seed=7,
                    world_size=8, samples_every=10, checkpoint_every=50)
    alerts = []
    for raw in simulate(cfg, steps):
        ev = parse_event(raw, raw["ts"])
        alerts += pipe.feed(ev, ev.ts)
    return pipe, pipe.runs[cfg.run_id], alerts


def best_us(fn, repeat: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default="ppo", choices=("ppo", "grpo"))
    ap.add_argument("--fault", default="kl_above_target")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=50)
    args = ap.parse_args()

    pipe, st, alerts = real_state(args.algo, args.fault, args.steps)
    state = st.to_state()
    as_json = json.dumps(state, allow_nan=True).encode()
    as_msgpack = encode_state(state)
    assert json.loads(as_json) == json.loads(json.dumps(decode_state(as_msgpack), allow_nan=True))
    r, n = args.repeat, args.number
    to_state = best_us(st.to_state, r, n)
    enc_j = best_us(lambda: json.dumps(state, allow_nan=True).encode(), r, n)
    enc_m = best_us(lambda: encode_state(state), r, n)
    dec_j = best_us(lambda: json.loads(as_json), r, n)
    dec_m = best_us(lambda: decode_state(as_msgpack), r, n)
    restore = best_us(lambda: pipe.processor.load_state(decode_state(as_msgpack)), 3, 5)
    # the worker's write: each bank's MessagePack made by the bank itself (the same bytes)
    assert encode_state(st.to_state(packed=True)) == as_msgpack
    packed = best_us(lambda: encode_state(st.to_state(packed=True)), r, n)

    print(f"state of one {args.algo.upper()} run, 8 ranks, {args.steps} steps, fault {args.fault} "
          f"({len(alerts)} alert changes, {len(state['alerts'])} alert states), {CORE} core")
    print(f"  to_state() (the same for both formats): {to_state:9.1f} us")
    print(f"{'':20s} {'JSON (before)':>14s} {'MessagePack':>14s} {'JSON / msgpack':>15s}")
    print(f"{'bytes':20s} {len(as_json):14,d} {len(as_msgpack):14,d} "
          f"{len(as_json) / len(as_msgpack):15.2f}")
    print(f"{'encode, us':20s} {enc_j:14.1f} {enc_m:14.1f} {enc_j / enc_m:15.1f}")
    print(f"{'decode, us':20s} {dec_j:14.1f} {dec_m:14.1f} {dec_j / dec_m:15.1f}")
    print(f"{'encode + decode, us':20s} {enc_j + dec_j:14.1f} {enc_m + dec_m:14.1f} "
          f"{(enc_j + dec_j) / (enc_m + dec_m):15.1f}")
    print(f"{'a write, us':20s} {to_state + enc_j:14.1f} {to_state + enc_m:14.1f} "
          f"{(to_state + enc_j) / (to_state + enc_m):15.1f}   (to_state + encode)")
    print(f"  the worker's write, banks packed by the banks (to_state(packed=True) + encode): "
          f"{packed:.1f} us, {(to_state + enc_m) / packed:.2f} x quicker than to_state + encode "
          f"(the same {len(as_msgpack):,d} bytes)")
    print(f"  restoring a run once after a restart (decode + load_state): {restore:9.1f} us")


if __name__ == "__main__":
    main()

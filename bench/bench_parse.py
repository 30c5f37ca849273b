"""Strict parsers of step events side by side (how contract.events.parse_event was chosen).

Over the same simulated fleet events (rank 0 with 32 metrics, dists and groups; ranks 1-7 with
five metrics), in CPU microseconds per event:

* ``json.loads`` alone (no checks: the floor of the standard library);
* ``orjson.loads`` alone;
* pydantic ``model_validate_json`` of the contract's models (its strict validators included);
* msgspec ``decode`` into typed structs (when msgspec is installed; NaN spellings as strings
  need a union type, and the contract's reasons would have to be reworded);
* ``parse_event``: msgspec's checked decode of plain step events (orjson + type checks for the
  other plain events), pydantic only for what those do not pass.

    python bench/bench_parse.py [--steps N]
"""
from __future__ import annotations

import argparse
import json
import time

import orjson

from contract.events import StepEvent, dump_event, parse_event
from producers.sim import SimConfig, simulate


def per_event(fn, lines, repeats=3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for raw in lines:
            fn(raw)
        best = min(best, time.process_time() - t)
    return best / len(lines) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    lines = [dump_event(e) for e in simulate(SimConfig(run_id="p", seed=1, world_size=8), args.steps)
             if e["kind"] == "step"]
    rows = [("json.loads (no checks)", json.loads), ("orjson.loads (no checks)", orjson.loads),
            ("pydantic model_validate_json", lambda r: StepEvent.model_validate_json(r))]
    try:
        import msgspec

        class Step(msgspec.Struct, forbid_unknown_fields=False):
            schema: int
            kind: str
            run_id: str
            step: int
            rank: int = 0
            world_size: int | None = None
            ts: float | None = None
            tags: dict[str, str] = {}
            metrics: dict[str, float | str] = {}
            dists: dict[str, list[float | str]] = {}
            groups: dict[str, dict[str, float | str]] = {}
            hashes: dict[str, str] = {}
            batch_ids: list[str] = []

        decoder = msgspec.json.Decoder(Step)
        rows.append(("msgspec typed decode", decoder.decode))
    except ImportError:
        rows.append(("msgspec typed decode", None))
    rows.append(("parse_event (msgspec + checks)", lambda r: parse_event(r, 0.0)))
    print(f"{len(lines)} step events, {sum(map(len, lines)) / len(lines):.0f} bytes on average")
    for name, fn in rows:
        print(f"{name:32s} " + ("not installed" if fn is None else f"{per_event(fn, lines):8.1f} us"))


if __name__ == "__main__":
    main()

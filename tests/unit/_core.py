"""Shared helpers for the unit tests of the pure core (events, rules, processor, CLI, SDK).

The built-in pack is parsed once per test session (parsing its YAML takes a few tenths of a
second); ``Pack`` objects are never mutated by the code under test (overrides use
``model_copy``), so sharing it is safe.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

from contract.events import parse_event
from rules.loader import load_pack
from rules.schema import Pack

T0 = 1_700_000_000.0

#: RLWATCH_NATIVE=0 asks for the pure core: the tests of what only the native core does (its
#: comparisons with the pure one, the routine steps read from their bytes, a run's rank steps
#: taken at once) skip then, as ``needs_native`` marks them (CI builds and runs the native core)
PURE_ASKED = os.environ.get("RLWATCH_NATIVE", "1") == "0"
needs_native = pytest.mark.skipif(PURE_ASKED, reason="RLWATCH_NATIVE=0: the pure core was asked for")


@functools.lru_cache(maxsize=1)
def rlhf_pack() -> Pack:
    return load_pack("rlhf")


def only_rules(*ids: str) -> Pack:
    """The built-in pack reduced to some of its rules (same definitions, faster to run)."""
    pack = rlhf_pack()
    rules = [r for r in pack.rules if r.id in ids]
    assert {r.id for r in rules} == set(ids), f"unknown rule ids in {ids}"
    return pack.model_copy(update={"rules": rules})


def step_event(run_id: str, step: int, metrics: dict[str, Any], **extra):
    raw = {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "ts": T0 + step,
           "metrics": metrics}
    raw.update(extra)
    return parse_event(raw, T0 + step)


def checkpoint_event(run_id: str, step: int, path: str, ts: float | None = None):
    return parse_event({"schema": 1, "kind": "checkpoint", "run_id": run_id, "step": step,
                        "path": path, "ts": T0 + step if ts is None else ts}, T0)


def feed_series(pipeline, run_id: str, metric: str, values, start: int = 0, **extra) -> list:
    """Feed one metric's values as consecutive step events; every alert, in order."""
    out = []
    for i, v in enumerate(values):
        ev = step_event(run_id, start + i, {metric: v}, **extra)
        out += pipeline.feed(ev, ev.ts)
    return out


def firing(alerts, rule: str | None = None, severity: str | None = None) -> list:
    return [a for a in alerts if a.state == "firing"
            and (rule is None or a.rule == rule) and (severity is None or a.severity == severity)]


def resolved(alerts, rule: str | None = None, severity: str | None = None) -> list:
    return [a for a in alerts if a.state == "resolved"
            and (rule is None or a.rule == rule) and (severity is None or a.severity == severity)]

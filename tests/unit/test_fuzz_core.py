"""Fuzz of the decoder and the processor (hypothesis, derandomized; 1,000 examples of 10 events
each = 10,000 cases per test, so each test takes seconds). Hypothesis draws a seed per example;
the events come from plausible ones with up to three mutations from a pool of values that have
broken parsers before. Whatever arrives, the decoder returns an event or an EventError
with a one-line reason, and the processor either takes the event or rejects it with an
EventError; it never raises anything else, and every alert it emits is strict JSON."""

from __future__ import annotations

import json
import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.events import EventError, parse_event
from streams.processor import Pipeline
from tests.unit._core import T0, rlhf_pack

FAST = settings(max_examples=1_000, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
BATCH = 10    # events per example: 10,000 cases per test

NASTY = [None, True, False, 0, -1, 1, 7.0, 1.5, -0.0, 2**53, 2**53 + 1, 2**63, 2**64, 10**30,
         1e308, -1e308, 1e-320, math.nan, math.inf, -math.inf, "NaN", "Infinity", "-inf", "",
         "x y", "0.5", "\n", "é", "x" * 300, [], [1.0], [None], {}, {"a": 1.0}, {"a": "b"},
         {"a": {"b": 1}}, {"": math.nan}]
FIELDS = ["schema", "kind", "run_id", "step", "rank", "world_size", "ts", "tags", "incarnation",
          "metrics", "dists", "groups", "hashes", "batch_ids", "samples", "path", "extra"]
METRICS = ["kl/mean", "reward/mean", "entropy/mean", "loss/value", "grad_norm/actor",
           "ppo/clip_frac", "reward/std", "response/length_mean", "gpu/mem_allocated_gb"]


def event_from(rnd) -> dict:
    """A plausible event of a random kind, then up to three mutations from a pool of values
    that have broken parsers before (wrong types, limits, non-finite numbers, odd names)."""
    kind = rnd.choice(["step"] * 6 + ["samples", "checkpoint", "heartbeat"])
    ev = {"schema": 1, "kind": kind, "run_id": rnd.choice(["a", "b", "c"]),
          "step": rnd.choice([rnd.randrange(0, 50), rnd.randrange(0, 2**40)]),
          "rank": rnd.randrange(0, 4), "world_size": rnd.choice([None, 1, 4]),
          "ts": rnd.choice([None, T0 + rnd.random() * 100, rnd.random() * 100])}
    if rnd.random() < 0.3:   # a relaunch now and then (each one recompiles the run's rules)
        ev["incarnation"] = "i1" if rnd.random() < 0.97 else "i2"
    if rnd.random() < 0.3:
        ev["tags"] = {rnd.choice(["algo"] * 8 + ["generation", "target.kl"]): str(rnd.randrange(3))}
    if kind == "step":
        ev["metrics"] = {m: rnd.choice([rnd.gauss(0, 1), rnd.random(), 0.0, math.nan, math.inf,
                                        "NaN", 1e300])
                         for m in rnd.sample(METRICS, rnd.randrange(0, len(METRICS)))}
        if rnd.random() < 0.2:
            ev["dists"] = {"reward": [rnd.gauss(0, 1) for _ in range(rnd.randrange(0, 9))],
                           "response_length": [rnd.randrange(1, 900) for _ in range(rnd.randrange(0, 9))]}
        if rnd.random() < 0.1:
            ev["groups"] = {"reward/mean": {"a": rnd.random(), "b": rnd.random()}}
        if rnd.random() < 0.2:
            ev["hashes"] = {"actor": rnd.choice(["h1", "h2"])}
    elif kind == "samples":
        ev["samples"] = [{"prompt_id": f"p{rnd.randrange(5)}", "reward": rnd.gauss(0, 1),
                          "response": "word " * rnd.randrange(0, 20),
                          "token_kl_argmax": rnd.choice(["A", "B"])}
                         for _ in range(rnd.randrange(0, 6))]
    elif kind == "checkpoint":
        ev["path"] = f"/c/{ev['step']}"
    for _ in range(rnd.choice([0, 0, 1, 1, 2, 3])):
        key = rnd.choice(FIELDS)
        what = rnd.random()
        if what < 0.15:
            ev.pop(key, None)
        elif what < 0.4 and isinstance(ev.get(key), dict) and ev[key]:
            inner = rnd.choice(list(ev[key]))
            ev[key][inner] = rnd.choice(NASTY)
        elif what < 0.5 and key in ("metrics", "tags"):
            ev[key] = {f"k{i}": rnd.choice(NASTY)
                       for i in range(rnd.choice([1, 3, 70]))}
        else:
            ev[key] = rnd.choice(NASTY)
    return ev


def _decode(raw):
    try:
        return parse_event(raw, T0)
    except EventError as exc:
        assert exc.reason and "\n" not in exc.reason
        return None


SEEDS = st.integers(min_value=0, max_value=2**32)


@FAST
@given(SEEDS)
def test_the_decoder_returns_an_event_or_a_reason(seed):
    rnd = random.Random(seed)
    for _ in range(BATCH):
        event = event_from(rnd)
        form = rnd.choice(["dict", "bytes", "text"])
        if form == "dict":
            _decode(event)
        else:
            text = json.dumps(event, allow_nan=True)
            _decode(text.encode() if form == "bytes" else text)


@FAST
@given(st.lists(st.binary(max_size=40), min_size=BATCH, max_size=BATCH))
def test_the_decoder_survives_any_bytes(batch):
    for raw in batch:
        _decode(raw)


_PIPELINE = Pipeline(rlhf_pack())


def _strict_constant(name):
    raise AssertionError(f"non-strict JSON constant {name}")


@FAST
@given(SEEDS)
def test_the_processor_takes_any_valid_event_or_rejects_it_with_a_reason(seed):
    rnd = random.Random(seed)
    for _ in range(BATCH):
        now = rnd.choice([T0 + rnd.random() * 200, rnd.random() * 4e9])
        ev = _decode(event_from(rnd))
        if ev is None:
            continue
        try:
            alerts = _PIPELINE.feed(ev, now)
        except EventError as exc:
            assert exc.reason and "\n" not in exc.reason
            continue
        for a in alerts:
            json.loads(a.to_json(), parse_constant=_strict_constant)
        summary = _PIPELINE.runs[ev.run_id].summary()
        assert len(json.dumps(summary)) < 4096
        assert all(math.isfinite(v) for v in summary["smoothed"].values())

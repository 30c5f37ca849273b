"""contract.events: strict parsing with reasons, and strict-JSON dumping (contract section 1)."""

from __future__ import annotations

import json
import math

import pytest

from contract.events import (
    MAX_EVENT_BYTES,
    CheckpointEvent,
    EventError,
    HeartbeatEvent,
    SamplesEvent,
    StepEvent,
    dump_event,
    parse_event,
)

BASE = {"schema": 1, "kind": "step", "run_id": "ppo-8b-a", "step": 12,
        "metrics": {"kl/mean": 0.021}}


def reject(raw, received_at: float = 5.0) -> str:
    with pytest.raises(EventError) as info:
        parse_event(raw, received_at)
    assert info.value.reason, "a rejection must carry a reason"
    assert str(info.value) == info.value.reason
    return info.value.reason


def with_(**changes):
    d = dict(BASE)
    d.update(changes)
    return d


def without(*keys):
    return {k: v for k, v in BASE.items() if k not in keys}


# -- accepted ---------------------------------------------------------------------------------

def test_contract_example_parses_with_every_section():
    raw = {"schema": 1, "kind": "step", "run_id": "ppo-8b-a", "rank": 0, "world_size": 8,
           "step": 1200, "ts": 1764500000.123,
           "metrics": {"kl/mean": 0.021, "reward/mean": 1.31, "entropy/mean": 2.52},
           "dists": {"reward": [1.2, 0.9, 1.7], "response_length": [312, 401, 298]},
           "groups": {"reward/mean": {"safety": 0.8, "knowledge": 0.3, "creative": 0.6}},
           "hashes": {"actor": "sha256:abc"}, "tags": {"algo": "ppo", "model": "llama-8b"}}
    ev = parse_event(json.dumps(raw).encode(), received_at=1.0)
    assert isinstance(ev, StepEvent)
    assert ev.run_id == "ppo-8b-a" and ev.step == 1200 and ev.world_size == 8
    assert ev.ts == 1764500000.123  # the event's own time wins over the receive time
    assert ev.metrics == {"kl/mean": 0.021, "reward/mean": 1.31, "entropy/mean": 2.52}
    assert ev.dists["response_length"] == [312.0, 401.0, 298.0]
    assert ev.groups["reward/mean"]["knowledge"] == 0.3
    assert ev.hashes == {"actor": "sha256:abc"}
    assert ev.tags["model"] == "llama-8b"


def test_only_schema_kind_run_id_step_are_required_and_defaults_apply():
    ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": 0}, received_at=42.5)
    assert ev.rank == 0
    assert ev.ts == 42.5  # ts filled from the receive time
    assert ev.metrics == {}


@pytest.mark.parametrize("form", ["dict", "str", "bytes"])
def test_ts_is_filled_from_received_at_for_every_input_form(form):
    raw = dict(BASE)
    data = {"dict": raw, "str": json.dumps(raw), "bytes": json.dumps(raw).encode()}[form]
    assert parse_event(data, received_at=1234.5).ts == 1234.5


@pytest.mark.parametrize("kind, extra, cls", [
    ("samples", {"samples": [{"prompt_id": "p1", "response": "hi", "reward": "NaN",
                              "truncated": False, "token_kl_argmax": "Certainly"}]}, SamplesEvent),
    ("checkpoint", {"path": "/ckpt/step-100"}, CheckpointEvent),
    ("heartbeat", {}, HeartbeatEvent),
])
def test_other_kinds_parse_to_their_types(kind, extra, cls):
    ev = parse_event({"schema": 1, "kind": kind, "run_id": "r", "step": 100, **extra}, 1.0)
    assert isinstance(ev, cls)
    if kind == "samples":
        assert math.isnan(ev.samples[0].reward)
        assert ev.samples[0].token_kl_argmax == "Certainly"
    if kind == "checkpoint":
        assert ev.path == "/ckpt/step-100"


def test_nonfinite_strings_are_values_not_errors():
    ev = parse_event(with_(metrics={"a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 1}), 0.0)
    assert math.isnan(ev.metrics["a"])
    assert ev.metrics["b"] == math.inf
    assert ev.metrics["c"] == -math.inf
    assert ev.metrics["d"] == 1.0


def test_bare_nan_tokens_in_the_json_text_are_accepted():
    text = '{"schema":1,"kind":"step","run_id":"r","step":1,"metrics":{"a":NaN,"b":-Infinity}}'
    ev = parse_event(text, 0.0)
    assert math.isnan(ev.metrics["a"]) and ev.metrics["b"] == -math.inf


def test_nonfinite_values_in_dists_and_groups_are_accepted():
    ev = parse_event(with_(dists={"reward": [1.0, "NaN", "Infinity"]},
                           groups={"reward/mean": {"safety": "-Infinity"}}), 0.0)
    assert math.isnan(ev.dists["reward"][1]) and ev.dists["reward"][2] == math.inf
    assert ev.groups["reward/mean"]["safety"] == -math.inf


def test_integral_float_step_is_accepted_as_int():
    ev = parse_event(with_(step=7.0), 0.0)
    assert ev.step == 7 and isinstance(ev.step, int)


def test_event_just_under_the_size_limit_is_accepted():
    raw = json.dumps(with_(pad="x" * (MAX_EVENT_BYTES - 500)))
    assert len(raw.encode()) <= MAX_EVENT_BYTES
    assert parse_event(raw.encode(), 0.0).run_id == "ppo-8b-a"


# -- rejected, with a reason that says why ----------------------------------------------------

def test_bad_json_is_rejected_with_reason():
    assert "bad JSON" in reject(b'{"schema": 1, "kind": "step", ')


def test_non_object_json_is_rejected():
    assert "object" in reject("[1, 2, 3]")


def test_non_utf8_bytes_are_rejected():
    assert "UTF-8" in reject(b"\xff\xfe{}")


@pytest.mark.parametrize("missing", ["run_id", "kind", "schema", "step"])
def test_missing_required_field_is_named(missing):
    reason = reject(without(missing))
    assert "missing" in reason and missing in reason


def test_unknown_kind_is_named():
    reason = reject(with_(kind="metrics"))
    assert "'metrics'" in reason and "kind" in reason


def test_wrong_schema_version_is_rejected():
    assert "schema" in reject(with_(schema=2))


def test_negative_step_is_rejected():
    assert "step" in reject(with_(step=-1))


@pytest.mark.parametrize("field, value", [
    ("step", True), ("step", 1.5), ("step", "12"), ("rank", False), ("rank", -1),
    ("world_size", 0), ("world_size", True), ("ts", "yesterday"), ("ts", True),
])
def test_wrong_types_of_envelope_fields_are_rejected(field, value):
    assert field in reject(with_(**{field: value}))


@pytest.mark.parametrize("value", [True, False, "0.5", None, [0.5], {"x": 1}])
def test_metric_values_must_be_numbers_not_booleans_or_text(value):
    reason = reject(with_(metrics={"kl/mean": value}))
    assert "kl/mean" in reason


def test_boolean_in_a_dist_is_rejected():
    assert "reward" in reject(with_(dists={"reward": [1.0, True]}))


def test_boolean_schema_is_rejected():
    # `true` is a boolean, not the schema number 1 (booleans are never numbers in events).
    reject(with_(schema=True))


@pytest.mark.parametrize("run_id", ["", "has space", 42])
def test_bad_run_id_is_rejected(run_id):
    assert "run_id" in reject(with_(run_id=run_id))


def test_metrics_must_be_an_object():
    assert "metrics" in reject(with_(metrics=[0.1, 0.2]))


def test_checkpoint_needs_a_path():
    assert "path" in reject({"schema": 1, "kind": "checkpoint", "run_id": "r", "step": 3})


@pytest.mark.parametrize("form", ["bytes", "str"])
def test_oversized_event_is_rejected_with_size_in_reason(form):
    raw = json.dumps(with_(pad="x" * MAX_EVENT_BYTES))
    reason = reject(raw.encode() if form == "bytes" else raw)
    assert str(MAX_EVENT_BYTES) in reason and "limit" in reason


def test_oversized_text_is_measured_in_bytes_not_characters():
    # 600 000 'é' are 1.2 MB of UTF-8: over the byte limit although under it in characters.
    raw = json.dumps(with_(pad="é" * 600_000), ensure_ascii=False)
    assert len(raw) < MAX_EVENT_BYTES < len(raw.encode())
    reject(raw.encode())  # as bytes: rejected
    reject(raw)           # the same event as text must be rejected too


# -- dump_event -----------------------------------------------------------------------------

def test_dump_event_writes_strict_json_with_nonfinite_as_strings():
    ev = parse_event(with_(metrics={"a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 0.5},
                           dists={"reward": [1.0, "NaN"]}), 3.0)
    out = dump_event(ev)
    assert isinstance(out, bytes)

    def no_constants(name):
        raise AssertionError(f"non-strict JSON constant {name} in dump_event output")

    data = json.loads(out, parse_constant=no_constants)
    assert data["metrics"] == {"a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 0.5}
    assert data["dists"]["reward"] == [1.0, "NaN"]
    assert data["schema"] == 1 and data["kind"] == "step"


def test_dump_then_parse_round_trips_every_kind():
    events = [
        with_(rank=3, world_size=4, ts=99.5, tags={"algo": "grpo"}, hashes={"actor": "h"},
              metrics={"kl/mean": "NaN", "reward/mean": -2.5}, groups={"r": {"a": 1.0}}),
        {"schema": 1, "kind": "samples", "run_id": "r", "step": 3, "ts": 1.0,
         "samples": [{"prompt_id": "p", "response": "x", "reward": 0.5, "length": 7}]},
        {"schema": 1, "kind": "checkpoint", "run_id": "r", "step": 3, "ts": 1.0, "path": "/c"},
        {"schema": 1, "kind": "heartbeat", "run_id": "r", "step": 3, "ts": 1.0},
    ]
    for raw in events:
        ev = parse_event(raw, 7.0)
        again = parse_event(dump_event(ev), 8.0)
        assert type(again) is type(ev)
        a, b = ev.model_dump(), again.model_dump()
        if "metrics" in a:
            assert math.isnan(b["metrics"]["kl/mean"])
            a["metrics"].pop("kl/mean"), b["metrics"].pop("kl/mean")
        assert a == b
        assert again.ts == ev.ts  # the original time survives, not the second receive time


def test_dump_event_accepts_a_plain_dict():
    out = dump_event({"schema": 1, "kind": "step", "run_id": "r", "step": 1,
                      "metrics": {"x": math.inf}})
    assert json.loads(out)["metrics"]["x"] == "Infinity"


# -- the fast paths accept and reject exactly what the models do ------------------------------

_EDGE_CHANGES = [
    {}, {"schema": True}, {"schema": 1.0}, {"schema": 2}, {"run_id": ""}, {"run_id": "a b"},
    {"run_id": "abc\n"}, {"run_id": "x" * 257}, {"run_id": "x" * 256}, {"run_id": "r\u00a0x"},
    {"step": -1}, {"step": 2**53}, {"step": 2**53 + 1}, {"step": 1.0}, {"step": 1.5},
    {"step": True}, {"step": "3"}, {"rank": 1_000_000}, {"rank": 1_000_001}, {"rank": None},
    {"world_size": 0}, {"world_size": None}, {"world_size": 8}, {"ts": None}, {"ts": 5},
    {"ts": 1e308}, {"ts": True}, {"ts": "1"}, {"tags": {"a": "b"}}, {"tags": {"a": 1}},
    {"tags": {str(i): "v" for i in range(65)}}, {"tags": {"k" * 257: "v"}},
    {"tags": {"k": "v" * 1025}}, {"tags": {"k": "v" * 1024}}, {"incarnation": None},
    {"incarnation": ""}, {"incarnation": "a b"}, {"incarnation": "x" * 65},
    {"incarnation": "x" * 64}, {"kind": "heartbeat"}, {"kind": "samples"}, {"kind": None},
    {"kind": "nope"}, {"metrics": {"a": "NaN"}}, {"metrics": {"a": True}}, {"metrics": {"a": None}},
    {"metrics": {"a": 10**30}}, {"metrics": {"a": 10**400}}, {"metrics": {"k" * 257: 1}},
    {"metrics": {"k" * 256: 1}}, {"metrics": {str(i): 1.0 for i in range(4097)}},
    {"metrics": []}, {"metrics": None}, {"dists": {"d": [1, 2.5, 3]}},
    {"dists": {"d": [1, "NaN"]}}, {"dists": {"d": 1}}, {"dists": {"d": [True]}},
    {"groups": {"g": {"a": 1, "b": 2.0}}}, {"groups": {"g": {"a": "Infinity"}}}, {"groups": {"g": 1}},
    {"hashes": {"actor": "x"}}, {"hashes": {"actor": 1}}, {"batch_ids": ["a"]}, {"batch_ids": [1]},
    {"batch_ids": "a"}, {"extra_field": 1}, {"final": True, "kind": "heartbeat"},
]


def _outcome(raw):
    try:
        ev = parse_event(raw, 7.0)
    except EventError as exc:
        return "rejected", exc.reason
    return type(ev).__name__, ev.model_dump(by_alias=True), list(ev.__dict__)


@pytest.mark.parametrize("form", ["bytes", "str"])
def test_the_fast_decoders_agree_with_the_models_on_every_edge(form, monkeypatch):
    """The C decoder of plain step events (msgspec) and orjson's path give the same event, or
    the same reason, as the path below them for every edge of the contract."""
    import contract.events as ce

    cases = []
    for change in _EDGE_CHANGES:
        d = dict(BASE, **change)
        cases.append(json.dumps(d) if form == "str" else json.dumps(d).encode())
    for key in BASE:
        cases.append(json.dumps({k: v for k, v in BASE.items() if k != key}))
    cases += [b'{"schema":1,"kind":"step","run_id":"r","step":3,"metrics":{"a":NaN}}',
              b'{"schema":1,"kind":"step","run_id":"r","step":3,"step":4}',
              b'{"schema":1,"kind":"step","run_id":"r","step":3,"metrics":{"a":1,"a":2}}',
              b'{"schema":1,"kind":"step","run_id":"r","step":3,"metrics":{"a":12345678901234567890123}}',
              b'{"schema":1,"kind":"step","run_id":"r","step":3,"metrics":{"a":1e-400}}',
              b'\xff', b'[]', b'', b'{"schema":1,"kind":"step","run_id":"r","step":3} x']
    fast = [_outcome(raw) for raw in cases]
    monkeypatch.setattr(ce, "_msgspec", None)
    no_msgspec = [_outcome(raw) for raw in cases]
    monkeypatch.setattr(ce, "_orjson", None)
    models_only = [_outcome(raw) for raw in cases]
    assert sum(o[0] == "StepEvent" for o in fast) > 20 and sum(o[0] == "rejected" for o in fast) > 20
    for raw, a, b, c in zip(cases, fast, no_msgspec, models_only):
        assert a == b == c, raw[:120]

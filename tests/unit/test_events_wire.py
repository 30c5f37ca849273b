"""contract.events: the quick paths of parse_event give what the models give.

Plain step events are decoded by msgspec; run ids and incarnations already seen free of
whitespace are remembered (a bounded set) instead of matched per event; a step whose numbers
include the non-finite spellings ("NaN", ...) is decoded a second time with text allowed there.
Each must accept exactly what the pydantic models accept, with the same values, and leave
every rejection (and its reason) to them.
"""

from __future__ import annotations

import json
import re

import pytest

import contract.events as ce
from contract.events import EventError, StepEvent, dump_event, parse_event

BASE = {"schema": 1, "kind": "step", "run_id": "ppo-8b-a", "rank": 3, "world_size": 8,
        "step": 12, "ts": 99.5, "tags": {"algo": "ppo"}, "incarnation": "inc-1",
        "metrics": {"kl/mean": 0.021, "loss/value": 2}, "hashes": {"actor": "sha256:ab"},
        "batch_ids": ["b12-r3"]}

#: every character Python's str.isspace calls whitespace, and a few near misses
WHITESPACE = [c for c in map(chr, range(0x110000)) if c.isspace()]
NEAR_MISSES = ["\x1c", "\x1f", "\x85", "\u180e", "\u200b", "\u2060", "\ufeff"]


def outcome(raw, received_at: float = 7.0):
    try:
        ev = parse_event(raw, received_at)
    except EventError as exc:
        return "rejected", exc.reason
    return type(ev).__name__, dump_event(ev), list(ev.__dict__), ev.model_dump()


def outcomes_of_the_models(monkeypatch, cases) -> list:
    """What the pydantic models alone say of each case (no msgspec, no orjson paths)."""
    with monkeypatch.context() as m:
        m.setattr(ce, "_msgspec", None)
        m.setattr(ce, "_orjson", None)
        return [outcome(raw) for raw in cases]


def test_the_whitespace_check_is_the_one_the_other_paths_make():
    # the set lookup replaces msgspec's pattern "^[^\s]+\Z"; a new id is matched by _RUN_ID
    for c in WHITESPACE + NEAR_MISSES + ["a", "é", "\u4e2d"]:
        before = re.search(r"^[^\s]+\Z", f"r{c}x") is None
        assert before == (ce._RUN_ID.fullmatch(f"r{c}x") is None)


@pytest.mark.parametrize("field", ["run_id", "incarnation"])
def test_an_id_with_any_whitespace_is_refused_as_before_after_a_clean_one_was_remembered(
        field, monkeypatch):
    clean = parse_event(json.dumps(BASE).encode(), 7.0)     # remembers the clean ids
    assert clean.run_id == "ppo-8b-a" and clean.incarnation == "inc-1"
    assert "ppo-8b-a" in ce._KNOWN_IDS and "inc-1" in ce._KNOWN_IDS
    cases = []
    for c in WHITESPACE + NEAR_MISSES:
        for value in (BASE[field] + c, c + BASE[field], BASE[field][:3] + c + BASE[field][3:], c):
            d = dict(BASE, **{field: value})
            cases += [json.dumps(d).encode(), json.dumps(d, ensure_ascii=False)]
    fast = [outcome(raw) for raw in cases]
    assert fast == outcomes_of_the_models(monkeypatch, cases)
    refused = [o for o in fast if o[0] == "rejected"]
    # the models' whitespace (Unicode's White_Space) is Python's but for \x1c-\x1f, which
    # the models accept, and so every path does
    assert len(refused) >= 4 * 2 * (len(WHITESPACE) - 4)
    assert all(field in reason for _, reason in refused)
    # and the clean id is still accepted afterwards
    assert parse_event(json.dumps(BASE).encode(), 7.0).run_id == "ppo-8b-a"


def test_the_remembered_ids_are_bounded_and_forgetting_them_changes_nothing(monkeypatch):
    ce._KNOWN_IDS.clear()
    n = ce._MAX_KNOWN_IDS + 50
    for i in range(n):
        ev = parse_event(json.dumps(dict(BASE, run_id=f"run-{i}", incarnation=f"inc-{i % 7}")), 1.0)
        assert ev.run_id == f"run-{i}"
        assert len(ce._KNOWN_IDS) <= ce._MAX_KNOWN_IDS
    # ids seen before the set was emptied, and ids with whitespace, are judged as before
    cases = [json.dumps(dict(BASE, run_id="run-0")).encode(),
             json.dumps(dict(BASE, run_id="run-0\u3000")).encode(),
             json.dumps(dict(BASE, run_id=f"run-{n - 1}\t")).encode()]
    fast = [outcome(raw) for raw in cases]
    assert fast[0][0] == "StepEvent" and [o[0] for o in fast[1:]] == ["rejected"] * 2
    assert fast == outcomes_of_the_models(monkeypatch, cases)


def test_events_of_the_quick_path_share_no_mutable_state():
    a, b = (parse_event(json.dumps(BASE).encode(), 7.0) for _ in range(2))
    assert a.model_fields_set == b.model_fields_set == set(StepEvent.model_fields)
    assert a.model_fields_set is not b.model_fields_set
    a.metrics = {"renamed/kl": 0.021}        # what the run state does when it renames metrics
    a.note = "extra"                         # an extra attribute (the models allow extras)
    assert b.metrics == {"kl/mean": 0.021, "loss/value": 2.0}
    assert "note" not in b.model_dump() and a.model_dump()["note"] == "extra"
    c = parse_event(json.dumps(BASE).encode(), 7.0)
    assert "note" not in c.model_dump() and c.metrics == b.metrics


SPELLINGS = ["NaN", "nan", "-nan", "+NaN", " Infinity ", "infinity", "-Infinity", "+inf", "-INF",
             "inf\n"]
NOT_SPELLINGS = ["", "nann", "1.5", "Infinite", "NaN!", "none"]


def _spelt_cases() -> list:
    cases = []
    for s in SPELLINGS + NOT_SPELLINGS:
        cases += [dict(BASE, metrics={"kl/mean": s, "loss/value": 2}),
                  dict(BASE, metrics={"kl/mean": 0.5, "b": s}),
                  dict(BASE, dists={"reward": [1, 2.5, s, 3]}),
                  dict(BASE, dists={"reward": [1.0], "len": [s]}),
                  dict(BASE, groups={"reward/mean": {"safety": s, "other": 1}}),
                  dict(BASE, metrics={"a": s}, dists={"d": [s, s]}, groups={"g": {"c": s}})]
    # a spelling together with another fault: the other fault is still found
    cases += [dict(BASE, metrics={"a": "NaN"}, extra_field=1),
              dict(BASE, metrics={"a": "NaN", "b": True}),
              dict(BASE, metrics={"a": "NaN", "k" * 257: 1.0}),
              dict(BASE, metrics={"a": "NaN"}, run_id="has space"),
              dict(BASE, metrics={"a": "NaN"}, step=-1),
              dict(BASE, metrics={"a": "NaN"}, dists={"d": [True]}),
              dict(BASE, metrics={"a": "NaN"}, hashes={"actor": 1}),
              dict(BASE, metrics={"a": "NaN"}, kind="heartbeat"),
              dict(BASE, metrics={"a": "NaN", "b": None})]
    return cases


@pytest.mark.parametrize("form", ["bytes", "str", "dict"])
def test_non_finite_spellings_give_what_the_models_give(form, monkeypatch):
    cases = []
    for d in _spelt_cases():
        cases.append(d if form == "dict" else
                     json.dumps(d).encode() if form == "bytes" else json.dumps(d))
    fast = [outcome(raw) for raw in cases]
    assert fast == outcomes_of_the_models(monkeypatch, cases)
    kinds = [o[0] for o in fast]
    assert kinds.count("StepEvent") >= 6 * len(SPELLINGS) and kinds.count("rejected") >= 30


def test_a_step_with_non_finite_spellings_is_decoded_by_msgspec():
    # the speed of a run that diverged (it sends "NaN" in every event) rests on this
    raw = json.dumps(dict(BASE, metrics={"kl/mean": "NaN", "loss/value": 2},
                          dists={"r": [1, "-Infinity"]}, groups={"g": {"a": "inf"}})).encode()
    ev = ce._wire_step(raw, 7.0)
    assert ev is not None and dump_event(ev) == dump_event(parse_event(raw, 7.0))
    assert json.loads(dump_event(ev))["dists"] == {"r": [1.0, "-Infinity"]}


@pytest.mark.parametrize("change", [
    {"metrics": {"a": 10**400}}, {"dists": {"d": [1.0, 10**400]}},
    {"groups": {"g": {"c": 10**400}}}, {"ts": 10**400},
    {"metrics": {"a": "NaN", "b": 10**400}},
    {"kind": "samples", "metrics": None, "samples": [{"reward": 10**400}]},
])
def test_an_integer_too_large_for_a_float_in_a_dict_is_rejected_with_the_models_reason(change):
    d = {k: v for k, v in dict(BASE, **change).items() if v is not None}
    with pytest.raises(EventError) as got:
        parse_event(d, 7.0)
    with pytest.raises(EventError) as models:
        ce._strict(d, 7.0)
    assert got.value.reason == models.value.reason


@pytest.mark.parametrize("change", [
    {},                                                               # the quick path
    {"metrics": {"kl/mean": "NaN", "loss/value": "-Infinity", "x": 1}},   # spelt numbers
    {"metrics": {"a": " inf ", "b": "nan", "c": 2.5}, "batch_ids": ["b1", "b2"],
     "dists": {"logp": [0.1, "NaN"]}},                                # spelt, with the rest
    {"an_extra_key": 1},                                              # the models' path
    {"batch_ids": [], "dists": {"logp": [0.1, -0.2, 3]}},
    {"metrics": {}},
])
def test_a_kept_step_read_again_gives_the_metrics_and_batch_ids_parse_event_gave(change):
    raw = json.dumps({**BASE, **change}).encode()
    ev = parse_event(raw, 7.0)
    metrics, ids = ce.kept_step_values(raw)
    assert json.dumps(metrics) == json.dumps(ev.metrics) and ids == ev.batch_ids
    assert [type(v) for v in metrics.values()] == [type(v) for v in ev.metrics.values()]


def _read_outcome(raw, received_at: float = 7.0):
    """read_event's outcome in the terms of ``outcome``: a plain step's fields and values as
    its model would hold them."""
    try:
        ev = ce.read_event(raw, received_at)
    except EventError as exc:
        return "rejected", exc.reason
    if isinstance(ev, ce.WireStep):
        fields = list(StepEvent.model_fields)
        return ("StepEvent", dump_event(ev), fields,
                {f: getattr(ev, f) for f in fields} | {"schema_": 1})
    return type(ev).__name__, dump_event(ev), list(ev.__dict__), ev.model_dump()


@pytest.mark.parametrize("form", ["bytes", "str"])
def test_read_event_gives_what_parse_event_gives_a_plain_step_as_a_wire_step(form):
    """The worker reads events with read_event: a plain step comes without its pydantic model
    (a WireStep), with the model's fields and values; everything else, rejections included,
    is what parse_event gives."""
    dicts = [BASE, dict(BASE, rank=0, dists={"reward": [1, 2.5]}, groups={"g": {"a": 1}}),
             {k: v for k, v in BASE.items() if k not in ("ts", "tags", "incarnation")},
             dict(BASE, kind="heartbeat", metrics=None), dict(BASE, step=-1),
             dict(BASE, extra_field=1), *_spelt_cases()]
    cases = [json.dumps({k: v for k, v in d.items() if v is not None}) for d in dicts]
    cases.append('{"schema":1,"kind":"step","run_id":"r","step":1,"metrics":{"a":NaN}}')
    cases = [c.encode() if form == "bytes" else c for c in cases]
    got = [_read_outcome(raw) for raw in cases]
    want = [outcome(raw) for raw in cases]
    for g, w in zip(got, want):
        if g[0] == "rejected":
            assert g == w
        else:     # (NaN is not equal to itself: the values compare by their JSON)
            assert g[:3] == w[:3] and json.dumps(g[3], default=repr) == json.dumps(w[3], default=repr)
    wire = [ce.read_event(raw, 7.0) for raw in cases[:3]]
    assert all(type(ev) is ce.WireStep for ev in wire)
    assert wire[2].ts == 7.0 and wire[2].tags == {} and wire[2].incarnation is None
    assert sum(o[0] == "StepEvent" for o in got) >= 3 + 6 * len(SPELLINGS)
    # parse_event builds the model of the same decoded event
    assert ce.step_event(wire[0]).model_dump() == parse_event(cases[0], 7.0).model_dump()


def test_wire_steps_share_no_mutable_state():
    a, b = (ce.read_event(json.dumps(BASE).encode(), 7.0) for _ in range(2))
    a.metrics["kl/mean"] = 5.0
    a.metrics = {"renamed/kl": 0.021}        # what the run state does when it renames metrics
    a.tags["algo"] = "grpo"
    assert b.metrics == {"kl/mean": 0.021, "loss/value": 2.0} and b.tags == {"algo": "ppo"}


SAMPLE = {"prompt_id": "p-7", "prompt": "Say hi.", "response": "Hi \u00e9\u4e16 \"there\"\n",
          "reward": 0.25, "length": 12, "truncated": False, "category": "chat", "kl": 0.1,
          "token_kl_max": 0.5, "token_kl_argmax": "Hi"}
SAMPLES = {"schema": 1, "kind": "samples", "run_id": "ppo-8b-a", "rank": 0, "world_size": 8,
           "step": 12, "ts": 99.5, "tags": {"algo": "ppo"}, "incarnation": "inc-1",
           "samples": [SAMPLE, {"prompt_id": "p-8", "reward": -1}, {}]}


def _samples_cases() -> list:
    """Samples events the msgspec path reads and events it must leave to the models."""
    plain = [SAMPLES, dict(SAMPLES, samples=[]), {k: v for k, v in SAMPLES.items()
                                                   if k not in ("ts", "tags", "incarnation", "samples")},
             dict(SAMPLES, samples=[dict(SAMPLE, reward=3, kl=0, token_kl_max=None)]),
             dict(SAMPLES, samples=[{k: None for k in SAMPLE}]), dict(SAMPLES, ts=5)]
    odd = [dict(SAMPLES, samples=[dict(SAMPLE, reward=v)]) for v in
           ("NaN", "-Infinity", "x", True, None, 10**400, [1])]
    odd += [dict(SAMPLES, samples=[dict(SAMPLE, length=v)]) for v in (3.0, 3.5, "3", True, 2**70)]
    odd += [dict(SAMPLES, samples=[dict(SAMPLE, truncated=v)]) for v in (0, 1, "true", 0.0)]
    odd += [dict(SAMPLES, samples=[dict(SAMPLE, extra=1)]), dict(SAMPLES, samples=[5]),
            dict(SAMPLES, samples={"a": SAMPLE}), dict(SAMPLES, samples=None),
            dict(SAMPLES, samples=[dict(SAMPLE, prompt=7)]), dict(SAMPLES, run_id="has space"),
            dict(SAMPLES, run_id=""), dict(SAMPLES, step=-1), dict(SAMPLES, step=1.0),
            dict(SAMPLES, incarnation="in c"), dict(SAMPLES, ts="x"), dict(SAMPLES, extra=1),
            dict(SAMPLES, schema=2), dict(SAMPLES, tags={"a": 1}), dict(SAMPLES, rank=-1),
            dict(SAMPLES, world_size=0), dict(SAMPLES, kind="sample")]
    return plain + odd


def _wire_outcome(raw, received_at: float = 7.0):
    """read_event's outcome in the terms of ``outcome`` (an event without its model, as the
    model would hold it); and the snapshot form of its samples."""
    try:
        ev = ce.read_event(raw, received_at)
    except EventError as exc:
        return ("rejected", exc.reason), None
    model = ev if isinstance(ev, ce.BaseModel) else ce.model_of(ev)
    shown = [ce.sample_fields(s) for s in ev.samples] if ev.kind == "samples" else None
    return (type(model).__name__, dump_event(ev), list(model.__dict__), model.model_dump()), shown


@pytest.mark.parametrize("form", ["bytes", "str"])
def test_read_event_gives_what_the_models_give_a_plain_samples_event_as_wire_samples(
        form, monkeypatch):
    """A plain samples event is decoded by msgspec (WireSamples, its samples WireSample, no
    pydantic model per sample): what the models give, the same values, as the snapshot shows
    them; every other case (a spelt or odd number, an extra field...) is left to them."""
    dicts = _samples_cases()
    # "kind" after "samples" too (the SDK writes it second; another client may not)
    dicts += [{"samples": SAMPLES["samples"], **{k: v for k, v in SAMPLES.items() if k != "samples"}}]
    cases = [json.dumps(d) for d in dicts]
    cases = [c.encode() for c in cases] if form == "bytes" else cases
    got = [_wire_outcome(raw) for raw in cases]
    want = outcomes_of_the_models(monkeypatch, cases)
    for (g, shown), w, d in zip(got, want, dicts):
        if w[0] == "rejected":
            assert g == w, d
        else:     # (NaN is not equal to itself: the values compare by their JSON)
            assert g[:3] == w[:3] and json.dumps(g[3], default=repr) == json.dumps(w[3], default=repr), d
            assert json.dumps(shown, default=repr) == json.dumps(
                [{k: v for k, v in s.items() if v is not None} for s in w[3]["samples"]],
                default=repr), d
    wire = [ce.read_event(raw, 7.0) if w[0] != "rejected" else None for raw, w in zip(cases, want)]
    wired = [type(ev) is ce.WireSamples for ev in wire]
    assert wired[:6] == [True] * 6 and wired[-1]
    assert all(type(s) is ce.WireSample for ev, w in zip(wire, wired) if w for s in ev.samples)
    # the plain ones, a reward of null, a length past 64 bits (both read as the models read
    # them) and the reordered one
    assert sum(wired) == 9 and sum(o[0] == "rejected" for o in want) >= 15
    assert wire[2].ts == 7.0 and wire[2].samples == [] and wire[5].ts == 5.0
    assert type(wire[5].ts) is float and type(wire[3].samples[0].reward) is float


def test_damaged_samples_events_give_what_the_models_give(monkeypatch):
    """Bytes cut, dropped, doubled or changed anywhere in a samples event: read_event and the
    models alone agree on each (accepted with the same values, or rejected with the same
    reason)."""
    import random
    rnd = random.Random(11)
    base = json.dumps(SAMPLES).encode()
    cases = []
    for _ in range(600):
        b = bytearray(base)
        at = rnd.randrange(len(b))
        how = rnd.randrange(4)
        if how == 0:
            del b[at]
        elif how == 1:
            b[at:at] = b[at:at + rnd.randint(1, 4)]
        elif how == 2:
            b[at] = rnd.choice(b'0123456789.-eE"{}[],:ntfxu \\')
        else:
            b = b[:at]
        cases.append(bytes(b))
    got = [_wire_outcome(raw)[0] for raw in cases]
    want = outcomes_of_the_models(monkeypatch, cases)
    for g, w, raw in zip(got, want, cases):
        if w[0] == "rejected":
            assert g == w, raw
        else:
            assert g[:3] == w[:3] and json.dumps(g[3], default=repr) == json.dumps(w[3], default=repr), raw
    accepted = sum(w[0] != "rejected" for w in want)
    assert accepted >= 100 and len(cases) - accepted >= 100
    assert sum(type(ce.read_event(raw, 7.0)) is ce.WireSamples for raw, w in zip(cases, want)
               if w[0] != "rejected") >= 50


def test_wire_samples_share_no_mutable_state():
    a, b = (ce.read_event(json.dumps(SAMPLES).encode(), 7.0) for _ in range(2))
    a.samples[0].reward = 5.0
    a.samples.append(a.samples[0])
    a.tags["algo"] = "grpo"
    assert len(b.samples) == 3 and b.samples[0].reward == 0.25 and b.tags == {"algo": "ppo"}


HEARTBEAT = {"schema": 1, "kind": "heartbeat", "run_id": "ppo-8b-a", "step": 12, "rank": 3,
             "world_size": 8, "ts": 99.5, "tags": {"algo": "ppo"}, "incarnation": "inc-1"}


def _heartbeat_cases() -> list[dict]:
    """Heartbeats and checkpoints: plain ones, and one change each that the models refuse or
    that the quick path leaves to them."""
    cp = dict(HEARTBEAT, kind="checkpoint", path="/ckpt/step-12")
    plain = [HEARTBEAT, cp, {k: v for k, v in HEARTBEAT.items() if k not in ("ts", "tags")},
             dict(HEARTBEAT, ts=100, world_size=None, incarnation=None), dict(cp, rank=0),
             dict(cp, path="/ckpt/é ü")]
    odd = [dict(HEARTBEAT, final=True), dict(HEARTBEAT, extra="x"), dict(HEARTBEAT, schema=True),
           dict(HEARTBEAT, schema=2), dict(HEARTBEAT, step=-1), dict(HEARTBEAT, step=1.0),
           dict(HEARTBEAT, rank="3"), dict(HEARTBEAT, run_id="a b"), dict(HEARTBEAT, run_id=""),
           dict(HEARTBEAT, ts="NaN"), dict(HEARTBEAT, ts=True), dict(HEARTBEAT, world_size=0),
           dict(HEARTBEAT, tags={"a": 1}), dict(HEARTBEAT, incarnation="i j"),
           dict(cp, path=""), dict(cp, path=5), dict(cp, path=None),
           {k: v for k, v in cp.items() if k != "path"}, dict(HEARTBEAT, path="/x")]
    return plain + odd


def test_heartbeats_and_checkpoints_give_what_the_models_give_without_them(monkeypatch):
    """Every rank sends a heartbeat every few seconds: a plain one (and a plain checkpoint
    event) is built without the pydantic models, with what they give; anything else is left to
    them, which give the same outcome as before."""
    dicts = _heartbeat_cases()
    cases = [json.dumps(d).encode() for d in dicts]
    want = outcomes_of_the_models(monkeypatch, cases)
    strict = []
    real = ce._strict
    monkeypatch.setattr(ce, "_strict", lambda raw, at: strict.append(raw) or real(raw, at))
    got = [outcome(raw) for raw in cases]
    for g, w, d in zip(got, want, dicts):
        assert g == w, d
    assert [w[0] for w in want[:6]] == ["HeartbeatEvent", "CheckpointEvent", "HeartbeatEvent",
                                        "HeartbeatEvent", "CheckpointEvent", "CheckpointEvent"]
    assert len(strict) == len(dicts) - 6       # the plain ones never reached the models
    assert sum(w[0] == "rejected" for w in want) >= 14
    final = ce.read_event(cases[6], 7.0)
    assert final.kind == "heartbeat" and final.final is True     # (an extra field, kept)

"""The run-state table's values (streams.state_codec, read and written by streams.app.RunStates).

States are written as MessagePack and read back exactly as the JSON an older worker wrote reads
back: the same dict, float for float (NaN and the infinities included, which a JSON reader such
as orjson would have turned into null), and a run restored mid-way from either format raises the
same alerts as one never restored. JSON states left by an older worker still load; a value that
is neither, or that the processor cannot restore, is logged and its run starts afresh, and the
worker goes on."""

from __future__ import annotations

import json
import logging
import math
import random
import struct

import msgspec
import pytest

pytest.importorskip("faust")

import streams.app as worker_app  # noqa: E402
from contract.events import parse_event  # noqa: E402
from producers.sim import SimConfig, simulate  # noqa: E402
from streams.app import RunStates  # noqa: E402
from streams.processor import Pipeline, Processor  # noqa: E402
from streams.state_codec import StateDecodeError, decode_state, encode_state  # noqa: E402
from tests.unit._core import rlhf_pack, step_event  # noqa: E402

MAP_FIRST_BYTES = set(range(0x80, 0x90)) | {0xDE, 0xDF}   # fixmap, map16, map32

# 8-rank PPO and GRPO runs with dists, samples, checkpoints; their faults fire alerts with NaN
# values (nan_inf), group statistics (category_imbalance) and per-prompt tallies
RUNS = [("ppo", "kl_above_target"), ("grpo", "nan_inf"), ("ppo", "category_imbalance"),
        ("grpo", "prompt_extreme_reward")]
STEPS, ONSET = 160, 70
#: parts of a run's state the restored runs must have had something in
PARTS = ("alerts", "groups", "prompts", "pending", "dist_bases", "corr_ema", "checkpoints")


@pytest.fixture(scope="module")
def fleet() -> list:
    """The events of the runs above, interleaved by time, parsed."""
    events = []
    for i, (algo, fault) in enumerate(RUNS):
        cfg = SimConfig(run_id=f"{algo}-{fault}", algo=algo, fault=fault, onset=ONSET, seed=11 + i,
                        world_size=8, samples_every=10, checkpoint_every=40)
        events += [parse_event(e, e["ts"]) for e in simulate(cfg, STEPS)]
    events.sort(key=lambda e: e.ts)
    return events


def restore_point(events) -> int:
    """An index past the faults' onsets where some run waits for the other ranks of a step (its
    ``pending`` is not empty), so a restore there cuts a step in two."""
    pipe = Pipeline(rlhf_pack())
    for i, e in enumerate(events):
        pipe.feed(e, e.ts)
        pending = any(len(st.ranks) for st in pipe.runs.values())
        if e.kind == "step" and e.step >= ONSET + 25 and pending:
            return i
    raise AssertionError("no step was ever pending")


def exactly(a, b, path="", numbers=False) -> None:
    """Same structure, same types, same keys in the same order, floats bit for bit (any NaN
    equals any NaN: JSON keeps no payload). ``numbers``: an int and a float of the same value
    are the same (a restored bank holds 50.0 where the live one held 50, whatever the format)."""
    if numbers and {type(a), type(b)} == {int, float}:
        a, b = float(a), float(b)
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys differ"
        for k in a:
            exactly(a[k], b[k], f"{path}/{k}", numbers)
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            exactly(x, y, f"{path}[{i}]", numbers)
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b), \
            f"{path}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def via_json(state: dict) -> dict:
    """What an older worker wrote to the table and read back."""
    return json.loads(json.dumps(state, allow_nan=True).encode())


def alert_lines(alerts) -> list[str]:
    return [json.dumps(a.model_dump(), sort_keys=True, default=repr) for a in alerts]


def run_worker_path(events, restore_at: int | None, old_format: bool = False):
    """The events through RunStates over a dict table, as the worker processes them. At
    ``restore_at`` every state goes to the table and the decoded states are dropped (a restart,
    a rebalance): the runs continue from the table, written as MessagePack or, with
    ``old_format``, as an older worker wrote it (JSON text)."""
    table: dict[bytes, bytes] = {}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor)
    alerts, written = [], {}
    for i, e in enumerate(events):
        st = states.get(e.run_id)
        alerts += processor.process(st, e, e.ts)
        states.touch(e.run_id)
        if i == restore_at:
            written = {rid: s.to_state() for rid, s in states.cache.items()}
            states.flush()
            if old_format:
                for rid, s in written.items():
                    table[rid.encode()] = json.dumps(s, allow_nan=True).encode()
            states.forget()
    states.flush()
    return alerts, table, written, states


# -- real runs -----------------------------------------------------------------------------------

def test_a_real_state_reads_back_exactly_as_its_json_did_and_restores_the_same(fleet):
    at = restore_point(fleet)
    pipe = Pipeline(rlhf_pack())
    for e in fleet[:at + 1]:
        pipe.feed(e, e.ts)
    assert len(pipe.runs) == len(RUNS)
    covered = set()
    for rid, st in pipe.runs.items():
        state = st.to_state()
        for part in PARTS:
            if state[part]:
                covered.add(part)
        assert len(state["banks"]) == 8
        value = encode_state(state)
        assert value[0] in MAP_FIRST_BYTES
        from_table = decode_state(value)
        exactly(from_table, via_json(state), rid)
        restored, restored_json = (pipe.processor.load_state(from_table),
                                   pipe.processor.load_state(via_json(state)))
        exactly(restored.to_state(), restored_json.to_state(), rid)
        exactly(restored.to_state(), state, rid, numbers=True)   # the banks' states included
    assert covered == set(PARTS)


def test_runs_restored_mid_way_raise_the_alerts_of_runs_never_restored(fleet):
    at = restore_point(fleet)
    never, _, _, _ = run_worker_path(fleet, None)
    from_msgpack, table, written, _ = run_worker_path(fleet, at)
    from_json, old_table, _, _ = run_worker_path(fleet, at, old_format=True)
    assert never and any(a.rule == "nan_inf" for a in never)
    # the alerts after the restore point are compared too: some fire or resolve only after it
    assert len([a for a in never if a.step > fleet[at].step]) > 0
    assert alert_lines(from_msgpack) == alert_lines(never)
    assert alert_lines(from_json) == alert_lines(never)
    assert set(written) == {f"{a}-{f}" for a, f in RUNS}
    assert all(v[0] in MAP_FIRST_BYTES for v in table.values())      # written as MessagePack
    # read as JSON, written back as MessagePack
    assert all(v[0] in MAP_FIRST_BYTES for v in old_table.values())


def test_nan_alert_values_survive_the_table_as_nan(fleet):
    """A JSON reader that writes NaN as null (orjson) would restore these values as None."""
    at = restore_point(fleet)
    _, _, _, states = run_worker_path(fleet, at)
    restored = states.get("grpo-nan_inf")
    values = [a.value for k, a in restored.alerts.items() if k.startswith("nan_inf/")]
    assert values and all(isinstance(v, float) and math.isnan(v) for v in values)


# -- the codec itself ------------------------------------------------------------------------

def test_non_finite_and_extreme_floats_survive_bit_for_bit():
    floats = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -5e-324, 2.2250738585072014e-308,
              1.7976931348623157e308, -1.7976931348623157e308, 0.1 + 0.2, 1 / 3, 2.0 ** 53 + 2]
    state = {"run_id": "r", "values": floats, "nested": {"v": [math.nan, [math.inf, -math.inf]]},
             "n": 2 ** 53, "neg": -(2 ** 63), "flag": True, "none": None, "text": "kl/mean é"}
    back = decode_state(encode_state(state))
    exactly(back, state)
    assert back["nested"]["v"][0] != back["nested"]["v"][0]          # still a NaN, not None
    assert back["values"][1] == math.inf and back["values"][2] == -math.inf


def test_a_map_never_starts_with_the_byte_of_a_json_object():
    for size in (0, 1, 15, 16, 65_535, 65_536):
        value = encode_state({f"k{i}": i for i in range(size)})
        assert value[0] in MAP_FIRST_BYTES and value[0] != ord("{")
    assert decode_state(b' \n{"run_id": "r", "x": NaN}')["run_id"] == "r"   # JSON, any spacing


def test_what_msgpack_cannot_hold_is_stored_as_json_and_reads_back():
    state = {"run_id": "r", "tags": {"note": "half a pair \ud800"}, "big": 2 ** 70, "x": math.inf}
    value = encode_state(state)
    assert value[:1] == b"{"
    back = decode_state(value)
    assert back["tags"] == state["tags"] and back["big"] == 2 ** 70 and back["x"] == math.inf


def test_the_worker_writes_the_same_bytes_with_its_banks_packed(fleet):
    # RunStates writes to_state(packed=True): each bank's MessagePack made by the bank itself
    # (msgspec.Raw), not a dict of lists for msgspec to walk. Same bytes, every run, mid-way
    # (a step cut in two, alerts firing) and at the end.
    pipe = Pipeline(rlhf_pack())
    at = restore_point(fleet)
    for i, e in enumerate(fleet):
        pipe.feed(e, e.ts)
        if i in (at, len(fleet) - 1):
            for run_id, st in pipe.runs.items():
                assert encode_state(st.to_state(packed=True)) == encode_state(st.to_state()), run_id
    assert all(st.alerts or st.events for st in pipe.runs.values())


def test_a_packed_state_that_msgpack_cannot_hold_falls_back_to_the_same_json(fleet):
    pipe = Pipeline(rlhf_pack())
    for e in fleet[:400]:
        pipe.feed(e, e.ts)
    st = next(iter(pipe.runs.values()))
    st.tags["note"] = "half a pair \ud800"          # no MessagePack string holds a lone surrogate
    packed = encode_state(st.to_state(packed=True))
    assert packed[:1] == b"{" and packed == encode_state(st.to_state())
    exactly(decode_state(packed), via_json(st.to_state()))


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x7f", b"[1, 2]", b'{"run_id": "r", "banks": ',
                                 b"\xde\x00\x05\xa1", msgspec.msgpack.encode([1, 2])])
def test_a_value_that_is_no_state_is_refused(raw):
    with pytest.raises(StateDecodeError):
        decode_state(raw)


# -- RunStates: old values, bad values, the size limit -----------------------------------------

def test_a_state_an_older_worker_wrote_as_json_loads_and_is_written_back_as_msgpack():
    processor = Processor(rlhf_pack())
    old = Pipeline(rlhf_pack())
    for step in range(6):
        loss = math.nan if step > 2 else 0.1
        old.feed(step_event("old", step, {"loss/policy": loss}), 1e9 + step)
    state = old.state("old").to_state()
    assert any(math.isnan(a["value"]) for a in state["alerts"].values())
    table = {b"old": json.dumps(state, allow_nan=True).encode()}   # as an older worker wrote it
    states = RunStates(table, processor)
    restored = states.get("old")
    exactly(restored.to_state(), state)
    states.touch("old")
    assert states.flush() == 1
    assert table[b"old"][0] in MAP_FIRST_BYTES
    exactly(decode_state(table[b"old"]), via_json(state))


def _bad_values() -> dict[str, bytes]:
    good = Pipeline(rlhf_pack())
    for step in range(5):
        good.feed(step_event("bad", step, {"kl/mean": 0.01}), 1e9 + step)
    value = encode_state(good.state("bad").to_state())
    noise = bytes(random.Random(5).getrandbits(8) for _ in range(300))
    return {
        "truncated msgpack": value[: len(value) // 2],
        "truncated json": json.dumps(good.state("bad").to_state()).encode()[:200],
        "random bytes": b"\x85" + noise,
        "not a map": msgspec.msgpack.encode([1, 2, 3]),
        "no run id": msgspec.msgpack.encode({"banks": {}}),
        "a bank that is no bank": msgspec.msgpack.encode({"run_id": "bad", "banks": {"0": "zzz"}}),
        "a rank that is no number": msgspec.msgpack.encode({"run_id": "bad",
                                                            "last_step": {"x": 1}}),
    }


@pytest.mark.parametrize("name", list(_bad_values()))
def test_a_bad_value_is_logged_and_its_run_starts_afresh(name, caplog):
    table = {b"bad": _bad_values()[name]}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor)
    with caplog.at_level(logging.ERROR, logger="rlwatch.worker"):
        st = states.get("bad")
    errors = [r.getMessage() for r in caplog.records
              if r.name == "rlwatch.worker" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "run bad" in errors[0] and "starts afresh" in errors[0]
    assert st.run_id == "bad" and st.events == 0 and not st.alerts
    # the run goes on as a new one: its events count, its alerts fire, its state is written
    alerts = []
    for step in range(3):
        ev = step_event("bad", step, {"loss/policy": math.nan})
        alerts += processor.process(st, ev, 1e9 + step)
        states.touch("bad")
    assert any(a.rule == "nan_inf" and a.state == "firing" for a in alerts)
    assert states.flush() == 1
    assert decode_state(table[b"bad"])["events"] == 3


def test_the_size_limit_applies_to_the_encoded_value(monkeypatch, caplog):
    table: dict[bytes, bytes] = {}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor)
    st = states.get("big")
    for step in range(5):
        ev = step_event("big", step, {"kl/mean": 0.01, "loss/policy": 0.2})
        processor.process(st, ev, 1e9 + step)
    size = len(encode_state(st.to_state()))
    assert size < len(json.dumps(st.to_state(), allow_nan=True))
    monkeypatch.setattr(worker_app, "MAX_STATE_BYTES", size)
    states.touch("big")
    assert states.flush() == 1 and b"big" in table
    del table[b"big"]
    monkeypatch.setattr(worker_app, "MAX_STATE_BYTES", size - 1)
    states.touch("big")
    with caplog.at_level(logging.ERROR, logger="rlwatch.worker"):
        assert states.flush() == 0
    assert b"big" not in table
    assert any("run big" in r.getMessage() and str(size) in r.getMessage() for r in caplog.records)

"""contract.alert: identity (fingerprint) and the JSON line of contract section 3."""

from __future__ import annotations

import json
import math

import pytest

from contract.alert import SEVERITIES, Alert, fingerprint, severity_rank


def make(**kw) -> Alert:
    base = dict(rule="kl_above_target", severity="red", state="firing", run_id="ppo-8b-a",
                step=1204, onset_step=1200, value=0.131, threshold=0.125,
                actions=["pause", "snapshot"], summary="KL high", diagnosis="beta too small",
                ts=1764500012.5)
    base.update(kw)
    return Alert(**base)


def test_fingerprint_is_stable_for_the_same_rule_run_rank_tier():
    a = make(step=1204, value=0.131)
    b = make(step=1300, value=0.9, onset_step=1290, summary="other text")
    assert a.fingerprint and a.fingerprint == b.fingerprint
    assert a.fingerprint == fingerprint("kl_above_target", "ppo-8b-a", None, "red")


@pytest.mark.parametrize("change", [
    {"severity": "black"}, {"severity": "yellow"}, {"run_id": "ppo-8b-b"}, {"rank": 3},
    {"rule": "kl_rising"},
])
def test_fingerprint_differs_when_rule_run_rank_or_tier_differs(change):
    assert make().fingerprint != make(**change).fingerprint


def test_fingerprint_does_not_depend_on_state():
    # firing and resolved of the same alert share the identity (dedup keys add the state)
    assert make(state="firing").fingerprint == make(state="resolved").fingerprint


def test_rank_zero_and_no_rank_are_different_identities():
    assert make(rank=0).fingerprint != make(rank=None).fingerprint


def test_to_json_has_the_contract_fields_and_round_trips():
    a = make(rank=2, adjust={"beta": 1.5}, rollback_to={"step": 1100, "checkpoint": "/c/1100"},
             labels={"seed": "Q12"})
    line = a.to_json()
    assert "\n" not in line
    data = json.loads(line)
    for key in ("rule", "severity", "state", "run_id", "step", "fingerprint"):
        assert key in data
    assert data["severity"] == "red" and data["state"] == "firing" and data["step"] == 1204
    back = Alert.from_json(line)
    assert back == a
    assert Alert.from_json(line.encode()) == a


@pytest.mark.parametrize("value, text", [(math.nan, "NaN"), (math.inf, "Infinity"),
                                         (-math.inf, "-Infinity")])
def test_nonfinite_value_is_written_as_contract_string_and_read_back(value, text):
    a = make(rule="nan_inf", severity="black", value=value, threshold=None)
    line = a.to_json()
    data = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in alert JSON"))
    assert data["value"] == text
    back = Alert.from_json(line)
    if math.isnan(value):
        assert math.isnan(back.value)
    else:
        assert back.value == value
    assert back.fingerprint == a.fingerprint and back.rule == "nan_inf"


def test_an_alert_from_a_producer_that_writes_bare_nan_is_still_read():
    # strict JSON is what rlwatch writes; a foreign producer's bare NaN / Infinity literals
    # (Python's json.dumps default) are read as json.loads reads them, not refused
    line = '{"rule":"nan_inf","severity":"black","state":"firing","run_id":"r","step":3,' \
           '"value":NaN,"threshold":Infinity,"snapshot":{"metrics":{"loss":-Infinity}}}'
    back = Alert.from_json(line)
    assert math.isnan(back.value) and back.threshold == math.inf
    assert back.model_extra["snapshot"] == {"metrics": {"loss": -math.inf}}


def test_an_alert_read_keeping_its_snapshot_holds_it_as_its_text_and_writes_it_back_the_same():
    # the worker's alerts lane hands a snapshot on without reading it: the alert's fields are
    # those from_json gives, the snapshot the JSON text it came in, and the alert written
    # again is the same JSON value
    from contract.alert import Raw

    snap = {"window": {"steps": [{"step": 7, "metrics": {"kl/mean": math.nan, "x": 0.1 + 0.2}}]},
            "note": "żółw ✓", "ranks": {}}
    line = make(value=math.inf, labels={"seed": "Q12"}).model_copy(update={"snapshot": snap}).to_json()
    kept = Alert.from_json_keeping_snapshot(line.encode())
    assert isinstance(kept.model_extra["snapshot"], Raw)
    assert json.loads(bytes(kept.model_extra["snapshot"])) == json.loads(line)["snapshot"]
    read = Alert.from_json(line)
    assert kept.model_dump(exclude={"snapshot"}) == read.model_dump(exclude={"snapshot"})
    assert json.loads(kept.to_json()) == json.loads(line)
    # without a snapshot, or in text msgspec does not read (a bare NaN), it is from_json
    plain = make().to_json()
    assert Alert.from_json_keeping_snapshot(plain) == Alert.from_json(plain)
    bare = '{"rule":"r","severity":"red","state":"firing","run_id":"x","step":3,"value":NaN,' \
           '"snapshot":{"loss":-Infinity}}'
    assert Alert.from_json_keeping_snapshot(bare).model_extra["snapshot"] == {"loss": -math.inf}
    with pytest.raises(json.JSONDecodeError):
        Alert.from_json_keeping_snapshot(b'{"rule": "x", "snapshot": {')
    with pytest.raises(ValueError):       # the alert's own fields are checked as from_json does
        Alert.from_json_keeping_snapshot(b'{"rule": "x", "snapshot": {}}')


def test_text_that_is_no_json_gives_json_error():
    with pytest.raises(json.JSONDecodeError):
        Alert.from_json(b'{"rule": "x", ')
    with pytest.raises(UnicodeDecodeError):
        Alert.from_json(b'{"rule": "\xff"}')


def test_invalid_severity_or_state_is_refused():
    with pytest.raises(ValueError):
        make(severity="purple")
    with pytest.raises(ValueError):
        make(state="pending")


def test_severity_order_is_info_to_black():
    assert SEVERITIES == ("info", "yellow", "orange", "red", "black")
    assert [severity_rank(s) for s in SEVERITIES] == [0, 1, 2, 3, 4]

"""strict_json writes data as it is when every float is finite, and walks it (non-finite
floats as the contract's strings) only when json refuses a value: the same text either way."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.alert import Alert
from contract.events import dump_event, record_json, strict_json, to_jsonable

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
leaves = st.one_of(floats, st.integers(-10**6, 10**6), st.text(max_size=5), st.none(), st.booleans())
data = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=4), inner, max_size=4)), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(data)
def test_the_same_text_as_walking_first(value):
    walked = json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)
    assert strict_json(value) == walked


def test_non_finite_values_deep_in_an_alert_are_the_contracts_strings():
    a = Alert(rule="r", severity="red", state="firing", run_id="x", step=3, value=math.nan,
              threshold=math.inf, snapshot={"window": [{"step": 1, "metrics": {"kl": -math.inf}}]})
    text = a.to_json()
    assert '"value":"NaN"' in text and '"threshold":"Infinity"' in text
    assert '"kl":"-Infinity"' in text
    assert json.loads(text)["snapshot"]["window"][0]["metrics"]["kl"] == "-Infinity"
    assert math.isnan(Alert.from_json(text).value)


def test_an_event_with_a_nan_metric_goes_on_the_wire_as_the_contracts_string():
    raw = dump_event({"schema": 1, "kind": "step", "run_id": "r", "step": 1,
                      "metrics": {"a": math.nan, "b": 1.5}})
    assert b'"a":"NaN"' in raw and b'"b":1.5' in raw


# -- record_json and Alert.to_json: pydantic's serializer, the same values ---------------------

def _same(a: str | bytes, b: str | bytes) -> bool:
    """Two JSON texts of one value (json.loads; NaN never appears: it is the string "NaN")."""
    return json.loads(a) == json.loads(b)


texts = st.text(max_size=6)          # any code point but lone surrogates (those: below)
data_any = st.recursive(st.one_of(floats, st.integers(-10**30, 10**30), texts, st.none(), st.booleans()),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                st.dictionaries(texts, inner, max_size=4)), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(data_any)
def test_record_json_reads_back_as_what_strict_json_writes(value):
    assert _same(record_json(value), strict_json(value))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(texts, data_any, max_size=3), floats, floats)
def test_an_alert_reads_back_the_same_whichever_way_it_was_written(extras, value, threshold):
    a = Alert(rule="r", severity="red", state="firing", run_id="run-é", step=3, value=value,
              threshold=threshold, summary="kl \u2028 über", **{f"x_{k}": v for k, v in extras.items()})
    assert _same(a.to_json(), a.to_json_standard())
    back = Alert.from_json(a.to_json())
    assert back.summary == a.summary and back.run_id == a.run_id
    assert (math.isnan(back.value) and math.isnan(value)) or back.value == value


def test_what_the_fast_writer_cannot_write_takes_the_standard_one():
    # a lone surrogate: json escapes it, the UTF-8 writer cannot
    assert record_json({"t": "a\ud800b"}) == b'{"t":"a\\ud800b"}'
    a = Alert(rule="r", severity="red", state="firing", run_id="x", step=1, note="\udcff")
    assert json.loads(a.to_json())["note"] == "\udcff"
    # a type JSON does not know: strict_json's own error, as before
    with pytest.raises(TypeError):
        record_json({"x": object()})
    with pytest.raises(TypeError):
        Alert(rule="r", severity="red", state="firing", run_id="x", step=1, blob=object()).to_json()

"""strict_json writes data as it is when every float is finite, and walks it (non-finite
floats as the contract's strings) only when json refuses a value: the same text either way."""
from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.alert import Alert
from contract.events import dump_event, strict_json, to_jsonable

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

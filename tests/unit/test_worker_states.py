"""The worker's run states in front of its table (streams.app.RunStates): a run whose event
raised an alert is written at once when the alert is in Kafka, and held back from the table
until then; the other changed runs wait for the timer's flush, and nothing is lost then."""

from __future__ import annotations

import pytest

pytest.importorskip("faust")

from streams.app import RunStates  # noqa: E402
from streams.processor import Processor  # noqa: E402
from streams.state_codec import decode_state  # noqa: E402
from tests.unit._core import rlhf_pack, step_event  # noqa: E402


def test_an_alerting_run_is_written_at_once_and_the_others_on_the_next_flush():
    table: dict[bytes, bytes] = {}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor)
    quiet, loud = states.get("quiet"), states.get("loud")
    alerts = []
    for step in range(3):
        processor.process(quiet, step_event("quiet", step, {"kl/mean": 0.01}), 1.0e9 + step)
        states.touch("quiet")
        alerts += processor.process(loud, step_event("loud", step, {"loss/policy": float("nan")}),
                                    1.0e9 + step)
        states.touch("loud")
    assert any(a.rule == "nan_inf" and a.state == "firing" for a in alerts)

    states.flush_run("loud")
    assert set(table) == {b"loud"}
    restored = processor.load_state(decode_state(table[b"loud"]))
    assert any(st.status == "firing" for st in restored.alerts.values())

    assert states.flush() == 1            # the quiet run, written by the timer's flush
    assert set(table) == {b"loud", b"quiet"}
    assert decode_state(table[b"quiet"])["last_step"] == {"0": 2}


def test_a_commit_while_a_runs_alerts_are_on_their_way_does_not_write_its_state():
    """The state that raised an alert must not reach the changelog before the alert reaches the
    alerts topic: a worker dying in between would leave its successor a state that never raises
    the alert again, and the brake would be lost."""
    table: dict[bytes, bytes] = {}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor)
    quiet, loud = states.get("quiet"), states.get("loud")
    for step in range(3):
        processor.process(quiet, step_event("quiet", step, {"kl/mean": 0.01}), 1.0e9 + step)
        states.touch("quiet")
        processor.process(loud, step_event("loud", step, {"loss/policy": float("nan")}), 1.0e9 + step)
        states.touch("loud")
    states.hold(["loud"])                   # its alerts are being published by the events lane
    states.hold(["loud"])                   # ... and by the liveness timer
    assert states.flush() == 1              # a commit meanwhile: the quiet run only
    assert set(table) == {b"quiet"}
    assert "loud" in states.dirty           # still to write
    states.release(["loud"])                # Kafka acknowledged the lane's
    assert states.flush() == 0 and set(table) == {b"quiet"}      # the timer's are still on their way
    states.flush_run("loud")                # the lane's landed: the timer's have not
    assert set(table) == {b"quiet"} and "loud" in states.dirty
    states.release(["loud"])
    states.flush_run("loud")
    restored = processor.load_state(decode_state(table[b"loud"]))
    assert any(st.status == "firing" for st in restored.alerts.values())
    assert states.flush() == 0


def test_a_held_run_is_not_evicted_while_its_alerts_are_on_their_way():
    """Evicting writes a changed state to the table: a held one must wait (and stay decoded)."""
    table: dict[bytes, bytes] = {}
    processor = Processor(rlhf_pack())
    states = RunStates(table, processor, limit=1)
    loud = states.get("loud")
    processor.process(loud, step_event("loud", 0, {"loss/policy": float("nan")}), 1.0e9)
    states.touch("loud")
    states.hold(["loud"])
    states.get("other")                     # over the limit: the held run stays
    assert list(states.cache) == ["loud", "other"] and table == {}
    states.release(["loud"])
    states.get("third")                     # now it goes, written first
    assert "loud" not in states.cache and b"loud" in table

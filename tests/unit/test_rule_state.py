"""rules.state.advance: the pending/firing/resolved machine (steps, seconds, keep, escalate)."""

from __future__ import annotations

import copy

import pytest

from rules.state import AlertState, advance


def run(verdicts, **kw):
    """Advance one state through (holds, step, ts) triples; the transitions, by step."""
    s = AlertState()
    out = []
    for holds, step, ts in verdicts:
        t = advance(s, holds, step, ts, **kw)
        if t is not None:
            out.append((step, t))
    return s, out


def seq(values, start=0, dt=1.0):
    return [(v, start + i, 1000.0 + (start + i) * dt) for i, v in enumerate(values)]


def test_fires_on_first_true_step_by_default():
    s, out = run(seq([False, True]))
    assert out == [(1, "firing")]
    assert s.status == "firing" and s.onset_step == 1 and s.fired_step == 1


def test_for_steps_needs_that_many_consecutive_true_steps():
    s, out = run(seq([True, True, True, True]), for_steps=4)
    assert out == [(3, "firing")]
    assert s.onset_step == 0


def test_for_steps_not_reached_stays_pending_then_resets_on_false():
    s = AlertState()
    for step in range(3):
        assert advance(s, True, step, float(step), for_steps=4) is None
    assert s.status == "pending" and s.onset_step == 0
    assert advance(s, False, 3, 3.0, for_steps=4) is None
    assert s.status == "inactive" and s.onset_step is None
    # a new streak counts from scratch
    _, out = run(seq([True, True, True, False, True, True, True, True]), for_steps=4)
    assert out == [(7, "firing")]


def test_for_seconds_needs_the_time_span_as_well():
    # one step every 5 s; for_seconds=12: onset at ts 0 -> fires at the first ts >= 12
    s, out = run(seq([True] * 5, dt=5.0), for_seconds=12)
    assert out == [(3, "firing")]  # ts offsets 0, 5, 10, 15 -> fires at 15
    assert s.onset_step == 0


def test_for_seconds_and_for_steps_both_must_hold():
    _, out = run(seq([True] * 6, dt=10.0), for_steps=4, for_seconds=5)
    assert out == [(3, "firing")]  # seconds satisfied at step 1, steps only at step 3
    _, out = run(seq([True] * 6, dt=1.0), for_steps=2, for_seconds=4)
    assert out == [(4, "firing")]  # steps satisfied at step 1, seconds only at step 4


def test_firing_resolves_on_first_false_without_keep():
    s, out = run(seq([True, True, False]))
    assert out == [(0, "firing"), (2, "resolved")]
    assert s.status == "inactive"


def test_keep_firing_for_tolerates_that_many_false_steps():
    _, out = run(seq([True, False, False, False]), keep_firing_for=2)
    assert out == [(0, "firing"), (3, "resolved")]


def test_keep_firing_for_count_restarts_when_true_again():
    _, out = run(seq([True, False, False, True, False, False, False]), keep_firing_for=2)
    assert out == [(0, "firing"), (6, "resolved")]


def test_escalates_once_after_escalate_after_steps_of_firing():
    _, out = run(seq([True] * 10, start=10), escalate_after=3)
    assert out == [(10, "firing"), (13, "escalated")]


def test_escalation_is_counted_from_firing_not_onset():
    _, out = run(seq([True] * 10, start=10), for_steps=3, escalate_after=3)
    assert out == [(12, "firing"), (15, "escalated")]


def test_escalates_when_fired_at_step_zero():
    # a run whose alert fires at its very first step escalates like any other
    _, out = run(seq([True] * 6, start=0), escalate_after=3)
    assert out == [(0, "firing"), (3, "escalated")]


def test_escalation_rearms_after_resolution():
    _, out = run(seq([True, True, True, False, True, True, True], start=1), escalate_after=2)
    assert out == [(1, "firing"), (3, "escalated"), (4, "resolved"), (5, "firing"),
                   (7, "escalated")]


@pytest.mark.parametrize("prefix", [[], [True], [True, True, True]])
def test_unknown_verdict_changes_nothing(prefix):
    s = AlertState()
    for i, v in enumerate(prefix):
        advance(s, v, i, float(i), for_steps=2, keep_firing_for=1)
    before = copy.deepcopy(s)
    for i in range(5):
        assert advance(s, None, 100 + i, 100.0 + i, for_steps=2, keep_firing_for=1) is None
    assert s == before


def test_unknown_steps_neither_reset_for_nor_resolve():
    # `for` counts training steps from the onset: steps without data in between neither break
    # the spell nor add points; the condition was true at 0 and at 3, so it held over 4 steps
    verdicts = [(True, 0, 0.0), (None, 1, 1.0), (None, 2, 2.0), (True, 3, 3.0), (True, 4, 4.0)]
    _, out = run(verdicts, for_steps=5)
    assert out == [(4, "firing")]
    verdicts = [(True, 0, 0.0), (None, 1, 1.0), (None, 2, 2.0), (None, 3, 3.0)]
    s, out = run(verdicts)
    assert out == [(0, "firing")] and s.status == "firing"


def test_state_round_trips_through_dict():
    s, _ = run(seq([True, True, False]), for_steps=1, keep_firing_for=3)
    s.value, s.threshold = 0.3, 0.2
    assert AlertState.from_state(s.to_state()) == s


def test_for_points_asks_that_many_true_points_in_a_row_however_sparse_the_logging():
    """Logged every 2 steps, ``for: 3`` alone fires at the second true point (3 steps); with
    ``for_points: 3`` it waits for the third, and a false point starts the count again."""
    sparse = [(True, 10, 10.0), (True, 12, 12.0), (True, 14, 14.0)]
    assert run(sparse, for_steps=3)[1] == [(12, "firing")]
    assert run(sparse, for_steps=3, for_points=3)[1] == [(14, "firing")]
    s, out = run([(True, 10, 10.0), (True, 12, 12.0), (False, 14, 14.0), (True, 16, 16.0),
                  (None, 17, 17.0), (True, 18, 18.0), (True, 20, 20.0)], for_steps=3, for_points=3)
    assert out == [(20, "firing")] and s.onset_step == 16
    # logged every step, for_points: 3 with for: 3 changes nothing
    assert run(seq([True] * 4), for_steps=3, for_points=3)[1] == run(seq([True] * 4), for_steps=3)[1]
    # a pending state written and read back keeps its count
    s = AlertState()
    advance(s, True, 10, 10.0, for_steps=3, for_points=3)
    advance(s, True, 12, 12.0, for_steps=3, for_points=3)
    back = AlertState.from_state(s.to_state())
    assert advance(back, True, 14, 14.0, for_steps=3, for_points=3) == "firing"

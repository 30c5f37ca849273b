"""Regressions found in review: each test is a sequence that once went wrong."""

from __future__ import annotations

import json
import threading
import time

import pytest

from producers.control import CommandInbox
from producers.monitor import Monitor
from contract.commands import Command
from contract.events import EventError, parse_event
from rules.loader import load_pack_text
from streams.processor import Pipeline
from tests.unit._core import T0, feed_series, firing, only_rules, resolved, rlhf_pack, step_event


def test_a_wide_multi_rank_run_keeps_a_small_state():
    """Ranks other than 0 keep no signal banks unless an each_rank rule needs them: a 64-rank
    run's state once grew past Kafka's 1 MB message limit and crashed the worker."""
    p = Pipeline(rlhf_pack())
    for step in range(120):
        for rank in range(64):
            ev = step_event("wide", step, {"kl/mean": 0.02, "grad_norm/actor": 1.0, "loss/value": 1.0,
                                           "reward/mean": 0.5}, rank=rank, world_size=64)
            p.feed(ev, ev.ts)
    size = len(json.dumps(p.state("wide").to_state()))
    assert size < 200_000, size


def test_new_metric_names_every_step_do_not_grow_the_state_without_bound():
    p = Pipeline(only_rules("nan_inf"))
    for step in range(1500):
        ev = step_event("names", step, {f"custom/{step}/{i}": 1.0 for i in range(5)})
        p.feed(ev, ev.ts)
    assert len(p.state("names").latest_metrics) <= 512


def test_a_parameter_named_like_an_alert_field_does_not_break_the_alert():
    pack = load_pack_text("""
rules:
  - id: my_kl
    params: {threshold: 0.2}
    summary: "KL {value:.2f} over {threshold:.2f}"
    tiers:
      - severity: red
        when: {metric: kl/mean, above: {param: threshold}}
        actions: [pause]
""")
    alerts = feed_series(Pipeline(pack), "r", "kl/mean", [0.1, 0.3])
    (a,) = firing(alerts, "my_kl")
    assert a.threshold == pytest.approx(0.2) and a.summary == "KL 0.30 over 0.20"


@pytest.mark.parametrize("raw", [
    '{"schema":1,"kind":"step","run_id":"r","step":1,"metrics":{"x":' + "9" * 400 + "}}",
    '{"schema":1,"kind":"step","run_id":"r","step":1,"ts":' + "9" * 400 + "}",
    '{"schema":1,"kind":"step","run_id":"r","step":1,"metrics":{"x":' + "9" * 5000 + "}}",
])
def test_absurd_numbers_are_rejected_with_a_reason(raw):
    with pytest.raises(EventError) as exc:
        parse_event(raw.encode(), T0)
    assert exc.value.reason


def test_after_a_rollback_the_retrained_steps_are_watched_again():
    p = Pipeline(only_rules("nan_inf"))
    feed_series(p, "rb", "loss/value", [1.0] * 100)
    # the SDK bumps the generation tag after applying a rollback to step 50
    alerts = feed_series(p, "rb", "loss/value", [1.0] * 10 + [float("nan")], start=50,
                         tags={"generation": "1"})
    assert firing(alerts, "nan_inf", "black"), "a NaN after the rollback went unseen"


def test_a_rollback_closes_the_alerts_that_were_open():
    p = Pipeline(only_rules("nan_inf"))
    before = feed_series(p, "rb2", "loss/value", [1.0] * 10 + [float("nan")])
    (opened,) = firing(before, "nan_inf")
    after = feed_series(p, "rb2", "loss/value", [1.0], start=5, tags={"generation": "1"})
    closed = resolved(after, "nan_inf")
    assert [a.fingerprint for a in closed] == [opened.fingerprint]


def test_an_escalated_alert_is_resolved_under_its_own_fingerprint_too():
    p = Pipeline(only_rules("kl_above_target"))
    alerts = feed_series(p, "esc", "kl/mean", [0.09] * 215 + [0.02] * 10)
    up = firing(alerts, "kl_above_target", "orange")
    assert up, "yellow should have escalated to orange after 200 steps"
    done = resolved(alerts, "kl_above_target")
    assert {a.fingerprint for a in done} >= {up[0].fingerprint}


def test_a_cross_rank_alert_keeps_the_rank_it_fired_for():
    p = Pipeline(only_rules("rank_outlier"))
    out = []
    for step in range(6):
        bad = 3 if step < 3 else 1
        for rank in range(4):
            ev = step_event("ranks", step, {"grad_norm/actor": 9.0 if rank == bad else 1.0},
                            rank=rank, world_size=4)
            out += p.feed(ev, ev.ts)
    for step in range(6, 30):       # the notice keeps firing 20 steps past the last outlier
        for rank in range(4):
            ev = step_event("ranks", step, {"grad_norm/actor": 1.0}, rank=rank, world_size=4)
            out += p.feed(ev, ev.ts)
    fired = firing(out, "rank_outlier")
    assert fired and fired[0].rank == 3
    assert [a.fingerprint for a in resolved(out, "rank_outlier")] == [fired[0].fingerprint]


class _NoTransport:
    def send(self, items):
        pass

    def close(self, timeout):
        pass


def _cmd(action, **kw):
    return Command(run_id="p", action=action, ts=time.time(), reason=action, **kw)


def test_a_pause_landing_right_after_a_resume_still_holds_the_loop():
    inbox = CommandInbox("p")
    acks = []
    inbox.on_ack = acks.append
    mon = Monitor("p", transport=_NoTransport(), inbox=inbox, redis=False, heartbeat_seconds=0)
    steps = []

    def loop():
        for s in range(1000):
            mon.step_boundary()
            steps.append(s)
            time.sleep(0.005)

    inbox.deliver_command(_cmd("pause"))
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(0.2)
    assert steps == []
    # resume and pause again before the training thread gets to look
    inbox.deliver_command(_cmd("resume"))
    inbox.deliver_command(_cmd("pause"))
    time.sleep(0.3)
    assert len(steps) <= 1, "the second pause was missed"
    assert sum(1 for a in acks if a["action"] == "pause") == 2
    inbox.deliver_command(_cmd("resume"))
    time.sleep(0.3)
    assert len(steps) > 5
    mon.close()


def test_a_second_pause_of_a_paused_run_is_acknowledged():
    inbox = CommandInbox("p")
    acks = []
    inbox.on_ack = acks.append
    inbox.deliver_command(_cmd("pause"))
    second = _cmd("pause")
    inbox.deliver_command(second)
    assert any(a["command_id"] == second.id and "already paused" in a["detail"] for a in acks)

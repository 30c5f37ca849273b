"""alerts.dispatch with the in-memory stores: routing, grouping, inhibition, silences, the
outbox's retries, resolved notices, incidents, per-run enforcement, escalation of an
unacknowledged pause. Time is a fake clock; no Redis, no network."""

from __future__ import annotations

import logging

import pytest

from alerts.actions import Enforcement
from alerts.control import MemoryControl
from alerts.dispatch import Dispatcher
from alerts.escalation import MemoryAcks
from alerts.incidents import MemoryIncidents
from alerts.notifiers import PermanentDeliveryError
from alerts.outbox import MemoryOutbox
from alerts.routes_file import load_routes_text
from alerts.silences import MemorySilences, Silence
from tests.unit.alerts._helpers import T0, Clock, Recording, alert, down, run


def rig(routes: str | None = None, names=("slack", "hook"), batch=(), **kw):
    clock = Clock()
    notifiers = [Recording(n, batch=n in batch) for n in names]
    routing = load_routes_text(routes, list(names)) if routes else None
    control = kw.pop("control", MemoryControl())
    d = Dispatcher(notifiers, control, clock=clock, routing=routing,
                   outbox=kw.pop("outbox", MemoryOutbox()), silences=kw.pop("silences", MemorySilences()),
                   incidents=kw.pop("incidents", MemoryIncidents()), **kw)
    return d, clock, {n.name: n for n in notifiers}, control


def test_default_sends_every_alert_to_every_receiver_once():
    d, clock, n, control = rig()
    out = run(d.handle(alert()))
    assert sorted(out.delivered) == ["hook", "slack"] and not out.failed and not out.queued
    assert [c.action for c in out.commands] == ["pause", "snapshot"]
    assert run(control.status("ppo-8b-a")).state == "paused"
    again = run(d.handle(alert()))
    assert again.duplicate and not again.commands
    resolved = run(d.handle(alert(state="resolved", actions=[])))
    assert sorted(resolved.delivered) == ["hook", "slack"]
    assert n["slack"].keys() == [("kl_above_target", "red", "firing", 1204),
                                 ("kl_above_target", "red", "resolved", 1204)]
    assert n["slack"].sent[0][1] == ["pause", "snapshot"]


def test_commands_are_idempotent_across_a_redelivery():
    """The same alert handled twice (a crash before it was marked done) applies its commands once:
    the same ids, applied the first time only, published again the second."""
    d1, _, _, control = rig()
    d2, _, _, _ = rig(control=control)
    got = []
    control.subscribe("ppo-8b-a", got.append)
    a = run(d1.handle(alert())).commands
    b = run(d2.handle(alert())).commands
    assert [c.action for c in a] == ["pause", "snapshot"] and b == []
    assert [c["action"] for c in control.audit["ppo-8b-a"]] == ["pause", "snapshot"]
    assert [c.id for c in got] == [c.id for c in a] * 2


def test_a_failed_send_is_retried_from_the_outbox_and_sent_once():
    d, clock, n, _ = rig(retry_base=2.0)
    n["hook"].fail = down("HTTP 500")
    out = run(d.handle(alert()))
    assert out.delivered == ["slack"] and "hook" in out.failed and out.queued == ["hook"]
    assert run(d.outbox.pending("hook")) == 1
    run(d.tick(clock.advance(1.0)))                 # still backing off: not even tried
    assert n["hook"].attempts == 1
    clock.advance(1.5)
    run(d.tick())                                   # due, still down: back off 4 s
    assert n["hook"].attempts == 2 and not n["hook"].sent
    n["hook"].fail = None
    run(d.tick(clock.advance(4.5)))
    assert n["hook"].keys() == [("kl_above_target", "red", "firing", 1204)]
    for _ in range(3):
        run(d.tick(clock.advance(60)))
    assert len(n["hook"].sent) == 1 and len(n["slack"].sent) == 1
    assert run(d.outbox.pending()) == 0


def test_a_second_dispatcher_on_the_same_stores_sends_nothing_twice():
    outbox, control = MemoryOutbox(), MemoryControl()
    d1, clock, n1, _ = rig(outbox=outbox, control=control)
    n1["hook"].fail = down()
    run(d1.handle(alert()))
    d2, clock2, n2, _ = rig(outbox=outbox, control=control)   # "the restarted worker"
    assert run(d2.handle(alert())).duplicate
    clock2.t = clock.t + 5
    run(d2.tick())
    run(d1.tick(clock.t + 5))
    assert len(n2["hook"].sent) + len(n1["hook"].sent) == 1
    assert len(n1["slack"].sent) == 1 and not n2["slack"].sent


def test_a_refused_alert_goes_to_the_dead_letters():
    d, clock, n, _ = rig()
    n["hook"].fail = PermanentDeliveryError("HTTP 404")
    out = run(d.handle(alert()))
    assert "hook" in out.failed
    assert [i.key for i in run(d.outbox.dead("hook"))] == [f"{alert().fingerprint}:firing:1200"]
    assert run(d.outbox.pending("hook")) == 0


def test_give_up_after_a_day_of_failures():
    d, clock, n, _ = rig(give_up_after=3600)
    n["hook"].fail = down()
    run(d.handle(alert()))
    for _ in range(20):
        run(d.tick(clock.advance(300)))
    assert run(d.outbox.pending("hook")) == 0 and len(run(d.outbox.dead("hook"))) == 1


GROUPED = """
route:
  receiver: [slack, hook]
  group_by: [run]
  group_wait: 30s
  group_interval: 5m
inhibit_rules: []
"""


def test_group_wait_batches_a_groups_first_alerts():
    d, clock, n, _ = rig(GROUPED, batch=("slack",))
    out = run(d.handle(alert(rule="kl_above_target")))
    assert out.commands and not out.delivered and sorted(out.queued) == ["hook", "slack"]
    clock.advance(10)
    run(d.handle(alert(rule="entropy_collapse", severity="orange", actions=[])))
    run(d.handle(alert(rule="kl_above_target", run_id="ppo-other")))   # another group
    run(d.tick(clock.advance(15)))
    assert not n["slack"].sent                                           # 25 s: still waiting
    run(d.tick(clock.advance(6)))
    assert [len(b) for b in n["slack"].batches] == [2]                   # one message per group
    assert len(n["hook"].sent) == 2                                      # no batching: one each
    run(d.tick(clock.advance(10)))                                       # the other group's wait
    assert [len(b) for b in n["slack"].batches] == [2, 1] and len(n["hook"].sent) == 3
    # after the flush, the group waits group_interval for the next one
    run(d.handle(alert(rule="reward_hacking", severity="yellow", actions=[])))
    run(d.tick(clock.advance(200)))
    assert len(n["slack"].batches) == 2
    run(d.tick(clock.advance(101)))
    assert len(n["slack"].batches) == 3 and n["slack"].batches[-1][0].rule == "reward_hacking"


def test_group_wait_in_steps_is_released_by_the_runs_later_alerts():
    d, clock, n, _ = rig("route:\n  receiver: slack\n  group_by: [run]\n  group_wait: 10 steps\n",
                         names=("slack",), batch=("slack",))
    run(d.handle(alert(rule="a", step=100, onset_step=100)))
    run(d.handle(alert(rule="b", step=105, onset_step=105)))
    run(d.tick(clock.advance(5)))
    assert not n["slack"].sent
    run(d.handle(alert(rule="c", step=111, onset_step=111)))
    assert [[a.rule for a in b] for b in n["slack"].batches] == [["a", "b", "c"]]


STEP_GROUPED = "route:\n  receiver: [slack, hook]\n  group_by: [run]\n  group_wait: 10 steps\ninhibit_rules: []\n"


async def notified_together_and_alone(make_rig, routes: str) -> list:
    """What the receivers get of a few alerts (two groups, a group's later alert, a step
    that releases held items, a snapshot, a resolved alert) notified one at a time and
    together (``make_rig(routes)``: a dispatcher, its clock, its recording notifiers)."""
    import json

    alerts = [alert(rule="a", step=100, onset_step=100),
              alert(rule="b", step=105, onset_step=105, actions=[]),
              alert(rule="a", run_id="ppo-other", step=7, onset_step=7, actions=["snapshot"],
                    snapshot={"window": {"steps": [{"step": 7}]}}),
              alert(rule="c", step=111, onset_step=111, actions=[]),
              alert(rule="b", step=112, onset_step=105, state="resolved", actions=[])]
    seen = []
    for together in (False, True):
        d, clock, n = await make_rig(routes)
        try:
            if together:    # (the resolved one later: it would go with its firing one)
                outs = await d.notify_all(alerts[:4])
                await d.idle()
                outs += await d.notify_all(alerts[4:])
            else:       # (each alone: its receivers' passes over before the next comes)
                outs = []
                for a in alerts:
                    outs.append(await d.notify(a))
                    await d.idle()
            await d.idle()
            sent = []
            for _ in range(4):
                await d.tick(clock.advance(31))
                sent.append({r: [[(x.rule, x.run_id, x.state) for x in b] for b in n[r].batches] for r in n})
            inc = await d.incidents.get(outs[2].incident)
            seen.append(([(sorted(o.queued), o.incident, o.duplicate) for o in outs], sent,
                         json.dumps(inc["snapshot"]), await d.outbox.pending()))
            assert await d.notify_all([]) == []
        finally:
            await d.close()
    return seen


@pytest.mark.parametrize("routes", [GROUPED, STEP_GROUPED])
def test_alerts_notified_together_are_queued_grouped_and_sent_as_one_at_a_time(routes):
    # the worker notifies the alerts waiting together (one round trip to each store for all):
    # groups started by one alert hold for the next, held items are released by a later
    # step of their run, incidents are kept, and the receivers get what they got before
    async def make_rig(routes: str):
        d, clock, n, _ = rig(routes, batch=("slack",))
        return d, clock, n

    alone, together = run(notified_together_and_alone(make_rig, routes))
    assert alone == together
    assert together[1][-1]["slack"] and together[1][-1]["hook"], "nothing was sent"


def test_a_resolved_notice_in_the_pass_of_its_firing_one_goes_after_it_not_a_second_later():
    # alerts notified together put an alert's firing and resolved notices in one pass: the
    # resolved one goes right after the firing one (it waited for the next pass before)
    d, clock, n, _ = rig("route:\n  receiver: [slack, hook]\n  group_by: [run]\n  group_wait: 10 steps\n"
                         "inhibit_rules: []\n", batch=("slack",))
    fired = alert(rule="b", step=105, onset_step=105, actions=[])
    gone = alert(rule="b", step=106, onset_step=105, state="resolved", actions=[])
    async def go():
        await d.notify_all([fired, gone, alert(rule="c", step=120, onset_step=120, actions=[])])
        await d.idle()      # (the receivers' lanes, started by the notification)
    run(go())
    assert [[(a.rule, a.state) for a in b] for b in n["slack"].batches] == [
        [("b", "firing"), ("b", "resolved"), ("c", "firing")]]
    assert [(a.rule, a.state) for a, _ in n["hook"].sent] == [("b", "firing"), ("b", "resolved"), ("c", "firing")]
    assert run(d.outbox.pending()) == 0


def test_a_receivers_lane_goes_on_after_a_full_pass_until_nothing_is_due():
    # a pass takes at most PASS_ITEMS items: alerts notified together (more than that) all go
    # out from the one kick, not the rest only at the timer's next tick
    from alerts.delivery import PASS_ITEMS

    d, clock, n, _ = rig("route:\n  receiver: hook\ninhibit_rules: []\n", names=("hook",))
    many = [alert(rule=f"r{i}", actions=[]) for i in range(PASS_ITEMS + PASS_ITEMS // 2)]

    async def go():
        await d.notify_all(many)
        await d.idle()
    run(go())
    assert len(n["hook"].sent) == len(many) and run(d.outbox.pending()) == 0


def test_a_resolved_notice_is_skipped_where_its_firing_one_was_refused_in_the_same_pass():
    from alerts.notifiers import PermanentDeliveryError

    d, clock, n, _ = rig("route:\n  receiver: hook\ninhibit_rules: []\n", names=("hook",))
    n["hook"].fail = PermanentDeliveryError("HTTP 400: bad payload")
    fired = alert(rule="b", step=105, onset_step=105, actions=[])
    gone = alert(rule="b", step=106, onset_step=105, state="resolved", actions=[])
    async def go():
        await d.notify_all([fired, gone])
        await d.idle()
    run(go())
    assert n["hook"].attempts == 1 and not n["hook"].sent
    assert run(d.outbox.outcome("hook", "%s:resolved:105" % gone.fingerprint)) == "skipped"
    assert len(run(d.outbox.dead("hook"))) == 1 and run(d.outbox.pending()) == 0


def test_a_pass_reads_what_became_of_its_resolved_notices_firing_ones_at_once():
    # resolved notices whose firing ones went out in an earlier pass: one read for the pass,
    # not one per notice; one whose firing notice was never notified is skipped, one whose
    # firing notice is still queued waits
    asked: list = []

    class Counting(MemoryOutbox):
        async def outcome(self, receiver, key, variant=""):
            asked.append(("outcome", key))
            return await super().outcome(receiver, key, variant)

        async def outcomes(self, receiver, keys):
            asked.append(("outcomes", len(keys)))
            return await super().outcomes(receiver, keys)

    d, clock, n, _ = rig("route:\n  receiver: hook\ninhibit_rules: []\n", names=("hook",),
                         outbox=Counting())
    fired = [alert(rule=f"r{i}", step=100, onset_step=100, actions=[]) for i in range(5)]
    gone = [alert(rule=f"r{i}", step=110, onset_step=100, state="resolved", actions=[])
            for i in range(5)]
    never = alert(rule="quiet", step=110, onset_step=90, state="resolved", actions=[])

    async def go():
        await d.notify_all(fired)
        await d.idle()
        asked.clear()
        await d.notify_all([*gone, never])
        await d.idle()
    run(go())
    assert ("outcomes", 6) in asked and not [a for a in asked if a[0] == "outcome"], asked
    assert len([a for a, _ in n["hook"].sent if a.state == "resolved"]) == 5
    assert run(d.outbox.outcome("hook", "%s:resolved:90" % never.fingerprint)) == "skipped"


def test_group_wait_in_steps_does_not_hold_forever():
    d, clock, n, _ = rig("route:\n  receiver: slack\n  group_wait: 10 steps\n", names=("slack",),
                         step_hold=120)
    run(d.handle(alert(step=100, onset_step=100)))
    run(d.tick(clock.advance(119)))
    assert not n["slack"].sent
    run(d.tick(clock.advance(2)))
    assert len(n["slack"].sent) == 1


def test_repeat_interval_resends_what_still_fires():
    d, clock, n, _ = rig("route:\n  receiver: slack\n  repeat_interval: 1h\ninhibit_rules: []\n",
                         names=("slack",))
    run(d.handle(alert()))
    run(d.handle(alert(rule="other", severity="yellow", actions=[])))
    run(d.handle(alert(rule="other", severity="yellow", state="resolved", actions=[])))
    run(d.tick(clock.advance(1800)))
    assert len(n["slack"].sent) == 3
    run(d.tick(clock.advance(1801)))
    assert n["slack"].keys()[-1] == ("kl_above_target", "red", "firing", 1204) and len(n["slack"].sent) == 4
    run(d.tick(clock.advance(60)))
    assert len(n["slack"].sent) == 4                                     # not again before an hour


def test_a_tick_reads_the_active_runs_steps_once_for_repeats_counted_in_steps():
    # a fleet's tick asks the store for every active run's newest step in one read, not one per
    # alert and receiver; each run's repeat is counted on its own step
    reads: list = []

    class Counting(MemoryOutbox):
        async def run_step(self, run_id):
            reads.append(("run_step", run_id))
            return await super().run_step(run_id)

        async def run_steps(self, run_ids):
            reads.append(("run_steps", tuple(run_ids)))
            return await super().run_steps(run_ids)

    d, clock, n, _ = rig("route:\n  receiver: [slack, hook]\n  repeat_interval: 50 steps\n"
                         "inhibit_rules: []\n", outbox=Counting())
    for r in ("run-a", "run-b", "run-c"):
        run(d.handle(alert(run_id=r, step=100, onset_step=100, actions=[])))
    # run-b goes on to step 160, the others only to step 120
    for r, step in (("run-a", 120), ("run-b", 160), ("run-c", 120)):
        run(d.handle(alert(rule="other", run_id=r, step=step, onset_step=step, actions=[])))
    sent = len(n["slack"].sent)
    reads.clear()
    run(d.tick(clock.advance(5)))
    assert reads == [("run_steps", ("run-a", "run-b", "run-c"))], reads
    again = [a.run_id for a, _ in n["slack"].sent[sent:]]
    assert again == ["run-b"]                 # 60 steps on since its notice; the others 20


INHIBIT = "route: {receiver: [slack, hook]}\n"   # a file without inhibit_rules: the defaults


def test_a_red_alert_mutes_the_runs_lower_tiers_but_not_their_commands():
    d, clock, n, control = rig(INHIBIT)
    run(d.handle(alert(severity="red")))
    out = run(d.handle(alert(rule="entropy_collapse", severity="yellow", actions=["pause"])))
    assert out.suppressed == {"slack": "inhibited", "hook": "inhibited"} and not out.delivered
    assert [c.action for c in out.commands] == ["pause"]                 # the brake is never muted
    other = run(d.handle(alert(rule="entropy_collapse", severity="yellow", run_id="ppo-b", actions=[])))
    assert sorted(other.delivered) == ["hook", "slack"]
    # its resolved notice is not sent either (its firing one never was)
    res = run(d.handle(alert(rule="entropy_collapse", severity="yellow", state="resolved", actions=[])))
    assert res.suppressed == {"slack": "skipped", "hook": "skipped"}
    # once the red resolves, new lower-tier alerts go out again
    run(d.handle(alert(severity="red", state="resolved", actions=[])))
    back = run(d.handle(alert(rule="entropy_collapse", severity="yellow", step=1300, onset_step=1290, actions=[])))
    assert sorted(back.delivered) == ["hook", "slack"]


def test_an_inhibition_rule_across_runs_still_sees_the_whole_fleets_firing_alerts():
    """The default rules compare alerts of one run, so a notification reads its run's firing
    alerts only; a rule whose ``equal`` does not name the run reads the fleet's."""
    fleet_wide = ("route: {receiver: [slack, hook]}\ninhibit_rules:\n"
                  "  - {source: {severity: red}, target: {severity: yellow}, equal: [rule]}\n")
    d, clock, n, control = rig(fleet_wide)
    run(d.handle(alert(severity="red")))
    other = run(d.handle(alert(severity="yellow", run_id="ppo-b", actions=[])))
    assert other.suppressed == {"slack": "inhibited", "hook": "inhibited"}
    d, clock, n, control = rig(INHIBIT)       # the defaults: another run's red mutes nothing here
    run(d.handle(alert(severity="red")))
    other = run(d.handle(alert(severity="yellow", run_id="ppo-b", actions=[])))
    assert sorted(other.delivered) == ["hook", "slack"]


def test_silences_mute_matching_alerts_until_they_expire():
    silences = MemorySilences()
    d, clock, n, control = rig(silences=silences)
    run(silences.add(Silence(matchers={"run": "ppo-*", "severity": "<=red"}, starts_at=T0, ends_at=T0 + 3600)))
    out = run(d.handle(alert()))
    assert out.suppressed == {"slack": "silenced", "hook": "silenced"}
    assert [c.action for c in out.commands] == ["pause", "snapshot"]
    assert sorted(run(d.handle(alert(severity="black", rule="nan_inf"))).delivered) == ["hook", "slack"]
    clock.advance(3601)
    assert sorted(run(d.handle(alert(rule="x", step=2000, onset_step=2000))).delivered) == ["hook", "slack"]


def test_a_silence_added_while_a_receiver_is_down_applies_to_what_is_queued():
    silences = MemorySilences()
    d, clock, n, _ = rig(silences=silences)
    n["hook"].fail = down()
    run(d.handle(alert()))
    run(silences.add(Silence(matchers={"rule": "kl_*"}, starts_at=clock.t, ends_at=clock.t + 600)))
    n["hook"].fail = None
    run(d.tick(clock.advance(5)))
    assert not n["hook"].sent and run(d.outbox.pending()) == 0
    assert run(d.outbox.outcome("hook", f"{alert().fingerprint}:firing:1200")) == "silenced"


def test_a_resolved_notice_waits_for_its_firing_one():
    d, clock, n, _ = rig(names=("hook",), retry_base=10)
    n["hook"].fail = down()
    run(d.handle(alert()))
    run(d.handle(alert(state="resolved", actions=[])))
    n["hook"].fail = None
    for _ in range(4):
        run(d.tick(clock.advance(6)))
    assert [k[2] for k in n["hook"].keys()] == ["firing", "resolved"]


def test_per_run_enforcement_keeps_actions_advisory_and_says_so():
    d, clock, n, control = rig("""
route: {receiver: [slack, hook]}
enforcement:
  - runs: "exp-*"
    advisory: [pause, stop]
""")
    out = run(d.handle(alert(run_id="exp-1")))
    assert [c.action for c in out.commands] == ["snapshot"] and out.advisory == ["pause"]
    assert run(control.status("exp-1")).state == "running"
    sent, done = n["slack"].sent[0]
    assert done == ["snapshot"] and sent.actions_advisory == ["pause"]
    out = run(d.handle(alert(run_id="ppo-1")))
    assert [c.action for c in out.commands] == ["pause", "snapshot"] and out.advisory == []


def test_the_global_enforcement_still_works_without_a_file():
    d = Dispatcher([Recording("x")], MemoryControl(), clock=Clock(),
                   enforcement=Enforcement.parse("pause"))
    out = run(d.handle(alert()))
    assert [c.action for c in out.commands] == ["snapshot"] and out.advisory == ["pause"]


def test_a_snapshot_alert_keeps_an_incident_and_notifications_stay_small():
    d, clock, n, _ = rig()
    a = alert().model_copy(update={"snapshot": {"window": {"steps": [{"step": 1199, "metrics": {"kl/mean": 0.05}}]}}})
    out = run(d.handle(a))
    inc = run(d.incidents.get(out.incident))
    assert inc["run_id"] == "ppo-8b-a" and inc["snapshot"]["window"]["steps"][0]["step"] == 1199
    assert inc["actions_taken"] == ["pause", "snapshot"]
    sent, _ = n["slack"].sent[0]
    assert sent.incident == out.incident and "snapshot" not in (sent.model_extra or {})
    assert [i["id"] for i in run(d.incidents.list())] == [out.incident]
    # no snapshot action: no incident
    assert run(d.handle(alert(rule="y", actions=["pause"]))).incident is None


def test_an_incident_holds_its_snapshot_as_the_store_reads_it_back():
    # the snapshot goes into the incident as JSON values (non-finite numbers as the contract's
    # strings, tuples as lists, keys as text), the same in memory (the demo) as from Redis
    import json
    import math

    from alerts.incidents import make_incident
    from contract.events import record_json, strict_json

    snap = {"window": {"steps": [{"step": 7, "metrics": {"kl/mean": math.nan, "x": math.inf,
                                                          "y": -math.inf, "z": 0.1 + 0.2}}]},
            "ranks": {3: (1.5, -0.0)}, "note": "żółw ✓"}
    inc = make_incident(alert(), snap, T0, ["pause"])
    assert inc["snapshot"]["window"]["steps"][0]["metrics"] == {"kl/mean": "NaN", "x": "Infinity",
                                                                "y": "-Infinity", "z": 0.1 + 0.2}
    assert inc["snapshot"]["ranks"] == {"3": [1.5, -0.0]} and inc["snapshot"]["note"] == "żółw ✓"
    assert inc["snapshot"] == json.loads(record_json(inc))["snapshot"] == json.loads(strict_json(snap))
    assert make_incident(alert(), None, T0, [])["snapshot"]["note"].startswith("no snapshot data")


def test_a_snapshot_read_as_its_text_gives_the_incident_a_snapshot_read_in_full_gives():
    # the worker's alerts lane reads an alert keeping its snapshot as the JSON text it came
    # in; the incident stored (Redis's text, the memory store's dict) is the same
    import json
    import math

    from alerts.incidents import incident_json, make_incident
    from contract.alert import Alert, Raw
    from contract.events import record_json

    snap = {"window": {"steps": [{"step": 7, "metrics": {"kl/mean": math.nan, "z": 0.1 + 0.2}}]},
            "ranks": {"3": {"value": -math.inf}}, "note": "żółw ✓"}
    line = alert().model_copy(update={"snapshot": snap}).to_json()
    d, *_ = rig()
    full, text = d._split(Alert.from_json(line)), d._split(Alert.from_json_keeping_snapshot(line))
    assert isinstance(text[1], Raw) and isinstance(full[1], dict)
    by_text, by_dict = (make_incident(a, s, T0, ["pause"]) for a, s in (text, full))
    assert json.loads(incident_json(by_text)) == json.loads(record_json(by_dict))
    assert json.loads(incident_json(by_dict)) == json.loads(record_json(by_dict))
    assert json.loads(incident_json(by_text))["snapshot"]["ranks"]["3"]["value"] == "-Infinity"
    # the memory store keeps what a store reads back
    for a, s in (text, full):
        d, *_ = rig()
        stored = run(d.incidents.get(run(d.notify(a, snapshot=s)).incident))
        want = json.loads(record_json(by_dict))
        assert (stored["snapshot"], stored["alert"]) == (want["snapshot"], want["alert"])
    # an empty snapshot's text is no snapshot, as an empty dict is
    empty = make_incident(text[0], Raw(b"{}"), T0, [])["snapshot"]
    assert empty == make_incident(text[0], {}, T0, [])["snapshot"] and "note" in empty


def test_an_unacknowledged_pause_escalates_one_tier_up_once():
    control = MemoryControl()
    d, clock, n, _ = rig(control=control, acks=MemoryAcks(control))
    run(d.handle(alert(actions=["pause"])))
    run(d.tick(clock.advance(59)))
    assert len(n["slack"].sent) == 1
    run(d.tick(clock.advance(2)))
    esc, _ = n["slack"].sent[-1]
    assert (esc.rule, esc.severity, esc.state, esc.run_id) == ("control_unacknowledged", "black", "firing", "ppo-8b-a")
    assert "pause" in esc.summary and "ppo-8b-a" in esc.summary and esc.labels["command"] == "pause"
    for _ in range(3):
        run(d.tick(clock.advance(30)))
    assert sum(a.rule == "control_unacknowledged" for a, _ in n["slack"].sent) == 1
    # the worker finally acknowledges: the escalation resolves
    cmd = control.audit["ppo-8b-a"][0]
    control.record_ack({"type": "ack", "command_id": cmd["id"], "run_id": "ppo-8b-a", "action": "pause",
                        "status": "applied", "ts": clock.t})
    run(d.tick(clock.advance(1)))
    assert n["slack"].keys()[-1] == ("control_unacknowledged", "black", "resolved", 1204)


class Lifecycle(Recording):
    """A receiver that keeps an alert open until it resolves (Alertmanager, PagerDuty)."""

    takes_notices = False


def test_an_acknowledged_pause_does_not_escalate_and_is_told_once_as_holding():
    """The worker's acknowledgement reaches the people who saw the alert at the next tick: a
    notice that the pause holds, which rank answered and when, sent once, to the receivers
    that take notices (not to one that keeps alerts open), and not muted by the red alert
    that pulled the brake."""
    control = MemoryControl()
    d, clock, n, _ = rig(control=control, acks=MemoryAcks(control))
    d.notifiers["pager"] = d.drainer.notifiers["pager"] = pager = Lifecycle("pager")
    d.routing = d.drainer.routing = load_routes_text(
        "route: {receiver: slack, routes: [{receiver: slack, continue: true}, "
        "{receiver: pager, continue: true}, {receiver: hook}]}", ["slack", "hook", "pager"])
    run(d.handle(alert(actions=["pause"])))
    cmd = control.audit["ppo-8b-a"][0]
    for rank in (3, 0, 2, 1):           # each rank of the run answers at its step boundary
        control.record_ack({"type": "ack", "command_id": cmd["id"], "run_id": "ppo-8b-a", "action": "pause",
                            "status": "applied", "rank": rank, "ts": clock.t + 1.2 + 0.1 * rank})
    run(d.tick(clock.advance(2)))
    for _ in range(3):
        run(d.tick(clock.advance(60)))
    assert [a.rule for a, _ in n["slack"].sent] == ["kl_above_target", "control_acknowledged"]
    assert [a.rule for a, _ in n["hook"].sent] == ["kl_above_target", "control_acknowledged"]
    assert [a.rule for a, _ in pager.sent] == ["kl_above_target"]
    note, done = n["slack"].sent[1]
    assert (note.severity, note.state, note.run_id, note.actions, done) == ("info", "firing", "ppo-8b-a", [], [])
    assert note.labels["command_id"] == cmd["id"] and note.labels["source_rule"] == "kl_above_target"
    assert (note.labels["ack_ranks"], note.labels["ack_status"], note.labels["run_state"]) == ("0-3", "applied", "paused")
    assert note.value == 1.5 and note.step == 1204          # to the last rank's answer
    assert note.summary == ("run ppo-8b-a: the pause for kl_above_target (red) holds: ranks 0-3 acknowledged it "
                            "1.5s after it was sent; the run is paused")


def test_a_brake_is_told_once_every_rank_of_the_run_answered_or_names_the_silent_ones():
    """Training processes put their run's world size in their acknowledgements: the notice
    waits for all of them (ranks answer at their own step boundaries, over more than one tick),
    and a rank still silent when the ack timeout passes is named; the brake is not said to
    hold then, nor escalated (a rank answered)."""
    control = MemoryControl()
    d, clock, n, _ = rig(control=control, acks=MemoryAcks(control))

    def answer(run_id, ranks):
        cmd = control.audit[run_id][0]
        for rank in ranks:
            control.record_ack({"type": "ack", "command_id": cmd["id"], "run_id": run_id, "action": "pause",
                                "status": "applied", "rank": rank, "world_size": 4, "ts": clock.t})

    run(d.handle(alert(actions=["pause"])))
    run(d.handle(alert(run_id="ppo-8b-b", actions=["pause"])))
    answer("ppo-8b-a", (0, 1))
    answer("ppo-8b-b", (0, 1, 2))
    run(d.tick(clock.advance(2)))
    assert [a.rule for a, _ in n["slack"].sent] == ["kl_above_target"] * 2     # ranks 2-3 of a: not yet
    answer("ppo-8b-a", (2, 3))
    run(d.tick(clock.advance(2)))
    notes = [a for a, _ in n["slack"].sent if a.rule == "control_acknowledged"]
    assert [a.run_id for a in notes] == ["ppo-8b-a"]
    assert notes[0].summary.startswith("run ppo-8b-a: the pause for kl_above_target (red) holds: ranks 0-3 of 4 "
                                       "acknowledged it")
    assert (notes[0].labels["ack_status"], notes[0].labels["ack_world"], notes[0].labels["ack_silent"]) == \
        ("applied", "4", "")
    for _ in range(4):
        run(d.tick(clock.advance(15)))
    notes = [a for a, _ in n["slack"].sent if a.rule == "control_acknowledged"]
    assert [a.run_id for a in notes] == ["ppo-8b-a", "ppo-8b-b"]
    b = notes[1]
    assert b.summary.startswith("run ppo-8b-b: the pause for kl_above_target (red) holds on 3 of 4 ranks: ranks 0-2 "
                                "acknowledged it") and b.summary.endswith("; rank 3 did not answer within 64s")
    assert (b.labels["ack_status"], b.labels["ack_silent"], b.labels["run_state"]) == ("partial", "3", "")
    assert not any(a.rule == "control_unacknowledged" for a, _ in n["slack"].sent)
    for _ in range(3):
        run(d.tick(clock.advance(30)))
    assert len([a for a, _ in n["slack"].sent if a.rule == "control_acknowledged"]) == 2


def test_a_rules_adjust_that_the_script_ignored_is_told_once_and_never_escalates():
    control = MemoryControl()
    d, clock, n, _ = rig(control=control, acks=MemoryAcks(control))
    run(d.handle(alert(severity="orange", actions=["notify", "adjust"], adjust={"beta": 1.5})))
    (cmd,) = [c for c in control.audit["ppo-8b-a"] if c["action"] == "adjust"]
    for _ in range(3):                                       # no answer yet: nothing said, ever
        run(d.tick(clock.advance(60)))
    assert [a.rule for a, _ in n["slack"].sent] == ["kl_above_target"]
    control.record_ack({"type": "ack", "command_id": cmd["id"], "run_id": "ppo-8b-a", "action": "adjust",
                        "status": "ignored", "detail": "no on_adjust callback", "rank": 0, "ts": clock.t})
    run(d.tick(clock.advance(2)))
    run(d.tick(clock.advance(2)))
    assert [a.rule for a, _ in n["slack"].sent] == ["kl_above_target", "control_acknowledged"]
    note = n["slack"].sent[1][0]
    assert note.summary == ("run ppo-8b-a: the adjust beta=1.5 for kl_above_target (orange): the run answered "
                            "ignored (rank 0): no on_adjust callback")


def test_a_brake_acknowledgement_is_retried_and_a_silence_of_the_run_mutes_it():
    control = MemoryControl()
    silences = MemorySilences()
    d, clock, n, _ = rig(control=control, acks=MemoryAcks(control), silences=silences)
    for run_id in ("ppo-8b-a", "ppo-8b-b"):
        run(d.handle(alert(run_id=run_id, actions=["pause"])))
        cmd = control.audit[run_id][0]
        control.record_ack({"type": "ack", "command_id": cmd["id"], "run_id": run_id, "action": "pause",
                            "status": "applied", "rank": 0, "ts": clock.t})
    run(silences.add(Silence(matchers={"run": "ppo-8b-b"}, starts_at=T0, ends_at=T0 + 3600)))
    n["slack"].fail = ConnectionError("slack down")
    run(d.tick(clock.advance(2)))
    assert [a.rule for a, _ in n["hook"].sent] == ["kl_above_target", "kl_above_target", "control_acknowledged"]
    assert n["hook"].sent[-1][0].run_id == "ppo-8b-a"           # the silenced run's is not sent
    n["slack"].fail = None
    for _ in range(5):
        run(d.tick(clock.advance(30)))
    got = [(a.rule, a.run_id) for a, _ in n["slack"].sent]
    assert got.count(("control_acknowledged", "ppo-8b-a")) == 1     # retried, once
    assert ("control_acknowledged", "ppo-8b-b") not in got


def test_the_escalation_follows_the_routes_of_its_tier():
    control = MemoryControl()
    d, clock, n, _ = rig("""
route:
  receiver: slack
  routes:
    - match: {severity: black}
      receiver: pager
ack_timeout: 10
""", names=("slack", "pager"), control=control, acks=MemoryAcks(control))
    run(d.handle(alert(actions=["pause"])))
    run(d.tick(clock.advance(11)))
    assert [a.rule for a, _ in n["pager"].sent] == ["control_unacknowledged"]
    assert [a.rule for a, _ in n["slack"].sent] == ["kl_above_target"]


def test_secrets_stay_out_of_the_logs(caplog):
    class Leaky(Recording):
        secrets = ("https://hooks.example/services/T0/B0/SECRET123",)

    leaky = Leaky("leaky")
    leaky.fail = down("POST https://hooks.example/services/T0/B0/SECRET123 answered 500")
    d = Dispatcher([leaky], None, clock=Clock())
    with caplog.at_level(logging.DEBUG):
        out = run(d.handle(alert()))
    assert caplog.records and "SECRET123" not in caplog.text and "SECRET123" not in str(out.failed)


def test_routes_must_name_configured_notifiers():
    routing = load_routes_text("route: {receiver: pager}", ["pager"])
    with pytest.raises(ValueError, match="pager"):
        Dispatcher([Recording("slack")], None, clock=Clock(), routing=routing)


def test_when_the_store_is_down_it_still_pages_directly(caplog):
    class DownOutbox(MemoryOutbox):
        async def track(self, alert, now):
            raise ConnectionError("Redis at 10.0.0.1:6379 unreachable")

    d, clock, n, control = rig(outbox=DownOutbox())
    with caplog.at_level(logging.ERROR):
        out = run(d.handle(alert()))
    assert sorted(out.delivered) == ["hook", "slack"] and "store" in out.failed
    assert [c.action for c in out.commands] == ["pause", "snapshot"]
    assert "straight to their receivers" in caplog.text


def test_when_the_outbox_fails_mid_way_it_pages_directly_once():
    class BrokenOutbox(MemoryOutbox):
        async def enqueue(self, item):
            raise ConnectionError("connection reset")

    d, clock, n, control = rig(outbox=BrokenOutbox())
    out = run(d.handle(alert()))
    assert sorted(out.delivered) == ["hook", "slack"] and "store" in out.failed
    assert len(control.audit["ppo-8b-a"]) == 2                # the brake went once, not twice


def test_a_receivers_retry_after_is_honoured_by_the_outbox():
    from alerts.notifiers import DeliveryError

    d, clock, n, _ = rig(names=("hook",), retry_base=1.0)
    n["hook"].fail = DeliveryError("HTTP 429", retry_after=20)
    run(d.handle(alert()))
    n["hook"].fail = None
    run(d.tick(clock.advance(19)))
    assert n["hook"].attempts == 1 and not n["hook"].sent
    run(d.tick(clock.advance(1.5)))
    assert len(n["hook"].sent) == 1


def test_the_timers_fleet_work_is_one_workers_per_turn():
    """Repeats and unacknowledged brakes read the whole fleet's state: of two workers sharing
    one store and ticking every 2 s (turns of 1.8 s), one does that work per turn, the other's
    tick only drains; a worker alone keeps every turn. The work itself is done as before: a
    repeat is queued once when due."""
    from alerts.outbox import takes_turn

    assert takes_turn(None, 5.0, 1.8) and not takes_turn(5.0, 6.7, 1.8) and takes_turn(5.0, 6.8, 1.8)
    assert takes_turn(5.0, 4.0, 1.8)        # a clock behind the last taker's: both work, never neither
    scans: list = []

    class Counting(MemoryOutbox):
        async def clocks(self):
            scans.append(self.worker)
            return await super().clocks()

    shared = Counting()
    routes = "route:\n  receiver: hook\n  repeat_interval: 30s\ninhibit_rules: []\n"
    d1, clock, n, control = rig(routes, names=("hook",), outbox=shared, fleet_turn=1.8)
    d2, _, n2, _ = rig(routes, names=("hook",), outbox=shared, control=control, fleet_turn=1.8)
    run(d1.handle(alert(actions=[])))
    t0 = clock.t
    for t in range(0, 40, 2):       # both tick every 2 s, d2 half a second after d1
        shared.worker = 1
        run(d1.tick(t0 + t))
        shared.worker = 2
        run(d2.tick(t0 + t + 0.5))
    assert scans == [1] * 20
    repeats = [a for a, _ in n["hook"].sent + n2["hook"].sent]
    assert len(repeats) == 2        # the notice, and its repeat 30 s later

    alone, clock, n, _ = rig(routes, names=("hook",), outbox=Counting(), fleet_turn=1.8)
    alone.outbox.worker = 3
    scans.clear()
    for t in range(0, 20, 2):
        run(alone.tick(clock.t + t))
    assert scans == [3] * 10

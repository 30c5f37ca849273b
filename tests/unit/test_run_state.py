"""RunState, the one owner of per-run state: relaunch (incarnation), limits with one-line
dead-letter reasons, and the run summary the dashboard and /metrics read."""

from __future__ import annotations

import json
import textwrap

import pytest

from contract.events import MAX_STEP, EventError, parse_event
from rules.loader import load_pack_text
from streams.processor import Pipeline, Processor
from streams.run import MAX_RUN_TAGS, MAX_STEP_JUMP, MAX_SUMMARY_BYTES, MAX_TS_AGE
from tests.unit._core import T0, feed_series, firing, only_rules, resolved, rlhf_pack


def ev(run, step, metrics, ts=None, **extra):
    raw = {"schema": 1, "kind": "step", "run_id": run, "step": step,
           "ts": T0 + step if ts is None else ts, "metrics": metrics}
    raw.update(extra)
    return parse_event(raw, T0)


def feed(p, events, now=None):
    out = []
    for e in events:
        out += p.feed(e, e.ts if now is None else now)
    return out


# -- relaunch ----------------------------------------------------------------------------------

def test_a_new_incarnation_closes_the_open_alerts_and_watches_the_run_afresh():
    p = Pipeline(only_rules("kl_above_target"))
    first = feed(p, [ev("r", s, {"kl/mean": 0.02 if s < 20 else 0.5}, incarnation="a1")
                     for s in range(25)])
    # (the info notice of the jump itself closed at the next step)
    opened = [a for a in firing(first, "kl_above_target") if a.severity != "info"]
    assert {a.severity for a in opened} == {"yellow", "red", "black"}
    # the program restarts from step 0 (a checkpoint of step 0) with a new incarnation
    again = feed(p, [ev("r", s, {"kl/mean": 0.02}, ts=T0 + 100 + s, incarnation="b2")
                     for s in range(5)])
    closed = resolved(again, "kl_above_target")
    assert {a.fingerprint for a in closed} == {a.fingerprint for a in opened}
    assert all("relaunched" in a.summary for a in closed)
    st = p.runs["r"]
    assert st.incarnation == "b2" and st.last_step[0] == 4 and not st.alerts
    # steps 0..4 were watched (not dropped as old steps), and the windows started over:
    # the 3-step median of KL does not remember the 0.5 of the old incarnation
    after = feed(p, [ev("r", s, {"kl/mean": 0.02}, ts=T0 + 100 + s, incarnation="b2")
                     for s in range(5, 8)])
    assert after == []
    blowup = feed(p, [ev("r", s, {"kl/mean": 0.5}, ts=T0 + 100 + s, incarnation="b2")
                      for s in range(8, 12)])
    assert {a.severity for a in firing(blowup)} == {"info", "red", "black"}


def test_the_same_incarnation_keeps_treating_old_steps_as_duplicates():
    p = Pipeline(only_rules("nan_inf"))
    feed(p, [ev("r", s, {"x": 1.0}, incarnation="a") for s in range(50)])
    late = feed(p, [ev("r", 3, {"x": "NaN"}, incarnation="a")])
    assert late == [] and p.runs["r"].duplicates == 1


def test_without_incarnation_a_step_far_back_with_a_newer_time_is_a_relaunch():
    p = Pipeline(only_rules("nan_inf"))
    before = feed(p, [ev("r", s, {"loss/value": 1.0 if s < 40 else "NaN"}) for s in range(50)])
    assert firing(before, "nan_inf")
    # restarted program: step 0 again, a time after every event seen so far
    again = feed(p, [ev("r", s, {"loss/value": 1.0 if s != 3 else "NaN"}, ts=T0 + 1000 + s)
                     for s in range(5)])
    assert [a.state for a in again] == ["resolved", "firing", "resolved"]
    assert "relaunched" in again[0].summary and again[1].step == 3


def test_without_incarnation_a_redelivered_old_step_is_not_a_relaunch():
    p = Pipeline(only_rules("nan_inf"))
    feed(p, [ev("r", s, {"x": 1.0}) for s in range(50)])
    # Kafka re-delivers step 5 after a worker restart: its time is the old one
    assert feed(p, [ev("r", 5, {"x": "NaN"})]) == []
    assert p.runs["r"].last_step[0] == 49


START_RATIO = """
    rules:
      - id: fell
        params: {ratio: 0.5}
        tiers:
          - severity: orange
            when: {metric: m, signal: ratio_to_start, window: 30, below: ratio}
            for: 3
    """


def hb(run, step, ts, **extra):
    return parse_event({"schema": 1, "kind": "heartbeat", "run_id": run, "step": step, "ts": ts,
                        **extra}, T0)


def test_a_run_relaunched_from_a_checkpoint_is_judged_against_its_own_start():
    """Preempted at step 420 and resumed from the checkpoint of step 400 (a new incarnation whose
    first word is a heartbeat of the SDK's step 0): the metric, 1.0 over the warm-up and
    sliding since, falls under half of it at step 531. Started afresh at step 401, the run's
    warm-up would be 0.62 and the fall to half of that 180 steps further on."""
    p = Pipeline(load_pack_text(textwrap.dedent(START_RATIO), "start.yaml"))

    def m(s):
        return {"m": 1.0 if s < 30 else 1.0 - 0.001 * (s - 30)}

    t = T0
    for s in range(421):
        t += 1
        p.feed(ev("r", s, m(s), ts=t, incarnation="a"), t)
    st = p.runs["r"]
    t += 30
    assert p.feed(hb("r", 0, t, incarnation="b"), t) == [] and st.incarnation == "a"
    fired = []
    for s in range(401, 600):
        t += 1
        fired += firing(p.feed(ev("r", s, m(s), ts=t, incarnation="b"), t), "fell")
    assert st.incarnation == "b" and st.first_step == 0
    assert [a.step for a in fired] == [535]


def test_a_relaunch_from_a_checkpoint_closes_the_open_alerts_and_drops_the_steps_it_left():
    """Alerts open before a preemption close with "relaunched from a checkpoint"; the windows
    lose the points after the checkpoint (a KL blow-up of steps 60-85 that the checkpoint of
    step 50 predates), so the resumed run is not alarmed again by them."""
    p = Pipeline(only_rules("kl_above_target"))
    t, first = T0, []
    for s in range(86):
        t += 1
        first += p.feed(ev("r", s, {"kl/mean": 0.02 if s < 60 else 0.5}, ts=t, incarnation="a"), t)
    opened = [a for a in firing(first, "kl_above_target") if a.severity != "info"]
    assert {a.severity for a in opened} == {"yellow", "red", "black"}
    t += 60
    again = p.feed(ev("r", 51, {"kl/mean": 0.02}, ts=t, incarnation="b"), t)
    closed = resolved(again, "kl_above_target")
    assert {a.fingerprint for a in closed} == {a.fingerprint for a in opened}
    assert all("relaunched from a checkpoint (step 51)" in a.summary for a in closed)
    later = []
    for s in range(52, 90):
        t += 1
        later += p.feed(ev("r", s, {"kl/mean": 0.02}, ts=t, incarnation="b"), t)
    assert firing(later) == [], [(a.rule, a.severity, a.step) for a in later]


def _rolled_back_from_a_kl_blowup(p, until: int) -> tuple[list, list]:
    """KL blows up at steps 60-85; the SDK's heartbeat then rolls the run back to step 40, and
    its new timeline is healthy up to ``until``: (the alerts before, the alerts after)."""
    t, first, later = T0, [], []
    for s in range(86):
        t += 1
        first += p.feed(ev("rb", s, {"kl/mean": 0.02 if s < 60 else 0.5}, ts=t,
                           tags={"generation": "0"}), t)
    t += 1
    p.feed(hb("rb", 40, t, tags={"generation": "1"}), t)
    for s in range(41, until):
        t += 1
        later += p.feed(ev("rb", s, {"kl/mean": 0.02}, ts=t, tags={"generation": "1"}), t)
    return first, later


def test_a_rollback_announced_by_its_heartbeat_does_not_judge_the_new_timeline_by_the_old():
    """The SDK's first word after a rollback is a heartbeat naming the step gone back to: the
    KL blow-up of steps 60-85 is no longer in the windows the new timeline's steps are read in
    (they were: its first steps read a median KL of 0.26 and fired red and black, a stop)."""
    _, later = _rolled_back_from_a_kl_blowup(Pipeline(only_rules("kl_above_target")), 70)
    assert firing(later) == [], [(a.rule, a.severity, a.step) for a in firing(later)]


EMA_RULE = """
    rules:
      - id: kl_ema_high
        params: {cap: 0.1}
        tiers:
          - severity: orange
            when: {metric: kl/mean, signal: ema, window: 20, above: cap}
            for: 3
    """


def test_a_rollback_takes_a_signal_ema_back_to_the_checkpoint():
    """A user rule on a 20-step EMA of KL: after a rollback from a blow-up (steps 60-85) to the
    checkpoint of step 40, the EMA is worked out again over the steps it keeps; it held the
    blow-up and fired again on the healthy new timeline."""
    first, later = _rolled_back_from_a_kl_blowup(
        Pipeline(load_pack_text(textwrap.dedent(EMA_RULE), "ema.yaml")), 60)
    assert firing(first, "kl_ema_high")
    assert firing(later) == [], [(a.rule, a.step, a.value) for a in later]


def test_a_rollback_from_a_length_hacking_episode_does_not_keep_its_correlation():
    """Rewards following the answers' length at steps 30-59 (a rank correlation of 1) set off
    reward_length_corr; after a rollback to step 20 the new timeline's rewards do not follow
    length, and its correlation is read from its own steps: three steps on, it read 0.7, most
    of it the episode's."""
    p = Pipeline(only_rules("reward_length_corr"))
    lengths = [100.0 + 10 * i for i in range(16)]
    t, first = T0, []
    for s in range(60):
        t += 1
        follow = s >= 30
        rewards = [i / 16 if follow else ((i * 7) % 16) / 16 for i in range(16)]
        first += p.feed(ev("lh", s, {"reward/mean": 0.5}, ts=t, tags={"generation": "0"},
                           dists={"reward": rewards, "response_length": lengths}), t)
    assert firing(first, "reward_length_corr")
    t += 1
    p.feed(hb("lh", 20, t, tags={"generation": "1"}), t)
    later = []
    for s in range(21, 24):
        t += 1
        rewards = [((i * 7) % 16) / 16 for i in range(16)]
        later += p.feed(ev("lh", s, {"reward/mean": 0.5}, ts=t, tags={"generation": "1"},
                           dists={"reward": rewards, "response_length": lengths}), t)
    (num, den, _), = p.runs["lh"].corr_ema.values()
    assert abs(num / den) < 0.3 and firing(later) == []


def test_a_step_count_that_starts_over_under_the_same_incarnation_is_watched_afresh():
    """A script that trains a second phase with the same Monitor counts its steps from 0 again,
    at later times: those steps were dropped as duplicates, and a KL blow-up in them never
    alarmed. A message Kafka delivers again (its old time) is still a duplicate."""
    p = Pipeline(only_rules("kl_above_target"))
    first = feed(p, [ev("r", s, {"kl/mean": 0.02 if s < 90 else 0.5}, incarnation="a")
                     for s in range(100)])
    assert firing(first, "kl_above_target")
    assert feed(p, [ev("r", 5, {"kl/mean": 0.9}, incarnation="a")]) == []
    assert p.runs["r"].duplicates == 1
    again = feed(p, [ev("r", s, {"kl/mean": 0.02 if s < 20 else 0.5}, ts=T0 + 1000 + s,
                        incarnation="a") for s in range(40)])
    closed = [a for a in resolved(again, "kl_above_target") if a.step == 0]
    assert {a.fingerprint for a in closed} == {a.fingerprint for a in firing(first)
                                               if a.severity != "info"}
    assert all("the run's steps started over" in a.summary for a in closed)
    assert {a.severity for a in firing(again, "kl_above_target")} >= {"red", "black"}
    assert p.runs["r"].duplicates == 1 and p.runs["r"].last_step[0] == 39


def _two_programs(p, run="shared", blowup_from=60, seconds=90):
    """Program a trains 100 steps, then program b starts under the same run id (its own
    incarnation, from step 0) while a goes on: one step of each per second, b's KL blowing up
    from its step ``blowup_from``. The alerts, the time after the last event."""
    out, t = [], T0
    for s in range(100):
        t += 1
        out += p.feed(ev(run, s, {"kl/mean": 0.02}, ts=t, incarnation="a"), t)
    for i in range(seconds):
        t += 1
        out += p.feed(ev(run, i, {"kl/mean": 0.5 if i >= blowup_from else 0.02}, ts=t,
                         incarnation="b"), t)
        out += p.feed(ev(run, 100 + i, {"kl/mean": 0.02}, ts=t + 0.5, incarnation="a"), t + 0.5)
    return out, t


def test_two_programs_under_one_run_id_do_not_relaunch_it_at_every_switch():
    """Each event of the other program relaunched the run (its statistics rewound or reset, its
    alerts closed): program b's KL blow-up never reached red. The run now follows the program
    that took it over, drops the other's events (strays) and says once that two programs share
    its id."""
    p = Pipeline(only_rules("kl_above_target"))
    out, _ = _two_programs(p)
    st = p.runs["shared"]
    assert st.incarnation == "b" and st.last_step[0] == 89 and st.strays == 90
    assert {a.severity for a in firing(out, "kl_above_target") if a.step >= 60} >= {"red", "black"}
    assert not [a for a in out if "relaunched" in a.summary and a.step > 0]
    shared = firing(out, "run_id_shared")
    assert len(shared) == 1 and shared[0].severity == "orange" and shared[0].actions == ["notify"]
    # (a's events sent within a minute of the takeover may be its last buffered ones)
    assert shared[0].ts > T0 + 100 + 60
    assert "incarnation a" in shared[0].summary and "follows b" in shared[0].summary
    assert {a["rule"] for a in st.summary()["open_alerts"]} >= {"run_id_shared"}
    assert st.summary()["strays"] == 90


def test_a_relaunched_programs_last_buffered_events_are_strays_without_a_notice():
    """The program relaunched over sends its last buffered steps (older times) after the new
    one's first step: they are dropped, and neither relaunch the run back nor notify."""
    p = Pipeline(only_rules("kl_above_target"))
    feed(p, [ev("r", s, {"kl/mean": 0.02}, incarnation="a") for s in range(50)])
    t = T0 + 60
    p.feed(ev("r", 45, {"kl/mean": 0.02}, ts=t, incarnation="b"), t)
    late = feed(p, [ev("r", s, {"kl/mean": 0.9}, ts=T0 + s, incarnation="a") for s in range(50, 53)],
                now=t + 1)
    st = p.runs["r"]
    assert late == [] and st.incarnation == "b" and st.strays == 3 and st.last_step[0] == 45


def test_a_stray_program_takes_the_run_back_once_the_other_is_quiet():
    """The program that took the run over stops (a short test under the same run id): five
    minutes later the other's events are a relaunch again, and the notice closes with it."""
    p = Pipeline(only_rules("kl_above_target"))
    out, t = _two_programs(p, blowup_from=10**6)
    assert firing(out, "run_id_shared")
    t += 301
    back = p.feed(ev("shared", 300, {"kl/mean": 0.02}, ts=t, incarnation="a"), t)
    st = p.runs["shared"]
    assert st.incarnation == "a" and st.retired[0] == "b" and st.last_step[0] == 300
    assert [a.summary for a in resolved(back, "run_id_shared")] == [
        "run_id_shared closed: the run was relaunched from a checkpoint (step 300)"]
    # b is now the stray one
    assert p.feed(ev("shared", 200, {"kl/mean": 0.9}, ts=t + 1, incarnation="b"), t + 1) == []


def test_the_stray_programs_other_ranks_are_dropped_on_the_workers_path_too():
    """Ranks other than 0 take the native routine path (Pipeline.feed_raw, as the worker): a
    stray program's rank-1 steps are declined there and dropped as strays, not taken."""
    p = Pipeline(only_rules("kl_above_target"))

    def raw(step, rank, inc, t):
        return json.dumps({"schema": 1, "kind": "step", "run_id": "w", "step": step, "rank": rank,
                           "world_size": 2, "ts": t, "incarnation": inc,
                           "metrics": {"kl/mean": 0.02}}).encode()
    t = T0
    for s in range(30):
        t += 1
        for r in (0, 1):
            p.feed_raw(raw(s, r, "a", t), t)
    t += 1
    p.feed_raw(raw(0, 0, "b", t), t)
    before = p.runs["w"].strays
    t += 100
    out = p.feed_raw(raw(30, 1, "a", t), t)
    st = p.runs["w"]
    assert st.incarnation == "b" and st.strays == before + 1 and st.last_step.get(1) is None
    assert [a.rule for a in out] == ["run_id_shared"]


def test_a_restored_run_remembers_the_programs_it_was_relaunched_from():
    p = Pipeline(only_rules("kl_above_target"))
    _, t = _two_programs(p, blowup_from=10**6, seconds=20)
    st = p.runs["shared"]
    back = type(st).from_state(json.loads(json.dumps(st.to_state())), p.processor.resolve)
    assert (back.retired, back.took_over_ts, back.strays) == (["a"], st.took_over_ts, 20)
    t += 1
    assert back.apply(ev("shared", 130, {"kl/mean": 0.02}, ts=t, incarnation="a"), t) == []
    assert back.incarnation == "b" and back.strays == 21


def test_a_step_count_that_starts_over_keeps_the_programs_rollback_count():
    """The same program after two rollbacks (generation 2) counts its steps from 0 again: its
    next steps, still of generation 2, are no third rollback (which would go back again)."""
    p = Pipeline(only_rules("kl_above_target"))
    feed(p, [ev("g", s, {"kl/mean": 0.02}, incarnation="a", tags={"generation": "2"})
             for s in range(100)])
    st = p.runs["g"]
    assert st.generation == 2
    again = feed(p, [ev("g", s, {"kl/mean": 0.02 if s < 20 else 0.5}, ts=T0 + 1000 + s,
                        incarnation="a", tags={"generation": "2"}) for s in range(40)])
    assert st.generation == 2 and not [a for a in again if "rolled back" in a.summary]
    assert {a.severity for a in firing(again, "kl_above_target")} >= {"red", "black"}


def test_a_rollback_whose_first_word_is_a_step_says_it_rolled_back():
    p = Pipeline(only_rules("kl_above_target"))
    t, first = T0, []
    for s in range(86):
        t += 1
        first += p.feed(ev("rb", s, {"kl/mean": 0.02 if s < 60 else 0.5}, ts=t, incarnation="a",
                           tags={"generation": "0"}), t)
    t += 1
    back = p.feed(ev("rb", 41, {"kl/mean": 0.02}, ts=t, incarnation="a", tags={"generation": "1"}), t)
    assert back and all("rolled back to a checkpoint" in a.summary for a in resolved(back))


def test_a_relaunch_survives_a_state_round_trip():
    proc = Processor(rlhf_pack())
    st = proc.new_state("r")
    for s in range(10):
        proc.process(st, ev("r", s, {"kl/mean": 0.02}, incarnation="one"), T0 + s)
    st2 = proc.load_state(json.loads(json.dumps(st.to_state())))
    assert st2.incarnation == "one"
    assert proc.process(st2, ev("r", 10, {"kl/mean": 0.02}, incarnation="one"), T0 + 10) == []
    assert st2.last_step[0] == 10


# -- limits ------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [2**53 + 1, 2**63, 10**308])
def test_a_step_beyond_2_53_is_rejected_with_a_reason(step):
    with pytest.raises(EventError) as info:
        parse_event(json.dumps({"schema": 1, "kind": "step", "run_id": "r", "step": step}), T0)
    assert "step" in info.value.reason and "\n" not in info.value.reason


def test_a_poisoned_step_far_ahead_is_rejected_and_does_not_blind_the_run():
    p = Pipeline(only_rules("kl_above_target"))
    feed(p, [ev("r", s, {"kl/mean": 0.02}) for s in range(20)])
    with pytest.raises(EventError) as info:
        p.feed(ev("r", MAX_STEP, {"kl/mean": 0.02}), T0 + 20)
    assert "ahead" in info.value.reason and str(MAX_STEP_JUMP) in info.value.reason
    # a real KL blow-up right after it is still seen
    blowup = feed(p, [ev("r", s, {"kl/mean": 0.5}) for s in range(20, 24)])
    assert {a.severity for a in firing(blowup)} >= {"red", "black"}


def test_a_first_event_with_a_huge_step_does_not_blind_the_run_either():
    p = Pipeline(only_rules("kl_above_target"))
    feed(p, [ev("r", MAX_STEP - 1, {"kl/mean": 0.02}, ts=T0)])
    # the real steps come afterwards with later times: the run started over (under its line:
    # a run over it from its first steps has a setup to check and is never braked)
    out = feed(p, [ev("r", s, {"kl/mean": 0.02 if s < 5 else 0.5}, ts=T0 + 10 + s) for s in range(10)])
    assert {a.severity for a in firing(out)} >= {"red", "black"}


def test_a_timestamp_that_is_not_epoch_seconds_is_replaced_by_the_receive_time():
    p = Pipeline(rlhf_pack())
    now = T0 + 5000
    # relative seconds since the start of training, not epoch seconds
    for s in range(3):
        p.feed(ev("rel", s, {"kl/mean": 0.02}, ts=12.5 + s), now + s)
    st = p.runs["rel"]
    assert st.last_event_ts == now + 2 and st.ts_replaced == 3
    # the liveness rule sees a live run, not one silent for 55 years
    assert p.tick(now + 60) == []
    stalled = p.tick(now + 2 + 301)
    assert [a.rule for a in firing(stalled)] == ["run_stalled"]
    # a timestamp within the limits is kept
    p.feed(ev("rel", 3, {"kl/mean": 0.02}, ts=now - MAX_TS_AGE / 2), now)
    assert st.ts_replaced == 3


def test_tags_per_run_are_bounded():
    p = Pipeline(only_rules("nan_inf"))
    for s in range(20):
        p.feed(ev("t", s, {"x": 1.0}, tags={f"k{s}-{i}": "v" for i in range(10)}), T0 + s)
    assert len(p.runs["t"].tags) == MAX_RUN_TAGS


@pytest.mark.parametrize("raw, word", [
    ({"metrics": {f"m{i}": 1.0 for i in range(5000)}}, "metrics"),
    ({"metrics": {"x" * 300: 1.0}}, "longer"),
    ({"tags": {f"t{i}": "v" for i in range(100)}}, "tags"),
    ({"tags": {"t": "v" * 2000}}, "longer"),
    ({"incarnation": "has space"}, "incarnation"),
    ({"incarnation": "x" * 65}, "incarnation"),
])
def test_oversized_parts_of_an_event_are_rejected_with_a_one_line_reason(raw, word):
    with pytest.raises(EventError) as info:
        parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": 1, **raw}, T0)
    assert word in info.value.reason and "\n" not in info.value.reason


def test_a_rank_beyond_the_limit_is_rejected():
    p = Pipeline(only_rules("nan_inf"))
    with pytest.raises(EventError, match="ranks per run"):
        p.feed(ev("r", 1, {"x": 1.0}, rank=50_000, world_size=60_000), T0)


# -- summary ------------------------------------------------------------------------------------

def test_summary_shape_and_numbers():
    p = Pipeline(rlhf_pack())
    values = [0.02] * 30 + [0.5] * 5
    for s, v in enumerate(values):
        p.feed(ev("sum", s, {"kl/mean": v, "ppo/clip_frac": 0.2, "reward/mean": 1.0},
                  tags={"algo": "ppo", "target.kl": "0.04"}, incarnation="inc-1",
                  world_size=1), T0 + s)
    s = p.runs["sum"].summary()
    assert len(json.dumps(s)) < 4096
    assert {"run_id", "incarnation", "generation", "last_step", "last_event_ts", "events",
            "world_size", "tags", "targets", "kl_lines", "open_alerts", "worst", "latest",
            "smoothed"} <= set(s)
    assert s["run_id"] == "sum" and s["incarnation"] == "inc-1" and s["last_step"] == 34
    assert s["events"] == 35 and s["tags"] == {"algo": "ppo"}
    assert s["targets"]["kl"] == 0.04                       # reported by the run
    assert s["kl_lines"] == pytest.approx({"yellow": 0.06, "red": 0.1, "black": 0.2})
    assert s["worst"] == "black"
    rules = {(a["rule"], a["severity"]) for a in s["open_alerts"]}
    assert ("kl_above_target", "black") in rules
    black = next(a for a in s["open_alerts"] if a["severity"] == "black")
    assert black["onset_step"] == 31 and black["threshold"] == pytest.approx(0.2)
    assert black["summary"] and "{" not in black["summary"]
    assert s["latest"]["kl/mean"] == 0.5


def test_a_summary_of_a_run_with_the_longest_tags_paths_and_alerts_stays_small():
    """Tags of 64 + 128 characters, checkpoint paths of 256, ten alerts open with long texts:
    up to 10 KB as it was, cut to MAX_SUMMARY_BYTES (the worst alerts and the newest checkpoint
    kept)."""
    p = Pipeline(rlhf_pack())
    tags = {f"{i:02d}" + "k" * 62: "v" * 128 for i in range(16)}
    for s in range(120):
        m = {"kl/mean": 0.02 if s < 60 else 0.9, "entropy/mean": 1.0 if s < 60 else 9.0,
             "reward/mean": 0.8 if s < 60 else -5.0, "grad_norm/actor": 1.0 if s < 60 else 500.0,
             "ppo/clip_frac": 0.2 if s < 60 else 0.9, "loss/value": 0.1 if s < 60 else 80.0,
             "response/truncated_frac": 0.0 if s < 60 else 0.9}
        p.feed(ev("big", s, m, tags=tags), T0 + s)
        if s % 5 == 0:
            p.feed(parse_event({"schema": 1, "kind": "checkpoint", "run_id": "big", "step": s,
                                "ts": T0 + s, "path": f"/{s:03d}" + "p" * 252}, T0 + s), T0 + s)
    st = p.runs["big"]
    assert sum(a.status == "firing" for a in st.alerts.values()) >= 8
    s = st.summary()
    assert len(json.dumps(s)) < MAX_SUMMARY_BYTES
    assert s["worst"] == "black" and s["open_alerts"][0]["severity"] == "black"
    assert s["checkpoints"][-1][0] == 115 and s["run_id"] == "big"


def test_summary_names_the_newest_checkpoints_and_where_a_rollback_for_each_alert_goes():
    """What `rlwatch rollback RUN` picks from: the run's newest checkpoints, and for each open
    alert the newest one before its onset (as a rule's rollback action picks it). A path too
    long to show is left out, not cut."""
    p = Pipeline(only_rules("kl_above_target"))
    for s in range(106):
        p.feed(ev("ck", s, {"kl/mean": 0.02 if s < 100 else 0.5}, tags={"target.kl": "0.04"}), T0 + s)
        if s % 5 == 0:
            path = f"/ckpt/step-{s}" if s != 100 else "/" + "d" * 2000
            p.feed(parse_event({"schema": 1, "kind": "checkpoint", "run_id": "ck", "step": s,
                                "ts": T0 + s, "path": path}, T0 + s), T0 + s)
    st = p.runs["ck"]
    s = st.summary()
    # the newest 16 it can show (step 100's path is too long): steps 25 ... 95 and 105
    assert s["checkpoints"] == [[k, f"/ckpt/step-{k}"] for k in [*range(25, 100, 5), 105]]
    assert {a["onset_step"] for a in s["open_alerts"]} == {100, 101}
    for a in s["open_alerts"]:
        if a["onset_step"] == 100:
            assert a["rollback_to"] == {"step": 95, "checkpoint": "/ckpt/step-95"}
        else:
            assert "rollback_to" not in a        # step 30's path is too long to show


@pytest.mark.parametrize("first", ["heartbeat", "step"])
def test_a_rollback_forgets_the_checkpoints_of_the_timeline_it_left(first):
    """Checkpoints 20..80, the KL blows up from step 60, the run rolls back to 40: a later
    rollback (a rule's, or an operator's with no alert open) must not go to 60 or 80, taken
    after the trouble began on a timeline the run left. The SDK's first word of the new
    timeline is its heartbeat naming step 40, or the step event of step 41."""
    p = Pipeline(only_rules("kl_above_target"))

    def ck(s, gen, t):
        p.feed(parse_event({"schema": 1, "kind": "checkpoint", "run_id": "rb", "step": s, "ts": t,
                            "path": f"/ck/g{gen}/{s}", "tags": {"generation": str(gen)}}, t), t)
    t = T0
    for s in range(86):
        t += 1
        p.feed(ev("rb", s, {"kl/mean": 0.02 if s < 60 else 0.5}, ts=t, tags={"generation": "0"}), t)
        if s and s % 20 == 0:
            ck(s, 0, t)
    st = p.runs["rb"]
    assert [c for c, _ in st.checkpoints] == [20, 40, 60, 80]
    t += 1
    if first == "heartbeat":
        p.feed(parse_event({"schema": 1, "kind": "heartbeat", "run_id": "rb", "step": 40, "ts": t,
                            "tags": {"generation": "1"}}, t), t)
    else:
        p.feed(ev("rb", 41, {"kl/mean": 0.02}, ts=t, tags={"generation": "1"}), t)
    assert st.checkpoints == [(20, "/ck/g0/20"), (40, "/ck/g0/40")] and not st.alerts
    assert st.summary()["checkpoints"] == [[20, "/ck/g0/20"], [40, "/ck/g0/40"]]
    assert st.checkpoint_before(70) == {"step": 40, "checkpoint": "/ck/g0/40"}
    for s in range(42, 62):       # the new timeline checkpoints again
        t += 1
        p.feed(ev("rb", s, {"kl/mean": 0.02}, ts=t, tags={"generation": "1"}), t)
        if s % 20 == 0:
            ck(s, 1, t)
    assert st.checkpoints == [(20, "/ck/g0/20"), (40, "/ck/g0/40"), (60, "/ck/g1/60")]


def test_summary_smoothed_values_are_the_ema_the_rules_read():
    p = Pipeline(only_rules("clip_frac_high"))
    for s in range(20):
        p.feed(ev("ema", s, {"ppo/clip_frac": 0.1 if s < 10 else 0.9}), T0 + s)
    st = p.runs["ema"]
    smoothed = st.summary()["smoothed"]["ppo/clip_frac"]
    track = st.banks[0].tracks[("ppo/clip_frac", 5)]      # smooth: 5 in clip_frac_high
    assert smoothed == track.smoothed() == track.values[-1]
    assert 0.1 < smoothed < 0.9
    # the orange tier compares that same number
    orange = firing(feed_series(Pipeline(only_rules("clip_frac_high")), "e2", "ppo/clip_frac",
                                [0.1] * 10 + [0.9] * 10), "clip_frac_high", "orange")[0]
    p2 = Pipeline(only_rules("clip_frac_high"))
    feed_series(p2, "e3", "ppo/clip_frac", ([0.1] * 10 + [0.9] * 10)[:orange.step + 1])
    assert orange.value == pytest.approx(p2.runs["e3"].summary()["smoothed"]["ppo/clip_frac"])


def test_summary_of_a_run_without_kl_rule_omits_the_kl_lines():
    p = Pipeline(only_rules("nan_inf"))
    p.feed(ev("n", 0, {"x": 1.0}), T0)
    s = p.runs["n"].summary()
    assert "kl_lines" not in s and s["worst"] is None and s["open_alerts"] == []


@pytest.mark.parametrize("via", ["feed", "feed_raw"])
def test_the_ranks_with_an_alert_state_of_their_own_are_known_as_their_states_come_and_go(via):
    """A rank whose own rules (the non-finite checks) hold keeps an alert state; the run knows
    which ranks have one (their finite steps are then evaluated, not skipped), and forgets a
    rank once its states are gone: after every event, what it knows is what its states say."""
    p = Pipeline(rlhf_pack())
    seen = set()
    for step in range(40):
        for rank in (0, 1):
            bad = rank == 1 and 10 <= step < 14
            loss = "NaN" if bad else 0.5
            raw = {"schema": 1, "kind": "step", "run_id": "r", "step": step, "rank": rank,
                   "world_size": 2, "ts": T0 + step,
                   "metrics": {"loss/policy": loss, "loss/value": 0.3, "reward/mean": 0.1}}
            if via == "feed":
                p.feed(parse_event(raw, T0), T0 + step)
            else:
                p.feed_raw(json.dumps(raw).encode(), T0 + step)
            st = p.runs["r"]
            have = {r for r in (0, 1) if r and any(k.endswith(f"/{r}") for k in st.alerts)}
            assert st._ranks_open == have, (step, rank, sorted(st.alerts))
            seen |= have
    assert seen == {1} and st._ranks_open == set()

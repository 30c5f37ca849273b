"""rlwatch.backtest: how a labelled run is judged from its alerts (pure; no replay). These pin the
scoring rules themselves, so that a score printed by `rlwatch backtest` means what it says."""

from __future__ import annotations

import json

import pytest

from contract.alert import Alert
from rlwatch.backtest import (
    Label, Span, delay_table, expectation, judge, load_labels, own_rules, required_severity, score,
)
from tests.unit._core import rlhf_pack

SPAN = Span(1, 400, 400)          # a run logging every step, steps 1-400
SPAN5 = Span(5, 200, 40)          # a run logging every 5 steps, 40 points


def alert(rule, severity, step, state="firing", actions=None):
    if actions is None:
        actions = {"info": ["notify"], "yellow": ["notify"], "orange": ["notify"],
                   "red": ["pause", "snapshot"], "black": ["stop", "rollback"]}[severity]
    return Alert(rule=rule, severity=severity, state=state, run_id="r", step=step, actions=actions)


# -- which rules, which severity ----------------------------------------------------------------

def test_own_rules_and_required_severity_per_label():
    assert own_rules("truncation") == ("truncation_rising",)
    assert set(own_rules("reward_collapse")) == {"reward_collapse", "dead_reward", "grpo_zero_variance"}
    assert own_rules("other:dpo_chosen_reward_decline") == ("dpo_chosen_decline",)
    assert "proxy_divergence" in own_rules("other:proxy_reward_hacking")
    assert own_rules("other") is None and own_rules("something new") is None
    assert required_severity("truncation") == "orange"
    assert required_severity("reward_collapse") == "orange"       # red in the catalog: orange is enough
    assert required_severity("stagnation") == "yellow"            # the catalog's only tier
    assert required_severity("tool_words") == "yellow"
    assert required_severity("other:transient_kl_grad_spike") == "info"


def test_windows_default_to_100_steps_or_10_logs_and_stagnation_to_the_end():
    assert expectation(Label("a", "truncation", 30), SPAN).window_end == 130
    assert expectation(Label("a", "truncation", 30), Span(10, 2000, 200)).window_end == 130   # 10 logs of 10
    assert expectation(Label("a", "truncation", 30, max_delay=7), SPAN).window_end == 37
    assert expectation(Label("a", "stagnation", 1), SPAN).window_end == 400
    assert expectation(Label("a", "truncation", None), SPAN).onset == 1      # no onset: from the start
    assert expectation(Label("a", "other:transient_kl_grad_spike", 71), SPAN).window_end == 81
    assert expectation(Label("a", "other", None), SPAN).kind == "unscored"


# -- healthy ----------------------------------------------------------------------------------

def test_healthy_run_passes_with_yellows_and_fails_on_orange_or_a_brake():
    lab = Label("h", "healthy")
    ok = judge(lab, [alert("stagnation", "yellow", 200), alert("grpo_zero_variance", "yellow", 300)], SPAN)
    assert ok.passed and ok.yellow == 2 and ok.yellow_per_1k == pytest.approx(5.0)
    assert ok.yellow_rules == {"stagnation": 1, "grpo_zero_variance": 1}
    bad = judge(lab, [alert("kl_rising", "orange", 50)], SPAN)
    assert bad.passed is False and "kl_rising orange@50" in bad.problems[0]
    braked = judge(lab, [alert("odd_rule", "yellow", 50, actions=["pause"])], SPAN)
    assert braked.passed is False and braked.wrong_brakes


def test_resolved_alerts_are_not_counted_as_new_notices():
    v = judge(Label("h", "healthy"), [alert("stagnation", "yellow", 200),
                                     alert("stagnation", "yellow", 260, state="resolved")], SPAN)
    assert v.yellow == 1 and v.open_at_end is None


# -- faults -----------------------------------------------------------------------------------

def test_fault_caught_by_its_own_rule_at_the_required_severity_in_window():
    lab = Label("f", "truncation", 65)
    v = judge(lab, [alert("truncation_rising", "yellow", 70), alert("truncation_rising", "orange", 90)], SPAN)
    assert v.passed and v.caught.step == 90 and v.delay == 25 and v.reached == "orange"


def test_another_rule_does_not_catch_it():
    v = judge(Label("f", "truncation", 65), [alert("length_hacking", "orange", 70)], SPAN)
    assert v.passed is False and v.caught is None and "not caught by truncation_rising" in v.problems[0]


def test_too_low_a_severity_or_too_late_is_a_miss():
    lab = Label("f", "truncation", 65)
    low = judge(lab, [alert("truncation_rising", "yellow", 70)], SPAN)
    assert low.passed is False and low.reached == "yellow" and "reached only yellow" in low.problems[0]
    late = judge(lab, [alert("truncation_rising", "orange", 166)], SPAN)
    assert late.passed is False


def test_yellow_catches_stagnation():
    v = judge(Label("s", "stagnation", 1), [alert("stagnation", "yellow", 250)], SPAN)
    assert v.passed and v.delay == 249


def test_equivalent_ids_catch_a_collapse_only_at_orange():
    lab = Label("c", "reward_collapse", 3)
    assert judge(lab, [alert("dead_reward", "orange", 20)], SPAN).passed
    assert not judge(lab, [alert("grpo_zero_variance", "yellow", 9)], SPAN).passed


def test_alarms_and_brakes_before_the_onset():
    read = Label("f", "reward_collapse", 200)                   # a reader's onset: an estimate
    sim = Label("f", "reward_collapse", 200, onset_exact=True)  # a simulated one: exact
    early_orange = [alert("kl_rising", "orange", 50), alert("reward_collapse", "red", 210)]
    v = judge(sim, early_orange, SPAN)
    assert v.caught is not None and v.passed is False and v.false_alarms[0].rule == "kl_rising"
    v = judge(read, early_orange, SPAN)       # reported, not failed: a second, unlabelled problem
    assert v.passed and v.false_alarms[0].rule == "kl_rising" and "reported" in v.problems[0]
    early_brake = [alert("value_shift", "yellow", 50, actions=["pause"]), alert("reward_collapse", "red", 210)]
    for lab in (read, sim):
        v = judge(lab, early_brake, SPAN)
        assert v.passed is False and v.wrong_brakes
    # after the onset, other rules may react to the fault
    v = judge(sim, [alert("kl_rising", "orange", 205), alert("reward_collapse", "red", 210)], SPAN)
    assert v.passed
    # a reader's onset holds to two logged points: a brake 10 steps early on a run logging every 5
    v = judge(Label("f", "truncation", 110), [alert("reward_collapse", "red", 100),
                                              alert("truncation_rising", "orange", 90)], Span(5, 500, 100))
    assert v.passed and not v.wrong_brakes


def test_a_readers_onset_is_an_estimate_and_a_simulated_one_is_exact():
    early = [alert("truncation_rising", "orange", 35)]
    read = judge(Label("f", "truncation", 65), early, SPAN)
    assert read.passed and read.delay == -30          # an early catch, not a false alarm
    sim = judge(Label("f", "truncation", 65, onset_exact=True), early, SPAN)
    assert sim.passed is False and sim.false_alarms    # the fault did not exist at step 35
    grace = judge(Label("f", "truncation", 65, onset_exact=True), [alert("truncation_rising", "orange", 62)], SPAN)
    assert grace.passed and grace.delay == -3
    way_early = judge(Label("f", "truncation", 265), early, SPAN)
    assert way_early.passed is False                  # more than a window before the reader's onset


# -- notify, don't alarm ----------------------------------------------------------------------

def test_transient_spike_must_notify_and_never_brake():
    lab = Label("k", "other:transient_kl_grad_spike", 71)
    assert judge(lab, [alert("kl_above_target", "yellow", 71)], SPAN).passed
    red = judge(lab, [alert("kl_above_target", "red", 71)], SPAN)
    assert red.passed is False and red.wrong_brakes and red.reached == "red"
    silent = judge(lab, [], SPAN)
    assert silent.passed is False and "no notice" in silent.problems[0]
    elsewhere = judge(lab, [alert("kl_above_target", "yellow", 71), alert("kl_rising", "orange", 34)], SPAN)
    assert elsewhere.passed is False                  # warn, don't alarm: anywhere in the run


def test_missing_and_unwatched_own_rules_are_named():
    v = judge(Label("d", "other:dpo_chosen_reward_decline", 60), [], SPAN5,
              pack_rules=["kl_above_target"], watched=[])
    assert v.own_missing == ("dpo_chosen_decline",) and "not in the pack" in v.problems[0]
    v = judge(Label("t", "truncation", 30), [], SPAN5, pack_rules=["truncation_rising"], watched=["kl_rising"])
    assert v.own_unwatched == ("truncation_rising",) and "none of its inputs" in v.problems[0]


def test_open_at_end_follows_firing_and_resolved_notices():
    v = judge(Label("f", "truncation", 30), [alert("truncation_rising", "orange", 40),
                                             alert("truncation_rising", "orange", 70, state="resolved"),
                                             alert("truncation_rising", "yellow", 70)], SPAN5)
    assert v.passed and v.open_at_end == "yellow"


# -- scores and tables ------------------------------------------------------------------------

def test_score_counts_each_kind_and_skips_unscored():
    vs = [judge(Label("h", "healthy"), [alert("stagnation", "yellow", 5)], SPAN),
          judge(Label("f", "truncation", 30), [alert("truncation_rising", "orange", 40)], SPAN),
          judge(Label("g", "truncation", 30), [], SPAN),
          judge(Label("o", "other"), [alert("kl_above_target", "red", 3)], SPAN)]
    s = score(vs)
    assert (s.scored, s.passed, s.healthy, s.quiet, s.faults, s.caught, s.unscored) == (3, 2, 1, 1, 2, 1, 1)
    assert s.recall == 0.5 and s.delays == [10] and s.yellow_per_1k == pytest.approx(2.5)
    assert "2/3 files pass" in s.line("files") and "1 unscored" in s.line("files")


def test_delay_table_bins_by_magnitude_and_interval():
    def sim(m, every, caught_at):
        v = judge(Label("x", "truncation_rising", 300, onset_exact=True),
                  [alert("truncation_rising", "orange", caught_at)] if caught_at else [], SPAN)
        v.extra.update(magnitude=m, log_every=every)
        return v
    rows = delay_table([sim(0.1, 1, 350), sim(0.2, 1, None), sim(0.9, 1, 310), sim(None, 5, 305)])
    by = {(r["magnitude"], r["log_every"]): r for r in rows}
    assert by[("mild", 1)]["runs"] == 2 and by[("mild", 1)]["caught"] == 1 and by[("mild", 1)]["median_delay"] == 50
    assert by[("strong", 1)]["median_delay"] == 10
    assert by[("all-or-nothing", 5)]["caught"] == 1


def test_labels_file_with_sources(tmp_path):
    (tmp_path / "labels.json").write_text(json.dumps({
        "b.jsonl": {"label": "healthy", "onset": None},
        "a.jsonl": {"label": "truncation", "onset": 5, "max_delay": 50, "preset": "trl-grpo",
                    "source": "team-a"}}))
    labs = load_labels(tmp_path, sources={"b.jsonl": "team-b"})
    assert [(x.run, x.source, x.max_delay) for x in labs] == [("a.jsonl", "team-a", 50), ("b.jsonl", "team-b", None)]
    with pytest.raises(FileNotFoundError):
        load_labels(tmp_path / "nowhere")


# -- the reward as another reward model gives it ----------------------------------------------------

def test_reward_as_shifts_and_scales_every_reward_of_an_event_and_only_those():
    from rlwatch.backtest import reward_as

    raw = {"kind": "step", "step": 3,
           "metrics": {"reward/mean": 0.5, "reward/std": 0.2, "kl/mean": 0.01, "judge/score": 0.4},
           "dists": {"reward": [0.0, 1.0], "response_length": [10, 20]},
           "groups": {"reward/mean": {"math": 0.25}},
           "samples": [{"prompt_id": "p", "reward": 2.0, "response": "x"}, {"prompt_id": "q"}]}
    got = reward_as(raw, -2.0, 3.0)
    assert got["metrics"] == {"reward/mean": 2.0, "reward/std": 0.4, "kl/mean": 0.01, "judge/score": 0.4}
    assert got["dists"] == {"reward": [3.0, 1.0], "response_length": [10, 20]}
    assert got["groups"] == {"reward/mean": {"math": 2.5}}
    assert got["samples"] == [{"prompt_id": "p", "reward": -1.0, "response": "x"}, {"prompt_id": "q"}]
    assert raw["metrics"]["reward/mean"] == 0.5 and raw["dists"]["reward"] == [0.0, 1.0]   # not changed


def test_a_simulated_case_under_another_reward_model_is_judged_alike():
    """The pack reads a reward crash the same whether the reward model's scores sit at 0.9 or at
    2.9: shift_gain, not a share of the level."""
    from rlwatch.backtest import SimCase, judge, run_sim

    verdicts = []
    for offset in (0.0, 2.0):
        case = SimCase("reward_crash", "ppo", 41000, 5, 0.3, reward_offset=offset)
        label, alerts, span, _ = run_sim(case, "rlhf")
        verdicts.append(judge(label, alerts, span))
    assert [v.passed for v in verdicts] == [True, True]
    assert verdicts[0].caught.step == verdicts[1].caught.step


def test_a_step_scaled_case_stretches_steps_onset_and_window_alike():
    """step_scale=K: the same run as one counting K times smaller steps logs it; its onset and
    the window it must be caught in stretch with it (a reward crash is still caught, K times
    later in step numbers)."""
    from rlwatch.backtest import SimCase, judge, run_sim

    got = []
    for k in (1, 3):
        label, alerts, span, _ = run_sim(SimCase("reward_crash", "ppo", 41000, 5, 0.7, step_scale=k), "rlhf")
        got.append((label, span, judge(label, alerts, span)))
    (l1, s1, v1), (l3, s3, v3) = got
    assert (l3.onset, l3.max_delay) == (3 * l1.onset, 3 * l1.max_delay)
    assert (s3.first_step, s3.last_step, s3.logged) == (3 * s1.first_step, 3 * s1.last_step, s1.logged)
    assert v1.passed and v3.passed and v3.caught.step % 3 == 0
    # K = 0.5: a run twice as fast, logged every step (every other step kept, numbers halved)
    label, alerts, span, _ = run_sim(SimCase("reward_crash", "ppo", 41000, 1, 0.7, step_scale=0.5), "rlhf")
    assert (label.onset, label.max_delay) == (l1.onset // 2, l1.max_delay // 2)
    assert span.last_step - span.first_step + 1 == span.logged and judge(label, alerts, span).passed


def test_scaled_metrics_multiplies_a_family_and_its_per_sample_array_only():
    from rlwatch.backtest import scaled_metrics

    raw = {"kind": "step", "step": 3,
           "metrics": {"response/length_mean": 200.0, "response/length_max": 400, "entropy/mean": 1.5,
                       "kl/mean": 0.01, "flag": True},
           "dists": {"reward": [0.0, 1.0], "response_length": [100, 300]}}
    got = scaled_metrics(raw, (("response/length", 4.0), ("entropy/", 0.5)))
    assert got["metrics"] == {"response/length_mean": 800.0, "response/length_max": 1600,
                              "entropy/mean": 0.75, "kl/mean": 0.01, "flag": True}
    assert got["dists"] == {"reward": [0.0, 1.0], "response_length": [400, 1200]}
    assert raw["metrics"]["response/length_mean"] == 200.0 and raw["dists"]["response_length"] == [100, 300]


def test_a_length_fault_with_answers_4_times_longer_is_judged_alike():
    """A long-response tail (length_shape) is caught at the same step whether the task's answers
    run to 250 or to 1,000 tokens: the tail is read against the batch's own median."""
    from rlwatch.backtest import SimCase, judge, run_sim

    verdicts = []
    for factor in (1.0, 4.0):
        case = SimCase("length_shape", "ppo", 51000, 1, 0.5, metric_scales=(("response/length", factor),))
        label, alerts, span, _ = run_sim(case, "rlhf")
        verdicts.append(judge(label, alerts, span))
    assert [v.passed for v in verdicts] == [True, True]
    assert verdicts[0].caught.step == verdicts[1].caught.step


def test_noisy_metrics_scatters_a_family_the_same_way_for_the_same_event():
    from rlwatch.backtest import noisy_metrics

    raw = {"kind": "step", "run_id": "r", "step": 7, "metrics": {"entropy/mean": 2.0, "kl/mean": 0.01}}
    a, b = noisy_metrics(raw, (("entropy/", 0.2),)), noisy_metrics(raw, (("entropy/", 0.2),))
    assert a == b and a["metrics"]["kl/mean"] == 0.01 and a["metrics"]["entropy/mean"] != 2.0
    other = noisy_metrics({**raw, "step": 8}, (("entropy/", 0.2),))
    assert other["metrics"]["entropy/mean"] != a["metrics"]["entropy/mean"]
    assert raw["metrics"]["entropy/mean"] == 2.0


def test_log_normal_noise_keeps_a_gradient_norm_positive_and_a_fraction_at_most_1():
    """The real-noise profile scatters non-negative families log-normally with the relative
    SD asked for: a 70 % scatter of a gradient norm never makes it negative (a normal factor
    1 + 0.7 g does at one step in 13), and a clip fraction stays a fraction."""
    import statistics

    from rlwatch.backtest import REAL_NOISE, noisy_metrics

    noise = (("grad_norm/", 0.7, "log"), ("ppo/clip_frac", 3.0, "log"))
    xs, fr = [], []
    for step in range(4000):
        m = noisy_metrics({"run_id": "r", "step": step,
                           "metrics": {"grad_norm/actor": 2.0, "ppo/clip_frac": 0.5}}, noise)["metrics"]
        xs.append(m["grad_norm/actor"])
        fr.append(m["ppo/clip_frac"])
    assert min(xs) > 0 and max(fr) <= 1.0 and min(fr) > 0
    assert statistics.fmean(xs) == pytest.approx(2.0, rel=0.05)
    assert statistics.stdev(xs) / 2.0 == pytest.approx(0.7, rel=0.15)
    assert dict((e[0], e[1]) for e in REAL_NOISE)["grad_norm/"] == 0.7


@pytest.mark.parametrize("seed", [101520, 101560, 101580])
def test_a_healthy_grpo_run_logged_every_10_steps_gets_no_length_shape_notice(seed):
    """One batch's bimodality coefficient is noisy: logged every 10 steps, three batches in a
    row over the line made a notice on half the healthy GRPO runs; the notice holds over 4."""
    from rlwatch.backtest import SimCase, run_sim

    _, alerts, _, _ = run_sim(SimCase("healthy", "grpo", seed, 10), "rlhf")
    assert not [a for a in alerts if a.rule == "length_shape"]


def test_an_entropy_collapse_whose_entropy_scatters_20_percent_a_step_is_caught():
    """The collapse is judged against the warm-up's noise: a level 3 robust deviations under
    the warm-up (not 4) catches it on a run whose entropy is noisy (the old -4 missed it)."""
    from rlwatch.backtest import SimCase, judge, run_sim

    case = SimCase("entropy_collapse", "ppo", 56011, 5, metric_noise=(("entropy/mean", 0.2),))
    label, alerts, span, _ = run_sim(case, "rlhf")
    assert judge(label, alerts, span).passed


# -- real logs re-logged as other runs of their family --------------------------------------------

def test_parse_variant_names_the_choices_on_a_bad_spec():
    from rlwatch.backtest import parse_variant

    assert parse_variant("every=2") == ("every", 2.0)
    assert parse_variant("reward_offset=-1") == ("reward_offset", -1.0)
    assert parse_variant("resume=0.3") == ("resume", 0.3)
    for bad in ("every", "every=0", "steps=1.5", "stride=2", "reward_scale=0", "reward_scale=x",
                "resume=0", "resume=1"):
        with pytest.raises(ValueError, match="real-log variant"):
            parse_variant(bad)


def _logged(tmp_path):
    """A TRL GRPO-like file of 6 steps (the preset's raw names) and its label."""
    src = tmp_path / "src"
    src.mkdir()
    lines = [{"step": s, "metrics": {"reward": 0.1 * s, "reward_std": 0.2, "judge/score": 0.5,
                                     "entropy": 1.0}} for s in range(1, 7)]
    (src / "run.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return src, [Label("run.jsonl", "truncation", onset=3, max_delay=40, preset="trl-grpo", source="s")]


def test_vary_real_stretches_steps_with_the_label(tmp_path):
    from rlwatch.backtest import vary_real

    src, labs = _logged(tmp_path)
    out = vary_real(src, labs, ("steps", 2.0), tmp_path / "v")
    rows = [json.loads(x) for x in (tmp_path / "v" / "run.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    assert out[0].onset == 6 and out[0].max_delay == 80 and out[0].source == "s"
    assert rows[0]["metrics"]["reward/mean"] == pytest.approx(0.1)     # the preset's names, mapped


def test_vary_real_keeps_every_kth_step_and_moves_only_the_optimised_reward(tmp_path):
    from rlwatch.backtest import vary_real

    src, labs = _logged(tmp_path)
    out = vary_real(src, labs, ("every", 2.0), tmp_path / "e")
    rows = [json.loads(x) for x in (tmp_path / "e" / "run.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 3, 5] and out == labs
    vary_real(src, labs, ("every_shifted", 2.0), tmp_path / "o")
    rows = [json.loads(x) for x in (tmp_path / "o" / "run.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6]       # the other half of the points
    vary_real(src, labs, ("reward_scale", 10.0), tmp_path / "k")
    vary_real(src, labs, ("reward_offset", -1.0), tmp_path / "b")
    k = [json.loads(x)["metrics"] for x in (tmp_path / "k" / "run.jsonl").read_text().splitlines()]
    b = [json.loads(x)["metrics"] for x in (tmp_path / "b" / "run.jsonl").read_text().splitlines()]
    assert k[2]["reward/mean"] == pytest.approx(3.0) and k[2]["reward/std"] == pytest.approx(2.0)
    assert b[2]["reward/mean"] == pytest.approx(-0.7) and b[2]["reward/std"] == pytest.approx(0.2)
    assert k[2]["judge/score"] == b[2]["judge/score"] == 0.5       # the judge is another model


def test_vary_real_resume_keeps_the_run_from_its_share_on_and_leaves_earlier_faults_unscored(tmp_path):
    from rlwatch.backtest import vary_real

    src, labs = _logged(tmp_path)
    out = vary_real(src, labs, ("resume", 0.5), tmp_path / "r")
    rows = [json.loads(x) for x in (tmp_path / "r" / "run.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 5, 6]
    assert out[0].unseen and "before the resume point (step 4)" in out[0].unseen
    late = [Label("run.jsonl", "truncation", onset=5, max_delay=40, preset="trl-grpo", source="s")]
    assert vary_real(src, late, ("resume", 0.5), tmp_path / "r2")[0].unseen is None


def test_a_simulated_run_relaunched_from_its_checkpoint_is_judged_as_if_it_had_not_been():
    """The same healthy run, watched through a relaunch at 40 % of its steps (a new incarnation,
    as after a preemption), raises exactly the alerts it raises without one: none. (Started
    afresh there, with its warm-up mid-training, it was alarmed orange three times, by
    proxy_divergence and reward_degradation, and noticed stagnating three times.)"""
    from rlwatch.backtest import SimCase, run_sim

    pack = rlhf_pack()
    plain = run_sim(SimCase("healthy", "grpo", 400620, 1), pack)[1]
    again = run_sim(SimCase("healthy", "grpo", 400620, 1, relaunch=0.4), pack)[1]
    key = [(a.rule, a.severity, a.state, a.step) for a in plain if "relaunched" not in a.summary]
    assert [(a.rule, a.severity, a.state, a.step) for a in again
            if "relaunched" not in a.summary] == key


def test_a_relogged_copy_that_keeps_no_point_of_what_the_own_rule_reads_is_not_scored(tmp_path):
    """A TRL run logs its completion statistics every 10 steps and its loss every step: kept
    every 2nd step from the second, the copy has no truncation point at all (nothing to judge),
    and a one-step spike on a dropped step is nothing to notice; every 2nd from the first keeps
    both and is judged."""
    from rlwatch.backtest import score_real, vary_real

    src = tmp_path / "src"
    src.mkdir()
    lines = []
    for s in range(1, 121):
        m = {"loss": 0.1, "kl": 17.0 if s == 71 else 0.1, "grad_norm": 0.3, "entropy": 1.0}
        if s % 10 == 1:
            m.update({"completions/clipped_ratio": 0.9, "reward": 0.3, "reward_std": 0.2})
        lines.append({"step": s, "metrics": m})
    (src / "trunc.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (src / "spike.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    labs = [Label("trunc.jsonl", "truncation", onset=1, preset="trl-grpo", source="s"),
            Label("spike.jsonl", "other:transient_kl_grad_spike", onset=71, preset="trl-grpo", source="s")]

    shifted = vary_real(src, labs, ("every_shifted", 2.0), tmp_path / "o")
    assert "response/truncated_frac" in shifted[0].lost
    assert shifted[1].unseen and "step 71" in shifted[1].unseen
    report = score_real(tmp_path / "o", labels=shifted)
    assert [v.kind for v in report.verdicts] == ["unscored", "unscored"]
    assert report.score.unscored == 2 and report.score.scored == 0

    kept = vary_real(src, labs, ("every", 2.0), tmp_path / "e")
    assert "response/truncated_frac" not in kept[0].lost and kept[1].unseen is None
    report = score_real(tmp_path / "e", labels=kept)
    assert [v.kind for v in report.verdicts] == ["catch", "notify"]


def test_a_copy_with_step_numbers_k_times_larger_gets_k_times_the_default_window(tmp_path):
    """Re-logged with step numbers x 10, a fault caught 160 steps after its onset was caught 16
    steps after it in the original's steps: it passes, as the original does; 1,100 steps after
    it (110 original steps) is late, as in the original."""
    from rlwatch.backtest import vary_real

    src, _ = _logged(tmp_path)
    labs = [Label("run.jsonl", "truncation", onset=3, preset="trl-grpo", source="s")]
    out = vary_real(src, labs, ("steps", 10.0), tmp_path / "v")
    assert out[0].onset == 30 and out[0].max_delay is None and out[0].step_scale == 10
    span = Span(10, 2000, 200)
    on_time = [alert("truncation_rising", "orange", 190)]
    late = [alert("truncation_rising", "orange", 1130)]
    assert judge(out[0], on_time, span).passed
    assert not judge(out[0], late, span).passed

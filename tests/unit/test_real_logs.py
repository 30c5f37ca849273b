"""Detection that holds on runs the pack was not tuned on (issue 10), scored as
``rlwatch backtest`` scores it (rlwatch/backtest.py):

* every labelled real log in ../shared/real-logs (labels.json; the README's label where
  labels.json says a bare "other"): its verdict by its own rule(s), at the required
  severity, within its window, with no brake before the onset (healthy: nothing orange or above
  at all; the transient spike: a notice and no alarm anywhere);
* every real log is watched: its preset is found and some of its own rules had their inputs;
* a small simulated set (seeds >= 5000; magnitudes drawn by the seed; logging every 2, 5 and 10
  steps): recall >= 0.95, nothing orange or above on healthy runs or before an onset, at most 1
  yellow per 1,000 healthy steps. One of its runs has been looked at (seed 5010, a 3.3x entropy
  blowup logged every 5 steps, which the 50-step reference of entropy_blowup missed), so it is
  no longer strictly held out: bench/backtest.py --seed-from N measures on fresh seeds.

Where today's pack fails, the test states the target and is marked ``xfail(strict=True)`` with
what the detection work must fix: when a fix makes it pass, the strict marker turns it into a
failure until someone removes the marker. The whole file runs in well under a minute.
"""

from __future__ import annotations

import functools

import pytest

from contract.presets import PRESETS
from rlwatch.backtest import SimCase, load_labels, own_rules, run_sim, score_real, score_sim
from rules.loader import load_pack
from tests.support.paths import REAL_LOGS
from tests.support.real_logs import labels, sources

PACK = load_pack("rlhf")
#: labels.json, with the README's label where labels.json says a bare "other"
LABELS = {lab.run: lab for lab in labels(REAL_LOGS)}


@functools.lru_cache(maxsize=1)
def real():
    report = score_real(REAL_LOGS, PACK, labels=list(LABELS.values()))
    return {v.run: v for v in report.verdicts}


def xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


# -- real logs: one verdict per labelled file ----------------------------------------------------

#: What today's pack gets wrong, file by file (the target is the test's assertion).
REAL_FAILURES: dict[str, str] = {}

SCORED = sorted(n for n, lab in LABELS.items() if lab.label == "healthy" or own_rules(lab.label))


@pytest.mark.parametrize("name", [pytest.param(n, marks=xfail(REAL_FAILURES[n])) if n in REAL_FAILURES
                                  else n for n in SCORED])
def test_real_log_verdict(name):
    v = real()[name]
    assert v.passed, f"{name} ({v.label}, onset {v.onset}): {'; '.join(v.problems)}"


#: Files whose own rules are not all present or watched today.
WATCH_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=xfail(WATCH_FAILURES[n])) if n in WATCH_FAILURES
                                  else n for n in sorted(LABELS)])
def test_real_log_is_watched(name):
    lab, v = LABELS[name], real()[name]
    assert lab.preset in PRESETS and v.extra["preset"] == lab.preset, "the run's framework was not found"
    assert v.extra["events"] > 0 and v.extra["rejected"] == 0
    assert v.extra["watched"] > 0, "no rule had its inputs: silence would mean nothing"
    if v.own:
        live = set(v.own) - set(v.own_missing) - set(v.own_unwatched)
        assert live, f"none of {v.own} is in the pack with its inputs logged"


#: The files labels.json calls a bare "other", with the label and onset the README gives them.
README_LABELS = {
    "trl_grpo_wordle_stage2_160.jsonl": ("stagnation", 1),
    "trl_grpo_nipsdyn_rho3_s42.jsonl": ("healthy", None),          # noisy truncation
    "trl_ppo_kartik_v1_s2025.jsonl": ("truncation", 1),
    "trl_grpo_nipsdyn_rho0.1_s42.jsonl": ("healthy", None),        # borderline entropy decline
    "trl_ppo_kartik_v2_s2025.jsonl": ("stagnation", 1),
}


def test_bare_other_labels_take_the_readme_label_and_every_file_is_scored():
    raw = {lab.run: lab for lab in load_labels(REAL_LOGS, sources())}
    relabelled = {n: (LABELS[n].label, LABELS[n].onset) for n in LABELS if raw[n].label == "other"}
    assert relabelled == README_LABELS
    unscored = {n for n, v in real().items() if v.passed is None}
    assert not unscored, f"unscored: {sorted(unscored)}"
    assert all(lab.label == "healthy" or own_rules(lab.label) for lab in LABELS.values())


# -- simulated runs from held-out seeds ---------------------------------------------------------

SIM_FAULTS = ["kl_above_target", "kl_rising", "entropy_collapse", "reward_collapse", "truncation_rising",
              "grad_norm_anomaly", "value_loss_divergence", "length_hacking", "stagnation", "nan_inf",
              "entropy_blowup", "reward_crash", "dead_reward", "dpo_chosen_decline", "proxy_divergence"]
SIM_CASES = ([SimCase(f, ("ppo", "grpo")[i % 2], 5000 + i, (5, 10)[i % 2]) for i, f in enumerate(SIM_FAULTS)]
             + [SimCase("nan_inf:skipped_step", "grpo", 5015, 2, window=150)]
             + [SimCase("healthy", algo, 5100 + j, every, steps=1000)
                for j, algo in enumerate(("ppo", "grpo", "dpo")) for every in (5, 10)])


@functools.lru_cache(maxsize=1)
def sim():
    return score_sim(SIM_CASES, PACK)


def _misses():
    return [f"{v.label}@{v.extra.get('log_every')}" for v in sim().verdicts if v.kind == "catch" and v.caught is None]


def test_simulated_recall_is_at_least_95_percent():
    s = sim().score
    assert s.faults >= len(SIM_FAULTS) and s.recall >= 0.95, f"recall {s.recall:.2f}; missed {_misses()}"


def test_simulated_healthy_and_pre_onset_stay_below_orange_and_unbraked():
    bad = [(v.run, [str(h) for h in v.false_alarms + v.wrong_brakes][:4])
           for v in sim().verdicts if v.false_alarms or v.wrong_brakes]
    assert not bad


def test_simulated_yellow_notices_at_most_one_per_1000_healthy_steps():
    s = sim().score
    assert s.healthy_steps >= 5000 and s.yellow_per_1k <= 1.0, f"{s.yellow_per_1k:.2f} per 1,000 steps"


def test_skipped_mixed_precision_step_notifies_and_does_not_brake():
    v = next(v for v in sim().verdicts if v.label == "nan_inf:skipped_step")
    assert v.passed, "; ".join(v.problems)


def test_skipped_steps_that_no_logged_point_carries_are_not_scored_as_missed():
    # held-out seed 470001 (GRPO, logged every 5): the onset falls at step 324, between two logged
    # points, and the next skipped step that lands on one is at 670, past the 300-step window
    unlogged = SimCase("nan_inf:skipped_step", "grpo", 470001, 5)
    label, _, _, _ = run_sim(unlogged, PACK)
    assert label.unseen and "no logged point" in label.unseen
    v = score_sim([unlogged], PACK).verdicts[0]
    assert v.kind == "unscored" and v.passed is None
    # logged every step, the onset itself is the event to notice, and is noticed
    every, _, _, _ = run_sim(SimCase("nan_inf:skipped_step", "grpo", 470001, 1), PACK)
    assert every.unseen is None and every.onset == 324
    v = score_sim([SimCase("nan_inf:skipped_step", "grpo", 470001, 1)], PACK).verdicts[0]
    assert v.kind == "notify" and v.passed, v.problems

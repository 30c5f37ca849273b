"""The detection signals the built-in pack reads (streams/signals.py, rules/schema.py SIGNALS):
change points against the window before, baselines from the run's own warm-up, spikes against
everything seen lately, and the pack's own rule tests (rules/packs/rlhf.tests.yaml) together
with what those cannot say (no brake, no resolution while a fault lasts)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from rlwatch.rule_tests import run_rule_tests
from rules.schema import MIN_POINTS, READY_POINTS, SIGNALS
from streams.processor import Pipeline
from streams.signals import Bank, robust_scale
from tests.unit._core import feed_series, firing, resolved, rlhf_pack, step_event

PACKS = Path(__file__).resolve().parents[2] / "rules" / "packs"

NEW = ("shift_z", "level_ratio", "shift_rel", "range_pos", "level_to_max", "over_max_z", "shift_dz", "jump_dz", "jump_t", "shift_gain", "trend_gain", "drawdown_gain",
       "ratio_to_max", "start_z", "ratio_to_start_max", "gain_t", "follow_z", "range",
       "noise_ratio")


def run(values, signal, window, *, every=1, versus=None, other=None, min_steps=0):
    """The signal's value after each logged point of ``values`` (one per logged step)."""
    bank = Bank()
    read = bank.metric("m", signal, window, None, "v" if versus else None, min_steps,
                       MIN_POINTS[signal], READY_POINTS[signal])
    out = []
    for i, x in enumerate(values):
        metrics = {"m": x}
        if versus:
            metrics["v"] = other[i]
        bank.update(i * every, metrics)
        out.append(read())
    return out


def feed_rows(pipeline, run_id, rows, **extra):
    """Feed {metric: value} rows as consecutive step events from step 0; every alert."""
    out = []
    for s, metrics in enumerate(rows):
        ev = step_event(run_id, s, metrics, **extra)
        out += pipeline.feed(ev, ev.ts)
    return out


def noisy(n, level=1.0, sd=0.02, seed=0):
    rng = random.Random(seed)
    return [level + rng.gauss(0, sd) for _ in range(n)]


def test_every_new_signal_is_declared_with_its_point_counts():
    for sig in NEW:
        assert sig in SIGNALS and sig in MIN_POINTS and sig in READY_POINTS


def test_robust_scale_does_not_collapse_on_mostly_constant_data():
    # 70 % exact zeros and some successes: the MAD is 0, the spread is not
    values = [0.0] * 14 + [0.4, 0.9, 0.3, 1.2, 0.8, 0.5]
    assert robust_scale(values, 0.0) > 0.2
    assert robust_scale([1.0] * 10, 1.0) == 0.0


def test_robust_scale_is_never_under_the_resolution_of_data_on_a_lattice():
    # one group of four answers a step: the reward moves in quarters, mostly repeated. Its MAD
    # and mean deviation read a small fraction of a quarter; no change of the data is smaller
    # than a quarter, so none is read as many deviations
    quarters = [0.5] * 7 + [0.75, 0.25, 0.5]
    assert robust_scale(quarters, 0.5) == 0.25
    # continuous data are above their smallest deviation: unchanged
    values = [1.0 + 0.01 * math.sin(i) for i in range(40)]
    med = sorted(values)[20]
    dev = [abs(v - med) for v in values]
    assert robust_scale(values, med) == max(1.4826 * sorted(dev)[20] if len(dev) % 2 else
                                            1.4826 * (sorted(dev)[19] + sorted(dev)[20]) / 2,
                                            1.2533 * sum(dev) / len(dev))


def test_a_quartered_reward_dipping_three_quarters_for_two_points_is_no_crash():
    """A healthy reward of one group of four answers a step logged every 5 steps (bench/shapes.py
    seed 5200): against the level just before, in its point-to-point noise, two points of 0.25
    after 1.0 read -4.1; the noise's resolution is a quarter, and the dip is three of it."""
    reward = [0.5, 0.5, 0.5, 0.75, 0.75, 0.75, 0.25, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 0.75, 0.25,
              0.75, 0.25]
    jump = run([0.5, 0.75] * 8 + reward, "jump_dz", 50, every=5)
    assert jump[-1] > -4      # reward_crash's line


def test_a_window_of_huge_values_reads_without_raising():
    # a broken reward of +-1e200: squares overflow to infinity; the event is still taken
    bank = Bank()
    readers = [bank.metric("m", sig, 20, None, None, 0, MIN_POINTS[sig], READY_POINTS[sig])
               for sig in ("sign_flip_rate", "diff_ratio", "std", "zscore", "trend_z")]
    for s in range(40):
        bank.update(s, {"m": 1e200 if s % 2 else -1e200})
        for r in readers:
            r()
    assert readers[0]() == 1.0


def test_the_level_is_the_median_of_the_last_steps_against_the_points_before():
    values = [1.0] * 17 + [5.0, 1.0, 5.0]
    # the last 5 steps hold 1, 1, 5, 1, 5: two high points of five do not move the level
    assert run(values, "level_ratio", 20)[-1] == 1.0
    assert run(values, "shift_z", 20)[-1] == 0.0        # level == reference median, scale 0
    assert run(values, "level_to_max", 20)[-1] == 1.0   # the reference's maximum is 1 too
    assert math.isnan(run(values[:6], "level_ratio", 20)[-1])   # too few reference points
    assert run(values[:16] + [5.0, 5.0, 5.0, 1.0], "level_ratio", 20)[-1] == 5.0  # held: moved


def test_shift_z_sees_a_level_that_held_for_two_points_not_one_spike():
    base = noisy(60)
    spike = run(base + [3.0] + base[:5], "shift_z", 50)
    assert max(v for v in spike if v == v) < 3
    # logged every step the level is the median of the last 5 points: 3 low points move it
    shift = run(base + [0.2] * 4, "shift_z", 50)
    assert shift[-2] < -20 and shift[-1] < -20          # the level fell far out of its noise
    assert shift[-3] > -5 and shift[-4] > -5            # not on one or two low points
    # logged every 10 steps the last 5 steps hold one point: the level is the last 3 points
    sparse = run(base + [0.2] * 2, "shift_z", 50, every=10)
    assert sparse[-1] < -20 and sparse[-2] > -5


def test_level_ratio_and_shift_rel_compare_with_the_window_before():
    vals = [2.0] * 40 + [6.0] * 3
    assert run(vals, "level_ratio", 50)[-1] == pytest.approx(3.0)
    assert run(vals, "shift_rel", 50)[-1] == pytest.approx(2.0)
    assert run([-1.0] * 40 + [-2.0] * 3, "shift_rel", 50)[-1] == pytest.approx(-1.0)


def test_over_max_z_tells_a_jump_from_a_steep_learning_curve():
    ramp = [0.3 + 0.004 * i + random.Random(i).gauss(0, 0.01) for i in range(100)]
    assert max(v for v in run(ramp, "over_max_z", 50) if v == v) < 4
    jump = noisy(60, 0.5, 0.01) + [1.0] * 3
    assert run(jump, "over_max_z", 50)[-1] > 10


def test_shift_dz_tells_a_crash_that_a_learning_curve_in_a_stretched_window_hides_from_shift_z():
    """Logged every 20 steps, a 50-step window holds its 16 points over 320 steps of a steep
    learning curve: their robust scale is mostly the rise, and shift_z sees a fall of 80 % as
    a few of it. In their point-to-point noise the fall stands out; the curve alone does not."""
    rng = random.Random(3)
    curve = [0.3 + 0.04 * i + rng.gauss(0, 0.02) for i in range(16)]
    crash = curve + [0.15, 0.17, 0.16]
    assert run(crash, "shift_z", 50, every=20)[-1] > -4
    assert run(crash, "shift_dz", 50, every=20)[-1] < -10
    assert min(v for v in run(curve, "shift_dz", 50, every=20) if v == v) > 0      # rising: above
    # without a trend the changes' scale is sqrt(2) the values' own: shift_dz is the milder
    flat = [0.5 + rng.gauss(0, 0.02) for _ in range(60)] + [0.3] * 3
    assert -run(flat, "shift_dz", 50)[-1] < -run(flat, "shift_z", 50)[-1]


def test_jump_dz_reads_a_crash_against_the_level_just_before_it():
    """Logged every 20 steps over a learning curve noisy as public runs are, the window's
    earlier points have their median halfway up the climb: a crash to below that middle is a
    few steps of noise under it (shift_dz), and a jump of many under the level just before it
    (jump_dz). The climb itself jumps up, never down; one low point moves no level."""
    rng = random.Random(11)
    curve = [0.25 + 0.045 * i + rng.gauss(0, 0.05) for i in range(16)]
    crash = curve + [0.3, 0.32, 0.31]
    shift, jump = run(crash, "shift_dz", 50, every=20)[-1], run(crash, "jump_dz", 50, every=20)[-1]
    assert shift > -6 and jump < -8
    assert min(v for v in run(curve, "jump_dz", 50, every=20) if v == v) > 0
    dip = curve + [0.3, curve[-1] + 0.04, curve[-1] + 0.08]
    assert run(dip, "jump_dz", 50, every=20)[-1] > 0
    # the level just before is as many points as the level's: 5 logged every step
    flat = [1.0 + 0.01 * rng.gauss(0, 1) for _ in range(40)] + [0.5] * 3
    assert run(flat, "jump_dz", 50)[-1] < -20 and run(flat[:-1], "jump_dz", 50)[-1] > -3


def quartered(levels, seed=0, answers=8):
    """A GRPO reward of one group of ``answers`` answers a step: the share right, each answer
    right with the step's probability (so it moves in eighths)."""
    rng = random.Random(seed)
    return [sum(rng.random() < p for _ in range(answers)) / answers for p in levels]


def test_jump_t_reads_a_crash_of_a_reward_that_scatters_by_eighths():
    """One group of 8 answers a step: a reward climbed to 0.6 that crashes to 0.15 falls by
    about two points' scatter, under the lines of shift_z and jump_dz (-4); the mean of a dozen
    points after it against a dozen before is more than 5 standard errors down. The same reward
    without the crash, and a slow slide over 40 steps, stay above that line."""
    levels = [0.35 + 0.25 * min(1.0, i / 60) for i in range(100)]
    seen = 0
    for seed in range(10):
        crash = quartered(levels + [0.15] * 14, seed=seed)
        assert min(run(crash, "shift_z", 50)[-14:]) > -4 and min(run(crash, "jump_dz", 50)[-14:]) > -4
        seen += min(run(crash, "jump_t", 50)[-14:]) < -5
    assert seen >= 8
    for seed in range(20):
        healthy = quartered(levels + [0.6] * 14, seed=seed)
        assert min(v for v in run(healthy, "jump_t", 50) if v == v) > -4
        slide = quartered(levels + [0.6 - 0.01 * i for i in range(40)], seed=seed)
        assert min(v for v in run(slide, "jump_t", 50) if v == v) > -5


def test_jump_t_counts_a_rewards_wander_in_its_standard_error():
    """The standard error is the spread of the window's earlier points, not their
    point-to-point noise (both 0.05 here): the same fall of 0.5 after a reward that wandered
    between 0.6 and 1.4 reads under a third of what it reads after a calm one. A window of
    fewer than 24 points (6 a block) reads nothing."""
    rng = random.Random(2)
    calm = [1.0 + rng.gauss(0, 0.05) for _ in range(50)] + [0.5 + rng.gauss(0, 0.05) for _ in range(12)]
    wander = [lv + rng.gauss(0, 0.05) for lv in [0.6] * 12 + [1.4] * 12 + [0.6] * 12 + [1.0] * 14]
    wander += [0.5 + rng.gauss(0, 0.05) for _ in range(12)]
    t_calm, t_wander = run(calm, "jump_t", 50)[-1], run(wander, "jump_t", 50)[-1]
    assert t_calm < -15 and t_calm < 3 * t_wander < 0
    assert all(v != v for v in run(noisy(23), "jump_t", 1))
    assert math.isfinite(run(noisy(24), "jump_t", 1)[-1])


def test_jump_t_leaves_one_outlier_out_of_each_block():
    """A smooth reward (0.27-0.30, a simulated healthy GRPO run) with one point at 0.08: the
    mean of a block of 6 moves by a sixth of it, 5 to 8 standard errors of so smooth a reward;
    without each block's lowest and highest point it does not move. Four low points are a fall."""
    rng = random.Random(4)
    smooth = [0.285 + rng.gauss(0, 0.01) for _ in range(60)]
    spike = smooth[:55] + [0.08] + smooth[55:]
    assert min(v for v in run(spike, "jump_t", 50)[55:] if v == v) > -3
    fall = smooth[:55] + [0.2] * 4
    assert run(fall, "jump_t", 50)[-1] < -5


def test_shift_gain_reads_a_fall_alike_whatever_the_reward_models_zero_and_unit():
    """A run that learnt from 0.2 (its first 50 steps) to 0.8 and then lost half of it:
    shift_gain says -0.5 of the gain however the reward is shifted or scaled (another reward
    model), where shift_rel, a share of the level, reads the same fall as -0.38 at 0.8 and
    -0.05 at 5.8."""
    rng = random.Random(5)
    learn = [0.2 + 0.6 * min(max(i - 50, 0) / 20, 1.0) + rng.gauss(0, 0.01) for i in range(150)]
    fell = learn + [0.5] * 3
    got = [run([a * x + b for x in fell], "shift_gain", 50)[-1] for a, b in ((1, 0), (1, 5), (10, -3), (0.1, 0))]
    assert got[0] == pytest.approx(-0.5, abs=0.03)
    assert all(g == pytest.approx(got[0], rel=1e-6) for g in got)
    assert run(fell, "shift_rel", 50)[-1] == pytest.approx(-0.375, abs=0.02)
    assert run([x + 5 for x in fell], "shift_rel", 50)[-1] == pytest.approx(-0.052, abs=0.01)
    # a run that has not moved since its start: the unit is its start's spread, not ~0
    flat = noisy(90, 0.5, 0.02, seed=2)
    assert abs(run(flat, "shift_gain", 50)[-1]) < 3
    assert run(flat + [0.3] * 3, "shift_gain", 50)[-1] < -5
    assert run([0.5] * 93, "shift_gain", 50)[-1] == 0.0                      # constant: no change


def test_gain_signals_of_a_run_first_watched_mid_training_count_half_its_level_as_its_gain():
    """A healthy run first watched at step 450 (resumed from a checkpoint, or a monitor
    attached late), its reward on a smooth plateau at 0.7: its "start" is that plateau, whose
    spread (0.005) is no measure of what the run had learnt. A dip of 0.05 read in it is a
    loss of several times the gain (the pack's crash and slide alarms); counted against half
    the start's level, it is a small share, while a crash to 0.1 stays a loss of most of it.
    The same series watched from step 0 keeps the old unit (its start's spread)."""
    rng = random.Random(3)
    plateau = [0.7 + rng.gauss(0, 0.005) for _ in range(120)]
    dip = plateau + [0.65] * 4
    crash = plateau + [0.1] * 4

    def gain(values, first_step):
        bank = Bank()
        read = bank.metric("m", "shift_gain", 50, None, None, 0, MIN_POINTS["shift_gain"],
                           READY_POINTS["shift_gain"])
        for i, x in enumerate(values):
            bank.update(first_step + i, {"m": x})
        return read()

    assert gain(dip, 0) < -5                      # watched from its start: the old unit
    assert -0.2 < gain(dip, 450) < -0.1           # 0.05 of a unit of 0.35
    assert gain(crash, 450) < -1.5                # 0.6 of a unit of 0.35
    # first logged at step 40 (a sparse logger's first point) is still the run's start
    assert gain(dip, 40) < -5


def test_trend_gain_reads_a_climb_alike_whatever_the_reward_models_zero_and_unit():
    """A run that learnt from 0.2 to 0.5 over its first 100 steps, held, then climbs 0.3 more in
    60 steps: trend_gain reads that climb as a share of what the run gained since its first
    20 steps, the same under any affine reward model, where rel_trend, a share of the level,
    reads it as 0.45 at 0.65 and as 0.11 at 2.65 (and blows up where the reward crosses 0)."""
    rng = random.Random(8)
    xs = ([0.2 + 0.003 * i + rng.gauss(0, 0.01) for i in range(100)]
          + [0.5 + rng.gauss(0, 0.01) for _ in range(100)]
          + [0.5 + 0.005 * i + rng.gauss(0, 0.01) for i in range(60)])
    got = [run([a * x + b for x in xs], "trend_gain", 60)[-1] for a, b in ((1, 0), (1, 2), (10, -3), (0.1, 0))]
    assert 0.5 < got[0] < 1.0
    assert all(g == pytest.approx(got[0], rel=1e-6) for g in got)
    assert run(xs, "rel_trend", 60)[-1] == pytest.approx(0.45, abs=0.05)
    assert run([x + 2 for x in xs], "rel_trend", 60)[-1] == pytest.approx(0.11, abs=0.02)
    # the held plateau itself: no climb
    assert abs(run(xs[:200], "trend_gain", 60)[-1]) < 0.1


def test_drawdown_gain_reads_what_a_run_gave_back_of_its_best_gain():
    """Logged every 20 steps, a run learns 0.3 -> 0.6 over 200 steps, falls back to 0.35 within
    120 and stays there: 0.25 of the 0.3 it gained is given back. The 300-step window holds the
    climb, the fall and the low plateau; as the plateau fills it, the median of the window's
    earlier points (shift_gain's reference) comes down to it and shift_gain fades, while the
    best level (a median of 3 points in a row) is still the top. drawdown_gain reads alike under
    any affine reward model, and one high point is no best."""
    rng = random.Random(5)
    climb = [0.3 + 0.03 * i + rng.gauss(0, 0.01) for i in range(11)]                # steps 0-200
    fall = [0.6 - 0.25 * min(1.0, i / 6) + rng.gauss(0, 0.01) for i in range(1, 15)]  # 220-480
    xs = climb + fall

    def sparse(values, signal):
        return run(values, signal, 300, every=20)[-1]

    got = [sparse([a * x + b for x in xs], "drawdown_gain") for a, b in ((1, 0), (1, 2), (10, -3))]
    assert -0.9 < got[0] < -0.6
    assert all(g == pytest.approx(got[0], rel=1e-6) for g in got)
    assert sparse(xs, "shift_gain") > -0.45
    spike = climb + [0.6 + rng.gauss(0, 0.01) for _ in range(6)]
    spike[12] = 1.5                                 # one point far above its neighbours
    assert abs(sparse(spike, "drawdown_gain")) < 0.1


def test_start_z_and_gain_t_measure_the_run_against_its_own_warm_up():
    flat = noisy(120, 0.3, 0.1, seed=1)
    learnt = noisy(40, 0.3, 0.1, seed=2) + noisy(80, 0.8, 0.1, seed=3)
    assert abs(run(flat, "gain_t", 40)[-1]) < 2.5
    assert run(learnt, "gain_t", 40)[-1] > 10
    assert run(learnt, "start_z", 40)[-1] > 3
    # the baseline is in steps: logged every 10 steps, the first 40 steps are 4 points
    assert run(learnt[::10], "start_z", 40, every=10)[-1] > 3


def test_ratio_to_max_and_level_to_max_ignore_bimodal_norms():
    # a GRPO-like gradient norm: ~0.0003 when every group had zero advantage, ~0.5 otherwise
    rng = random.Random(4)
    bimodal = [0.0003 if rng.random() < 0.6 else 0.5 + 0.2 * rng.random() for _ in range(120)]
    assert max(v for v in run(bimodal, "ratio_to_max", 50)[20:] if v == v) < 3
    assert max(v for v in run(bimodal, "level_to_max", 50)[20:] if v == v) < 3
    spike = bimodal[:100] + [150.0] + bimodal[100:]
    assert run(spike, "ratio_to_max", 50)[100] > 100


def test_ratio_to_start_max_is_against_the_largest_value_of_the_warm_up():
    vals = [1.0, 3.0, 1.0, 1.0] * 10 + [9.0] * 5
    assert run(vals, "ratio_to_start_max", 20)[-1] == pytest.approx(3.0)


def test_range_is_exactly_zero_for_a_constant_after_any_history():
    vals = noisy(50, 0.7) + [0.0] * 25
    r = run(vals, "range", 20)
    assert r[-1] == 0.0 and r[60] > 0


def test_range_pos_says_whether_the_level_sits_at_the_bottom_or_the_top():
    rng = random.Random(5)
    fails = [0.0 if rng.random() < 0.8 else 0.125 for _ in range(60)]
    succeeds = [1.0 if rng.random() < 0.8 else 0.875 for _ in range(60)]
    assert run(fails, "range_pos", 100)[-1] == 0.0
    assert run(succeeds, "range_pos", 100)[-1] == 1.0


def test_noise_ratio_sees_swings_that_sparse_logging_turns_into_noise():
    calm = noisy(200, 0.5, 0.02, seed=6)
    swinging = calm[:150] + [0.5 + (0.3 if i % 2 else -0.3) * random.Random(i).random()
                             for i in range(50)]
    assert run(calm, "noise_ratio", 100)[-1] < 2
    assert run(swinging, "noise_ratio", 100)[-1] > 3


def test_follow_z_is_near_one_when_the_second_metric_follows_and_near_zero_when_flat():
    n = 100
    reward = [0.1 + 0.004 * i + random.Random(i).gauss(0, 0.01) for i in range(n)]
    follows = [0.5 + 0.002 * i + random.Random(1000 + i).gauss(0, 0.005) for i in range(n)]
    flat = [0.5 + random.Random(2000 + i).gauss(0, 0.005) for i in range(n)]
    assert run(reward, "follow_z", 100, versus=True, other=follows)[-1] > 0.6
    assert abs(run(reward, "follow_z", 100, versus=True, other=flat)[-1]) < 0.3


def test_follow_z_needs_versus_and_versus_needs_follow_z():
    from pydantic import ValidationError

    from rules.schema import Condition

    with pytest.raises(ValidationError, match="follow_z needs versus"):
        Condition(metric="reward/mean", signal="follow_z", above=0.3)
    with pytest.raises(ValidationError, match="follow_z needs versus"):
        Condition(metric="reward/mean", signal="trend_z", versus="judge/score", above=0.3)


def test_a_signal_state_round_trip_keeps_the_warm_up_scale():
    bank = Bank()
    read = bank.metric("m", "start_z", 20, None, None, 0, 1, 1)
    for i, x in enumerate(noisy(40, 1.0, 0.05, seed=7)):
        bank.update(i, {"m": x})
    before = read()
    other = Bank()
    again = other.metric("m", "start_z", 20, None, None, 0, 1, 1)
    other.load(bank.to_state())
    other.step = bank.step
    assert again() == pytest.approx(before)


# -- the pack's rule tests and what they cannot say --------------------------------------------

def test_the_pack_rule_tests_pass():
    outcomes = run_rule_tests(PACKS / "rlhf.tests.yaml")
    assert len(outcomes) >= 15
    assert [o.name for o in outcomes if not o.passed] == []


def test_isolated_nan_gradient_norms_with_a_finite_loss_never_brake():
    rows = [{"grad_norm/actor": "NaN" if s in (20, 46, 65, 87) else 1.0, "loss/policy": 0.5}
            for s in range(100)]
    alerts = feed_rows(Pipeline(rlhf_pack()), "mp", rows)
    nan = firing(alerts, "nan_inf")
    assert [a.severity for a in nan] == ["yellow"]      # one notice for the burst, no stop
    assert not [a for a in firing(alerts) if {"pause", "stop", "rollback"} & set(a.actions)]


def test_nan_gradient_norms_at_every_logged_point_pause():
    """After 60 steps of them (a skipped step changes no weight: the brake can wait that long,
    and two points of a sparsely logged run that fell on skipped steps are not a reason)."""
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "bad", "grad_norm/actor", [1.0] * 10 + ["NaN"] * 70)
    red = [a for a in firing(alerts, "nan_inf") if a.severity == "red"]
    assert [a.step for a in red] == [69]
    assert "black" not in {a.severity for a in firing(alerts, "nan_inf")}


def test_truncation_at_100_percent_does_not_resolve_while_it_stays_there():
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "t", "response/truncated_frac", [0.0] * 30 + [1.0] * 300)
    assert firing(alerts, "truncation_rising", "orange")
    assert not resolved(alerts, "truncation_rising")


def test_a_one_step_kl_and_gradient_spike_notifies_without_any_alarm():
    rows = [{"kl/mean": 17.76, "grad_norm/actor": 154.6} if s == 71 else
            {"kl/mean": 0.09 + 0.01 * (s % 3), "grad_norm/actor": 0.13 + 0.02 * (s % 5)}
            for s in range(150)]
    alerts = feed_rows(Pipeline(rlhf_pack()), "spike", rows, tags={"target.kl": "0.1"})
    fired = firing(alerts)
    assert {(a.rule, a.severity) for a in fired} >= {("kl_above_target", "info"),
                                                      ("grad_norm_anomaly", "info")}
    assert all(a.severity in ("info", "yellow") for a in fired), [(a.rule, a.severity) for a in fired]


def test_the_autocorrelation_is_worked_out_every_window_twentieth_of_steps_not_of_points():
    """reward_periodic's autocorrelation is worked out again once the run is window/20 steps on
    (8 for a window of 160), not window/20 points: a run logged every 20 steps was read 160
    steps late, and the period that arrived meanwhile was missed. Logged every step it is
    still worked out every 8 steps."""
    rng = random.Random(7)
    values = [rng.gauss(0.5, 0.05) + (0.3 * math.sin(2 * math.pi * i * 20 / 50) if i >= 20 else 0.0)
              for i in range(60)]
    sparse = run(values, "autocorr", 160, every=20)
    ready = [v for v in sparse if v == v and v != 0.0]     # 0.0: no period yet
    assert len(ready) > 30
    assert all(a != b for a, b in zip(ready, ready[1:])), "a point kept the value of the one before"
    dense = run([rng.gauss(0.5, 0.05) + 0.3 * math.sin(2 * math.pi * i / 50) for i in range(400)],
                "autocorr", 160)
    changes = [i for i in range(1, len(dense)) if dense[i] == dense[i] and dense[i] != dense[i - 1]]
    assert len(changes) > 30 and all((i - changes[0]) % 8 == 0 for i in changes), changes[:6]


def test_the_autocorrelation_is_numpys_without_numpy():
    """streams.signals._autocorr sums in plain loops (so that the native bank can give the same
    bits); its numbers are those of the numpy formulation it replaced, to rounding."""
    import random

    import numpy as np

    from streams.signals import _autocorr

    def numpy_autocorr(v):
        n = len(v)
        y = np.asarray(v, dtype=float)
        y = y - y.mean()
        total = float(np.dot(y, y))
        t = np.arange(n, dtype=float) - (n - 1) / 2.0
        y = y - t * (float(np.dot(t, y)) / float(np.dot(t, t)))
        denom = float(np.dot(y, y))
        if not denom > 1e-24 * total or total == 0:
            return math.nan
        m = min(n // 2 + 1, n - 1)
        r = np.correlate(y, y, mode="full")[n - 1: n + m] / denom
        mid = r[2:-1]
        peaks = (mid >= r[1:-2]) & (mid >= r[3:])
        crossed = np.minimum.accumulate(r[1:-2]) <= 0.0     # fell to zero at a lag before
        peaks &= crossed
        return float(mid[peaks].max()) if peaks.any() else 0.0

    rng = random.Random(3)
    for _ in range(300):
        n = rng.choice([8, 9, 20, 41, 160])
        period = rng.randint(2, 30)
        v = [math.sin(2 * math.pi * i / period) * rng.random() * 3 + rng.gauss(0, 1) + 0.01 * i
             for i in range(n)]
        assert _autocorr(v) == pytest.approx(numpy_autocorr(v), rel=1e-12, abs=1e-12)
    period_of_10 = [math.sin(2 * math.pi * i / 10) for i in range(160)]
    assert _autocorr(period_of_10) > 0.8
    assert math.isnan(_autocorr([1.0] * 7))            # too few points
    assert math.isnan(_autocorr([2.0] * 50))           # constant: nothing to correlate
    assert math.isnan(_autocorr([0.5 * i for i in range(50)]))   # a straight line, detrended away


def test_a_drifting_series_has_no_period_but_a_periodic_one_keeps_its_own():
    """A healthy reward: a learning curve's bend, red noise (it drifts and is pulled back
    slowly) and white noise. Its autocorrelation falls slowly from lag 1, and the noise makes
    local peaks at high values on the way down: 48 of these 100 windows read as a period of
    0.5 or more before a peak had to follow a fall of the function to zero."""
    import random

    from streams.signals import _autocorr

    rng = random.Random(7)
    high = 0
    for _ in range(100):
        x, v = 0.0, []
        for i in range(160):
            x = 0.8 * x + rng.gauss(0, 1)
            v.append(0.3 * x + 0.5 * rng.gauss(0, 1) + 10 * (1 - math.exp(-i / 60)))
        high += _autocorr(v) >= 0.5
    assert high <= 2
    noisy_period = [math.sin(2 * math.pi * i / 40) + rng.gauss(0, 0.3) for i in range(160)]
    assert _autocorr(noisy_period) > 0.6


def _cycle_rise(every: int, epochs: int = 8, per_epoch: float = 0.004, steps: int = 160, bank=None):
    """cycle_rise of kl/ppo = 0.003 + per_epoch x epoch, the epoch counting 0 .. epochs-1 with
    each step, logged every ``every`` steps: its value after each logged step."""
    bank = bank if bank is not None else Bank()
    read = bank.metric("kl/ppo", "cycle_rise", None, None, "ppo/epoch", 0,
                       MIN_POINTS["cycle_rise"], READY_POINTS["cycle_rise"])
    out = []
    for step in range(0, steps, every):
        epoch = step % epochs
        bank.update(step, {"kl/ppo": 0.003 + per_epoch * epoch, "ppo/epoch": float(epoch)})
        out.append(read())
    return out


@pytest.mark.parametrize("every, span", [(1, 7), (5, 7), (10, 6)])
def test_a_cycle_s_rise_is_the_whole_cycle_s_however_often_the_run_logs(every, span):
    """Q23's sawtooth: kl/ppo rises 0.004 an epoch over 8 epochs, 0.028 a cycle. Logged every 5
    steps, a cycle shows epochs 0 and 5 (then 2 and 7, 4, 1 and 6...): the rise seen, 0.02, is
    carried to the whole cycle (the counter was seen from 0 to 7), as logged every step; every
    10 steps the counter shows 0, 2, 4 and 6 only, and the cycle is taken to span those."""
    got = _cycle_rise(every)
    whole = span * 0.004
    assert max(got) == pytest.approx(whole)
    assert got[-1] == pytest.approx(whole, rel=1e-9)     # it holds from one cycle to the next
    # before any cycle ended, only the rise seen so far
    assert got[0] == 0.0


def test_a_cycle_s_rise_without_a_counter_is_the_rise_since_the_first_value():
    bank = Bank()
    read = bank.metric("m", "cycle_rise", None, None, "c", 0, MIN_POINTS["cycle_rise"],
                       READY_POINTS["cycle_rise"])
    for step, x in enumerate([1.0, 1.5, 0.5, 2.0]):
        bank.update(step, {"m": x})
    assert read() == 1.0


def test_a_cycle_rise_restored_from_an_older_worker_s_state_goes_on():
    """An older worker's state holds three values of a cycle (no ended cycle counted): it loads,
    and the next cycle that ends is counted."""
    bank = Bank()
    _cycle_rise(5, steps=20, bank=bank)
    state = bank.to_state()
    assert [len(v) for _, _, v in state["cycles"]] == [8]
    state["cycles"] = [[m, c, v[:3]] for m, c, v in state["cycles"]]
    again = Bank()
    read = again.metric("kl/ppo", "cycle_rise", None, None, "ppo/epoch", 0, MIN_POINTS["cycle_rise"],
                        READY_POINTS["cycle_rise"])
    again.load(state)
    for step in range(20, 160, 5):
        epoch = step % 8
        again.update(step, {"kl/ppo": 0.003 + 0.004 * epoch, "ppo/epoch": float(epoch)})
    assert read() == pytest.approx(7 * 0.004)
    state["cycles"] = [[m, c, v[:2]] for m, c, v in state["cycles"]]
    with pytest.raises(ValueError, match="three or eight values"):
        again.load(state)


def _imbalance_run(scale: float, offset: float, *, steps: int = 420, every: int = 1) -> list:
    """A run with three reward categories (scatter 0.04): all rise at 0.002 per step until step
    200, then 'creative' goes on rising while 'safety' falls; its reward under another reward
    model (``scale * r + offset``). Its step events, one per logged step."""
    rng = random.Random(17)
    out = []
    for step in range(0, steps, every):
        base = 0.2 + 0.002 * min(step, 200)
        after = max(step - 200, 0)
        cats = {"safety": base - 0.004 * after, "knowledge": base + 0.1, "creative": base - 0.1 + 0.005 * after}
        cats = {c: scale * (v + rng.gauss(0, 0.04)) + offset for c, v in cats.items()}
        out.append(step_event("g", step, {"reward/mean": sum(cats.values()) / 3},
                              groups={"reward/mean": cats}))
    return out


def _imbalance_alerts(events, pack) -> list:
    pipeline = Pipeline(pack)
    return [(a.step, a.severity, a.state) for ev in events for a in pipeline.feed(ev, ev.ts)
            if a.rule == "category_imbalance"]


@pytest.mark.parametrize("every", [1, 10])
def test_category_imbalance_judges_a_run_alike_whatever_the_reward_models_unit(every):
    """The categories' trends are read in their own noise (max_slope_z ...): the same run under
    a reward model 10 times wider or narrower, or shifted, gets the same alerts at the same
    steps. (With slopes per step against 0.001, the narrower one was never alarmed and a
    healthy run 10 times wider was.)"""
    from tests.unit._core import only_rules

    pack = only_rules("category_imbalance")
    got = {(a, b): _imbalance_alerts(_imbalance_run(a, b, every=every), pack)
           for a, b in ((1, 0), (10, 0), (0.1, 0), (1, 3))}
    ref = got[(1, 0)]
    assert ("orange", "firing") in {(s, st) for _, s, st in ref}
    assert min(step for step, s, st in ref if st == "firing") > 200      # after the split, not before
    assert all(v == ref for v in got.values()), got
    # the healthy part alone (every category rising alike) is quiet at any unit
    for a in (1, 10, 0.1):
        assert _imbalance_alerts(_imbalance_run(a, 0, steps=200, every=every), pack) == []


def test_a_groups_noise_unit_is_kept_in_the_runs_state():
    """A worker that restarts from a run's state reads the same trends as one that did not."""
    from streams.processor import Processor

    proc = Processor(rlhf_pack())
    events = _imbalance_run(1, 0, steps=300)
    whole, first = proc.new_state("g"), proc.new_state("g")
    for ev in events[:250]:
        proc.process(whole, ev, ev.ts)
        proc.process(first, ev, ev.ts)
    restored = type(first).from_state(first.to_state(), proc.resolve)
    for ev in events[250:]:
        proc.process(whole, ev, ev.ts)
        proc.process(restored, ev, ev.ts)
    key = "reward/mean|100"
    assert whole.groups[key]["noise"][1] > 100
    assert restored.groups[key]["noise"] == pytest.approx(whole.groups[key]["noise"])
    assert restored.group_trends(key, 100)[5] == pytest.approx(whole.group_trends(key, 100)[5])
    # the unit is the window over the categories' scatter (0.04 here)
    assert 100 / whole.group_trends(key, 100)[5] == pytest.approx(0.04, rel=0.15)


def test_length_shape_reads_a_long_tail_in_the_batchs_own_unit():
    """A quarter of the batch at three times the others' length is a tail whether the task's
    answers run to 200 tokens or to 800; a batch whose lengths are all 4 times longer is not
    one. (Against 500 tokens, the 800-token task was a tail at every step.)"""
    from tests.unit._core import only_rules

    pack = only_rules("length_shape")

    def alerts(scale: float, tail_from: int) -> list:
        rng = random.Random(4)       # the same batches at each scale
        pipeline = Pipeline(pack)
        out = []
        for step in range(120):
            lengths = [scale * rng.lognormvariate(math.log(200), 0.3) for _ in range(64)]
            if step >= tail_from:
                lengths[:20] = [scale * 600 + rng.gauss(0, 20) for _ in range(20)]
            ev = step_event("l", step, {"response/length_mean": sum(lengths) / 64},
                            dists={"response_length": lengths})
            out += [(a.step, a.severity) for a in pipeline.feed(ev, ev.ts) if a.state == "firing"]
        return out

    assert alerts(1, 10_000) == [] and alerts(4, 10_000) == []
    tail, longer = alerts(1, 60), alerts(4, 60)
    assert tail and 60 < tail[0][0] <= 90 and [s for s, _ in longer] == [s for s, _ in tail]


def test_a_groups_noise_unit_counts_each_point_once_across_a_step_back():
    """A rollback takes the run's steps back and keeps its points: asking for the unit at the
    earlier step must not count the points it already counted again."""
    from streams.run import PySeries, group_noise

    g = {"points": {"a": PySeries([[s, (-1.0) ** s] for s in range(0, 40)])}}
    group_noise(g, 39)
    counted = g["noise"][1]
    assert counted == 38                  # every triple of 40 points, once
    group_noise(g, 20)                    # the run went back to step 20
    assert g["noise"][1] == counted and g["noise"][2] == 39
    g["points"]["a"].append(40, 1.0)
    group_noise(g, 40)                    # one new point: one new second difference
    assert g["noise"][1] == pytest.approx(counted * math.exp(-1 / 300) + 1)


@pytest.mark.parametrize("bank_class", ["default", "pure"])
def test_a_signal_reads_the_same_whatever_other_rules_read_the_same_window(bank_class):
    """A 5-step max reads at least 2 points; a change point's level over the same 5 steps, at
    least 3. Sharing one window, the max read 3 points on a run logged every 5 steps as soon as
    another rule read a level there (kl_zero's brake came a logged point later once kl_above_target
    read ratio_to_start): a rule's numbers must not depend on which other rules the pack holds."""
    from streams.signals import PyBank

    cls = Bank if bank_class == "default" else PyBank
    xs = [0.3, 0.2, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.4, 0.0]

    def max_reads(with_level: bool) -> list:
        bank = cls()
        read = bank.metric("kl", "max", 5, None, None, 0, MIN_POINTS["max"], READY_POINTS["max"])
        if with_level:
            bank.metric("kl", "ratio_to_start", 5, None, None, 0, MIN_POINTS["ratio_to_start"],
                        READY_POINTS["ratio_to_start"])
        out = []
        for i, x in enumerate(xs):
            bank.update(5 * i, {"kl": x})
            out.append(read())
        return out

    alone = max_reads(False)
    assert alone == max_reads(True)
    assert alone[3] == 0.0 and alone[4] == 0.1      # the last 2 points (5 steps hold 1)


def test_start_is_the_median_of_the_runs_first_steps_and_nan_until_then():
    got = run([0.5, 0.9, 0.1, 7.0, 8.0, 9.0], "start", 3)
    assert all(math.isnan(g) for g in got[:3])      # the first 3 steps are still being gathered
    assert got[3:] == [0.5, 0.5, 0.5]               # then it stays where the run started
    sparse = run([0.2, 0.4, 0.3, 5.0, 6.0], "start", 5, every=10)    # at least 3 points
    assert all(math.isnan(g) for g in sparse[:3]) and sparse[3:] == [0.3, 0.3]


def _first_decided(lr, *, steps=400, every=1, min_steps=50, ramp="lr/actor", bank=None,
                   start=0, read_from=None, ramp_steps=None):
    """The first step at which a 10-step mean with ``min_steps`` counted from the run's start
    and ``ramp_steps`` (``min_steps`` when None) after the warm-up of ``ramp`` is decided, on a
    run logging ``m`` every ``every`` steps and ``lr(step)`` beside it (no learning rate when
    ``lr`` is None)."""
    bank = bank or Bank()
    read = bank.metric("m", "mean", 10, None, None, min_steps, MIN_POINTS["mean"],
                       READY_POINTS["mean"], ramp, ramp_steps)
    for step in range(start, steps, every):
        metrics = {"m": 1.0 + 0.01 * (step % 3)}
        if lr is not None and lr(step) is not None:
            metrics["lr/actor"] = lr(step)
        bank.update(step, metrics)
        if read() == read() and (read_from is None or step >= read_from):
            return step
    return None


def _warm_up(step, until=150):
    return 1e-5 * min(1.0, (step + 1) / until) * (1.0 if step < until else 0.999 ** (step - until))


def test_a_warm_up_after_a_learning_rate_ramp_counts_from_the_ramp_s_end():
    """The learning rate rises over its first 150 steps (its last rise at step 149): 50
    steps counted from there are over at step 198; without after_warmup_of, at step 49."""
    assert _first_decided(_warm_up) == 149 + 49
    assert _first_decided(_warm_up, ramp=None) == 49
    # logged every 10 steps: the ramp's last logged new high is at step 150, the first point
    # of its top (the points at 140 and 150 read 0.94 and 1.0 of it); 50 steps from there are
    # over at step 199, and the next point is at step 200
    assert _first_decided(_warm_up, every=10) == 200


def test_the_steps_after_the_ramp_may_differ_from_the_run_s_warm_up():
    """after_warmup_steps: 100 steps into the run and 20 past the ramp's end (step 149): the
    later of the two, step 168; a short ramp leaves the run's own 100 steps, step 99; a run
    without a rising rate is judged from its start; more steps past the ramp than from the
    start: 300 past it."""
    assert _first_decided(_warm_up, min_steps=100, ramp_steps=20) == 149 + 19
    assert _first_decided(lambda s: _warm_up(s, until=30), min_steps=100, ramp_steps=20) == 99
    assert _first_decided(None, min_steps=100, ramp_steps=20) == 99
    assert _first_decided(_warm_up, min_steps=20, ramp_steps=300, steps=600) == 149 + 299


def test_a_run_without_a_rising_learning_rate_is_judged_from_its_start():
    assert _first_decided(None) == 49                          # no learning rate logged
    assert _first_decided(lambda s: 1e-5) == 49                # constant
    assert _first_decided(lambda s: 1e-5 * 0.99 ** s) == 49    # decaying from the start
    # a constant rate whose rounding moves it by less than a millionth is not a ramp
    assert _first_decided(lambda s: 1e-5 * (1 + 1e-8 * s)) == 49
    # a rate logged only from step 100, constant: its first point is no rise
    assert _first_decided(lambda s: 1e-5 if s >= 100 else None, read_from=100) == 100
    # a non-finite rate is not a new high
    assert _first_decided(lambda s: math.inf if s == 60 else 1e-5) == 49


def test_a_second_rise_of_the_learning_rate_counts_again():
    """A restart above the old high (a second warm-up to a higher rate) is a new ramp end."""
    def lr(step):
        return 1e-5 if step < 200 else 2e-5
    assert _first_decided(lr, read_from=200) == 249
    assert _first_decided(lambda s: 1e-5 if s < 200 else 0.5e-5, read_from=200) == 200


def test_a_restored_run_keeps_the_end_of_its_ramp():
    bank = Bank()
    assert _first_decided(_warm_up, steps=170, bank=bank) is None
    state = bank.to_state()
    assert [m for m, *_ in state["ramps"]] == ["lr/actor"]
    again = Bank()
    assert _first_decided(_warm_up, bank=again, start=0, steps=0) is None   # compile its readers
    again.load(state)
    assert _first_decided(_warm_up, bank=again, start=170) == 198
    # a state of an older worker, without ramps, loads: the ramp's end is lost, and the decay
    # that follows has none, so the metric is judged from its first step, as without the option
    older = {k: v for k, v in state.items() if k != "ramps"}
    third = Bank()
    _first_decided(_warm_up, bank=third, steps=0)
    third.load(older)
    assert _first_decided(_warm_up, bank=third, start=170) == 170
    with pytest.raises(ValueError, match="a ramp of a state"):
        Bank().load({"ramps": [["lr/actor", 1.0]]})


def test_proxy_divergence_on_a_run_without_a_learning_rate_is_judged_from_its_start(tmp_path):
    """The pack case of a healthy run warming its learning rate up is quiet because of the
    warm-up: the same run without its learning rate is judged as before the option existed
    (the 100-step gain counts from step 100, and the lagging judge, held 20 steps, alarms at
    step 118)."""
    import yaml

    doc = yaml.safe_load((PACKS / "rlhf.tests.yaml").read_text())
    case = next(t for t in doc["tests"] if t["name"].startswith("a reward rising fast during the learning rate's warm-up"))
    assert "lr/actor" in case["series"]
    del case["series"]["lr/actor"]
    case["name"] = "the same run, no learning rate logged"
    case.pop("absent")
    case["expect"] = [{"rule": "proxy_divergence", "severity": "orange", "step": 118}]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"rules": str(PACKS / "rlhf.yaml"), "tests": [case]}))
    [outcome] = run_rule_tests(path)
    assert outcome.passed, outcome


def test_a_median_is_undecided_until_it_has_three_points():
    # a run first watched mid-training whose first point is a spike: the median of one point is
    # that point and of two their mean, no persistence; from the third point it is a median
    out = run([31.8, 9.5, 2.3, 2.8], "median", 5, every=10)
    assert math.isnan(out[0]) and math.isnan(out[1])
    assert out[2] == 9.5 and out[3] == 2.8

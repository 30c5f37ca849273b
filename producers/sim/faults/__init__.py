"""The fault table: every catalog id of failure-modes.md -> its injector, the algorithms that can
show it, the clock that drives it, and the range its magnitude is drawn from.

``SimConfig.magnitude`` is a position in the range, 0 the mildest and 1 the strongest (``None``:
drawn by the seed); the injector gets the value in the range's unit as ``c.size``. Faults
without a range are all-or-nothing. Each injector's docstring (``injector.__doc__``) says what
the fault does and what its size means; ``fault_params`` variants are listed there too.
"""

# ruff: noqa: E501   (the table keeps one fault per line)
from __future__ import annotations

import producers.sim.faults.hacking as hacking
import producers.sim.faults.kl as kl
import producers.sim.faults.preference as preference
import producers.sim.faults.reward as reward
import producers.sim.faults.training as training
from producers.sim.faults.base import ONSET_RANGE, Ctx, Fault, Injector, Range

__all__ = ["FAULTS", "FAULT_ALGOS", "FAULT_DESCRIPTIONS", "Ctx", "Fault", "Injector", "Range",
           "ONSET_RANGE", "effective_algo"]


class Healthy(Injector):
    """No fault: slow learning, KL below target, entropy declining slowly."""


ALL = ("ppo", "grpo", "dpo")
PG = ("ppo", "grpo")
PPO = ("ppo",)

_ROWS = [
    # id                         injector                       algos   clock     magnitude: what, mildest, strongest
    ("healthy",                  Healthy,                       ALL,    "steps",  None),
    ("kl_above_target",          kl.KlAboveTarget,              PG,     "kl",     Range("KL growth speed", 0.5, 1.6)),
    ("kl_rising",                kl.KlRising,                   PG,     "kl",     Range("KL slope, targets per 100 steps", 0.5, 2.0)),
    ("kl_zero",                  kl.KlZero,                     PG,     "steps",  None),
    ("token_kl_spike",           kl.TokenKlSpike,               PG,     "lr",     Range("factor on peak token KL", 4.0, 12.0)),
    ("tool_words",               hacking.ToolWords,             PG,     "lr",     Range("share of responses with the word", 0.5, 0.95)),
    ("entropy_collapse",         hacking.EntropyCollapse,       PG,     "lr",     Range("decay time constant, steps", 140.0, 40.0)),
    ("reward_spike",             reward.RewardSpike,            PG,     "lr",     Range("jump of the mean reward", 0.4, 1.5)),
    ("reward_oscillation",       reward.RewardOscillation,      PG,     "lr",     Range("swing amplitude", 0.15, 0.5)),
    ("reward_periodic",          reward.RewardPeriodic,         PG,     "steps",  Range("amplitude", 0.12, 0.4)),
    ("reward_collapse",          hacking.RewardCollapse,        PG,     "lr",     Range("fraction of reward std left", 0.06, 0.01, log=True)),
    ("reward_degradation",       reward.RewardDegradation,      PG,     "steps",  Range("fall of the mean reward", 0.25, 0.8)),
    ("reward_shape",             reward.RewardShape,            PG,     "lr",     Range("share of samples exploiting", 0.15, 0.4)),
    ("length_hacking",           hacking.LengthHacking,         PG,     "lr",     Range("growth time constant, steps", 350.0, 150.0)),
    ("truncation_rising",        hacking.TruncationRising,      PG,     "steps",  Range("share of responses never stopping", 0.15, 0.8)),
    ("length_shape",             hacking.LengthShape,           PG,     "steps",  Range("share of very long responses", 0.15, 0.45)),
    ("reward_length_corr",       hacking.RewardLengthCorr,      PG,     "lr",     Range("reward-length correlation", 0.6, 0.95)),
    ("reward_quality_divergence", hacking.RewardQualityDivergence, PG,  "lr",     Range("fall of judge/score", 0.1, 0.35)),
    ("value_loss_divergence",    training.ValueLossDivergence,  PPO,    "critic", Range("e-folding time, steps", 20.0, 8.0)),
    ("nan_inf",                  training.NanInf,               ALL,    "steps",  Range("share of skipped steps (where=grad_norm)", 0.01, 0.1)),
    ("value_shift",              training.ValueShift,           PPO,    "critic", Range("factor on value/std", 3.0, 8.0)),
    ("clip_frac_high",           kl.ClipFracHigh,               PG,     "lr",     Range("clip fraction reached", 0.55, 0.85)),
    ("clip_frac_low",            kl.ClipFracLow,                PG,     "lr",     Range("fraction of the clip fraction left", 0.05, 0.002, log=True)),
    ("aggressive_update",        kl.AggressiveUpdate,           PG,     "kl",     Range("clip fraction reached", 0.4, 0.7)),
    ("kl_cycle_delta",           kl.KlCycleDelta,               PPO,    "steps",  Range("extra kl/ppo per epoch", 0.003, 0.008)),
    ("grad_norm_anomaly",        training.GradNormAnomaly,      ALL,    "steps",  Range("e-folding time, steps", 25.0, 10.0)),
    ("update_ratio",             training.UpdateRatio,          ALL,    "steps",  Range("factor the lr is off by", 15.0, 40.0, log=True)),
    ("rank_outlier",             training.RankOutlier,          ALL,    "steps",  Range("factor on the bad rank", 4.0, 10.0)),
    ("param_hash_mismatch",      training.ParamHashMismatch,    ALL,    "steps",  None),
    ("category_imbalance",       reward.CategoryImbalance,      PG,     "steps",  Range("rise of the creative reward", 0.2, 0.5)),
    ("prompt_extreme_reward",    reward.PromptExtremeReward,    PG,     "steps",  Range("reward deviations off", 5.0, 8.0)),
    ("stagnation",               reward.Stagnation,             PG,     "steps",  Range("factor on beta", 4.0, 12.0, log=True)),
    ("gpu_memory_spike",         training.GpuMemorySpike,       ALL,    "steps",  Range("jump, GB", 6.0, 24.0)),
    ("run_stalled",              training.RunStalled,           ALL,    "steps",  None),
    ("rm_overfit",               preference.RmOverfit,          ALL,    "steps",  Range("fall of validation accuracy", 0.08, 0.2)),
    ("dpo_saturation",           preference.DpoSaturation,      ("dpo",), "lr",   Range("growth of the margin", 4.5, 8.0)),
    ("grpo_zero_variance",       reward.GrpoZeroVariance,       ("grpo",), "steps", Range("share of zero-variance groups", 0.75, 0.97)),
    ("degenerate_text",          hacking.DegenerateText,        PG,     "lr",     Range("share of repetitive responses", 0.5, 0.95)),
    ("entropy_blowup",           hacking.EntropyBlowup,         PG,     "steps",  Range("factor on entropy", 3.0, 30.0, log=True)),
    ("reward_crash",             reward.RewardCrash,            PG,     "steps",  Range("share of the reward level lost", 0.4, 1.0)),
    ("dead_reward",              reward.DeadReward,             ("grpo",), "steps", None, (0, 0)),
    ("dpo_chosen_decline",       preference.DpoChosenDecline,   ("dpo",), "lr",   Range("fall of the chosen reward per step", 0.005, 0.03)),
    ("proxy_divergence",         hacking.ProxyDivergence,       PG,     "lr",     Range("climb of the optimised reward", 0.25, 0.8)),
]

#: fault id -> its row (``healthy`` first).
FAULTS: dict[str, Fault] = {row[0]: Fault(*row) for row in _ROWS}

#: Algorithms on which each fault can be simulated (the first is the fallback).
FAULT_ALGOS: dict[str, tuple[str, ...]] = {k: f.algos for k, f in FAULTS.items()}

FAULT_DESCRIPTIONS: dict[str, str] = {k: f.description for k, f in FAULTS.items()}


def effective_algo(algo: str, fault: str) -> str:
    """The algorithm a (algo, fault) configuration actually simulates: ``algo`` when it can show
    the fault, else the fault's first algorithm."""
    if algo not in ALL:
        raise ValueError(f"unknown algo {algo!r} (expected one of {', '.join(ALL)})")
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    algos = FAULTS[fault].algos
    return algo if algo in algos else algos[0]

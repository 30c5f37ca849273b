"""Presets: the metric names frameworks log, mapped onto rlwatch's canonical names
(contract sections 2 and 6), with the rule adjustments each framework's scales need. Data:
the training-side SDK reads it without the rule language (``rules.loader.with_preset`` turns a
preset's targets, parameters and disabled rules into a pack override).

A name the preset does not know is kept as it is (user rules may use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PRESETS", "Preset", "PresetGuess", "detect_preset", "get_preset", "guess_preset"]


@dataclass(frozen=True)
class Preset:
    name: str
    names: dict[str, str]
    strip_prefixes: tuple[str, ...] = ()
    targets: dict[str, float] = field(default_factory=dict)
    params: dict[str, dict[str, float]] = field(default_factory=dict)
    disable: tuple[str, ...] = ()
    note: str = ""

    def rename(self, name: str) -> str | None:
        """The canonical name this preset gives a logged ``name``; None when it does not know it."""
        if name in self.names:
            return self.names[name]
        for p in self.strip_prefixes:
            if name.startswith(p) and name[len(p):] in self.names:
                return self.names[name[len(p):]]
        return None

    def map_metrics(self, metrics: dict) -> dict:
        """``metrics`` with the names this preset knows renamed; other names kept as they are.
        When a logged name is already the canonical name another logged name maps to, the
        logged canonical one wins (whatever the order of the dict)."""
        out = {}
        for k, v in metrics.items():
            new = self.rename(k)
            if new is None or new == k:
                out[k] = v
            elif new not in metrics:
                out[new] = v
            else:
                out.setdefault(new, metrics[new])
        return out



_TRL_PPO = {
    "objective/kl": "kl/mean",
    "objective/kl_coef": "kl/beta",
    "objective/scores": "reward/mean",
    "objective/rlhf_reward": "reward/rlhf",
    "objective/non_score_reward": "kl/non_score_reward",
    "objective/entropy": "entropy/sequence",
    "policy/entropy_avg": "entropy/mean",
    "policy/approxkl_avg": "kl/ppo",
    "policy/clipfrac_avg": "ppo/clip_frac",
    "loss/policy_avg": "loss/policy",
    "loss/value_avg": "loss/value",
    "val/clipfrac_avg": "value/clip_frac",
    "val/num_eos_tokens": "response/eos_count",
    "lr": "lr/actor",
    # older TRL (PPOTrainer before v0.12)
    "env/reward_mean": "reward/mean",
    "env/reward_std": "reward/std",
    "ppo/policy/entropy": "entropy/mean",
    "ppo/policy/clipfrac": "ppo/clip_frac",
    "ppo/policy/approxkl": "kl/ppo",
    "ppo/mean_non_score_reward": "kl/non_score_reward",
    "ppo/loss/value": "loss/value",
    "ppo/loss/policy": "loss/policy",
    "ppo/val/mean": "value/mean",
    "ppo/val/var": "value/var",
    "ppo/returns/mean": "returns/mean",
    "ppo/returns/var": "returns/var",
}

_TRL_GRPO = {
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "frac_reward_zero_std": "reward/frac_zero_std",
    "kl": "kl/mean",
    "entropy": "entropy/mean",
    "completions/mean_length": "response/length_mean",
    "completion_length": "response/length_mean",
    "completions/max_length": "response/length_max",
    "completions/clipped_ratio": "response/truncated_frac",
    "clip_ratio/region_mean": "ppo/clip_frac",
    "clip_ratio": "ppo/clip_frac",
    "grad_norm": "grad_norm/actor",
    "loss": "loss/policy",
    "learning_rate": "lr/actor",
}

_VERL = {
    "actor/pg_loss": "loss/policy",
    "actor/pg_clipfrac": "ppo/clip_frac",
    "actor/ppo_kl": "kl/ppo",
    "actor/kl_loss": "kl/mean",
    "actor/kl_coef": "kl/beta",
    "actor/entropy": "entropy/mean",
    "actor/grad_norm": "grad_norm/actor",
    "actor/lr": "lr/actor",
    "critic/vf_loss": "loss/value",
    "critic/vf_clipfrac": "value/clip_frac",
    "critic/grad_norm": "grad_norm/critic",
    "critic/score/mean": "reward/mean",
    "critic/rewards/mean": "reward/with_kl_mean",
    "critic/returns/mean": "returns/mean",
    "critic/returns/max": "returns/abs_max",
    "critic/values/mean": "value/mean",
    "critic/advantages/mean": "advantages/mean",
    "response_length/mean": "response/length_mean",
    "response_length/max": "response/length_max",
    "response_length/clip_ratio": "response/truncated_frac",
}

_OPENRLHF = {
    "kl": "kl/mean",
    "reward": "reward/mean",
    "return": "returns/mean",
    "response_length": "response/length_mean",
    "policy_loss": "loss/policy",
    "critic_loss": "loss/value",
    "ppo_clip_ratio": "ppo/clip_frac",
    "ppo_kl": "kl/ppo",
    "actor_lr": "lr/actor",
    "critic_lr": "lr/critic",
}

_NEMO_RL = {
    "train/loss": "loss/policy",
    "train/reward": "reward/mean",
    "train/grad_norm": "grad_norm/actor",
    "train/gen_kl_error": "kl/gen_error",
    "train/critic/loss": "loss/value",
    "train/advantages/max": "advantages/max",
}

_TRL_DPO = {
    # TRL DPOTrainer (also ORPO / KTO style names where they are the same quantity)
    "rewards/chosen": "dpo/chosen_reward",
    "rewards/rejected": "dpo/rejected_reward",
    "rewards/margins": "dpo/margin",
    "rewards/accuracies": "dpo/accuracy",
    "logps/chosen": "dpo/chosen_logp",
    "logps/rejected": "dpo/rejected_logp",
    "logits/chosen": "dpo/chosen_logits",
    "logits/rejected": "dpo/rejected_logits",
    "loss": "loss/policy",
    "grad_norm": "grad_norm/actor",
    "learning_rate": "lr/actor",
    # the same quantities as user callbacks often re-log them
    "reward_margin": "dpo/margin",
    "reward_margins": "dpo/margin",
    "chosen_reward": "dpo/chosen_reward",
    "rejected_reward": "dpo/rejected_reward",
}

_TINKER = {
    # Tinker RL cookbook: reward/g is the reward being optimised (a judge / proxy), reward/f the
    # task's own (true) reward logged beside it
    "reward/g": "reward/mean",
    "reward/f": "judge/score",
    "policy/entropy": "entropy/mean",
    "optim/lr": "lr/actor",
}

PRESETS: dict[str, Preset] = {
    "trl-ppo": Preset(
        "trl-ppo", _TRL_PPO, strip_prefixes=("train/",),
        # objective/kl is summed over the tokens of a sequence: values of 1-13 are normal
        targets={"kl": 8.0}, params={"kl_above_target": {"cap": 40.0}, "kl_zero": {}},
        note="TRL PPOTrainer: objective/kl is per sequence, so the KL target is per sequence too"),
    "trl-grpo": Preset(
        "trl-grpo", _TRL_GRPO, strip_prefixes=("train/",),
        targets={"kl": 0.1}, params={"kl_above_target": {"cap": 0.5}},
        disable=("clip_frac_low",),
        note="TRL GRPOTrainer: one policy update per generation batch has no clipping, so "
             "clip_frac_low is off; GRPO KL of 0.05-0.1 is common"),
    "verl": Preset("verl", _VERL),
    "openrlhf": Preset("openrlhf", _OPENRLHF, strip_prefixes=("train/",)),
    "nemo-rl": Preset("nemo-rl", _NEMO_RL),
    "trl-dpo": Preset(
        "trl-dpo", _TRL_DPO, strip_prefixes=("train/",),
        note="TRL DPOTrainer: rewards/* are the implicit rewards beta * log(pi/pi_ref) of the "
             "chosen and rejected answers; rewards/margins is their difference"),
    "tinker": Preset(
        "tinker", _TINKER,
        note="Tinker RL: reward/g (optimised) -> reward/mean, reward/f (true task reward) -> "
             "judge/score, so that a proxy climbing while the task reward stays flat is visible"),
}


def get_preset(name: str | None) -> Preset | None:
    if name is None:
        return None
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; one of: {', '.join(PRESETS)}") from None


# -- finding the preset from the logged names ---------------------------------------------------

#: A guess needs at least this many logged names the preset renames ...
MIN_MATCHED = 2


@dataclass(frozen=True)
class PresetGuess:
    """What :func:`guess_preset` found: the preset (None when undecided) and the evidence."""

    preset: Preset | None
    matched: tuple[str, ...] = ()       # logged names the preset renames
    distinctive: tuple[str, ...] = ()   # of which no other preset renames
    runner_up: str | None = None
    runner_up_matched: int = 0
    reason: str = ""


def guess_preset(keys, among=None) -> PresetGuess:
    """The framework whose metric names these are, with the evidence.

    Confidence rule: a preset is chosen when (1) it renames at least ``MIN_MATCHED`` of the
    logged names, (2) at least one of those is renamed by no other preset (a *distinctive*
    name, e.g. ``frac_reward_zero_std`` for TRL GRPO, ``rewards/chosen`` for TRL DPO), and (3)
    it renames strictly more logged names than any other preset. Otherwise the result is None
    (names already canonical, too few names, or a tie such as ``kl`` + ``reward``, which TRL
    GRPO and OpenRLHF both log). ``among`` limits the candidates to those preset names (a
    framework's own integration knows the framework).
    """
    names = {str(k) for k in keys}
    renamed = {p.name: {k for k in names if (c := p.rename(k)) is not None and c != k}
               for p in PRESETS.values() if among is None or p.name in among}
    owners: dict[str, int] = {}
    for matched in renamed.values():
        for k in matched:
            owners[k] = owners.get(k, 0) + 1
    ranked = sorted(renamed.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    best, matched = ranked[0]
    runner, runner_matched = (ranked[1][0], len(ranked[1][1])) if len(ranked) > 1 else (None, 0)
    distinctive = tuple(sorted(k for k in matched if owners[k] == 1))
    kw = dict(matched=tuple(sorted(matched)), distinctive=distinctive, runner_up=runner,
              runner_up_matched=runner_matched)
    if len(matched) < MIN_MATCHED:
        return PresetGuess(None, reason=f"no preset renames {MIN_MATCHED} or more of the logged "
                                        f"names (best: {best}, {len(matched)})", **kw)
    if not distinctive:
        return PresetGuess(None, reason=f"{best} renames {', '.join(sorted(matched))}, but other "
                                        "presets rename the same names", **kw)
    if runner_matched >= len(matched):
        return PresetGuess(None, reason=f"{best} and {runner} rename as many of the logged names "
                                        f"({len(matched)})", **kw)
    return PresetGuess(PRESETS[best], reason=f"{best}: renames {len(matched)} logged names "
                                             f"({', '.join(distinctive[:4])}"
                                             f"{', ...' if len(distinctive) > 4 else ''} only it "
                                             f"knows); next best {runner} renames {runner_matched}",
                       **kw)


def detect_preset(keys, among=None) -> Preset | None:
    """The preset whose framework logged these metric names, or None when the names do not
    say so with confidence (see :func:`guess_preset`)."""
    return guess_preset(keys, among).preset

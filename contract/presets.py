"""Presets: the metric names frameworks log, mapped onto rlwatch's canonical names
(contract sections 2 and 6), with the rule adjustments each framework's scales need. Data:
the training-side SDK reads it without the rule language (``rules.loader.with_preset`` turns a
preset's targets, parameters and disabled rules into a pack override).

A name the preset does not know is kept as it is (user rules may use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PRESETS", "Preset", "get_preset"]


@dataclass(frozen=True)
class Preset:
    name: str
    names: dict[str, str]
    strip_prefixes: tuple[str, ...] = ()
    targets: dict[str, float] = field(default_factory=dict)
    params: dict[str, dict[str, float]] = field(default_factory=dict)
    disable: tuple[str, ...] = ()
    note: str = ""

    def map_metrics(self, metrics: dict) -> dict:
        out = {}
        for k, v in metrics.items():
            name = k
            for p in self.strip_prefixes:
                if name.startswith(p) and name[len(p):] in self.names:
                    name = name[len(p):]
                    break
            out[self.names.get(name, k)] = v
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
}


def get_preset(name: str | None) -> Preset | None:
    if name is None:
        return None
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; one of: {', '.join(PRESETS)}") from None

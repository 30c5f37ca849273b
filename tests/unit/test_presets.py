"""contract.presets: framework metric names onto canonical ones (contract sections 2 and 6)."""

from __future__ import annotations

import pytest

from contract.presets import PRESETS, get_preset
from rules.loader import preset_override
from rules.schema import Override


def test_contract_preset_names_exist():
    for name in ("trl-ppo", "trl-grpo", "verl", "openrlhf", "nemo-rl"):
        assert get_preset(name).name == name


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        get_preset("trl-nope")
    for name in PRESETS:
        assert name in str(info.value)
    assert get_preset(None) is None


@pytest.mark.parametrize("preset, logged, canonical", [
    ("trl-grpo", "kl", "kl/mean"),
    ("trl-grpo", "train/kl", "kl/mean"),
    ("trl-grpo", "reward", "reward/mean"),
    ("trl-grpo", "reward_std", "reward/std"),
    ("trl-grpo", "frac_reward_zero_std", "reward/frac_zero_std"),
    ("trl-grpo", "completions/clipped_ratio", "response/truncated_frac"),
    ("trl-grpo", "completions/mean_length", "response/length_mean"),
    ("trl-grpo", "entropy", "entropy/mean"),
    ("trl-grpo", "grad_norm", "grad_norm/actor"),
    ("trl-ppo", "objective/kl", "kl/mean"),
    ("trl-ppo", "env/reward_mean", "reward/mean"),
    ("trl-ppo", "policy/clipfrac_avg", "ppo/clip_frac"),
    ("verl", "actor/entropy", "entropy/mean"),
    ("verl", "actor/grad_norm", "grad_norm/actor"),
    ("verl", "response_length/clip_ratio", "response/truncated_frac"),
    ("openrlhf", "train/kl", "kl/mean"),
    ("openrlhf", "train/reward", "reward/mean"),
    ("nemo-rl", "train/reward", "reward/mean"),
    ("nemo-rl", "train/grad_norm", "grad_norm/actor"),
])
def test_framework_names_map_to_canonical_names(preset, logged, canonical):
    assert get_preset(preset).map_metrics({logged: 0.5}) == {canonical: 0.5}


def test_unknown_names_are_kept_as_they_are():
    p = get_preset("trl-grpo")
    m = p.map_metrics({"rewards/format_fn/mean": 1.0, "train/unknown": 2.0, "kl/mean": 3.0})
    assert m == {"rewards/format_fn/mean": 1.0, "train/unknown": 2.0, "kl/mean": 3.0}


def test_values_pass_through_untouched():
    v = object()
    assert get_preset("verl").map_metrics({"actor/entropy": v})["entropy/mean"] is v


def test_override_carries_the_preset_scales():
    ov = preset_override(get_preset("trl-grpo"))
    assert isinstance(ov, Override) and ov.runs == "*"
    assert ov.targets["kl"] == 0.1 and ov.params["kl_above_target"]["cap"] == 0.5
    ppo = preset_override(get_preset("trl-ppo"))
    assert ppo.targets["kl"] > 1.0   # TRL PPO's objective/kl is summed over the sequence

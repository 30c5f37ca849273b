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


# -- TRL DPO and Tinker --------------------------------------------------------------------------

@pytest.mark.parametrize("preset, logged, canonical", [
    ("trl-dpo", "rewards/chosen", "dpo/chosen_reward"),
    ("trl-dpo", "rewards/rejected", "dpo/rejected_reward"),
    ("trl-dpo", "rewards/margins", "dpo/margin"),
    ("trl-dpo", "rewards/accuracies", "dpo/accuracy"),
    ("trl-dpo", "logps/chosen", "dpo/chosen_logp"),
    ("trl-dpo", "logps/rejected", "dpo/rejected_logp"),
    ("trl-dpo", "logits/chosen", "dpo/chosen_logits"),
    ("trl-dpo", "logits/rejected", "dpo/rejected_logits"),
    ("trl-dpo", "loss", "loss/policy"),
    ("trl-dpo", "grad_norm", "grad_norm/actor"),
    ("trl-dpo", "learning_rate", "lr/actor"),
    ("trl-dpo", "train/rewards/chosen", "dpo/chosen_reward"),
    ("trl-dpo", "reward_margin", "dpo/margin"),          # a callback's copy of the margin
    ("tinker", "reward/g", "reward/mean"),                 # the optimised (proxy) reward
    ("tinker", "reward/f", "judge/score"),                 # the task's own reward beside it
    ("tinker", "policy/entropy", "entropy/mean"),
    ("tinker", "optim/lr", "lr/actor"),
])
def test_dpo_and_tinker_names_map_to_canonical_names(preset, logged, canonical):
    assert get_preset(preset).map_metrics({logged: 0.5}) == {canonical: 0.5}


def test_a_logged_canonical_name_wins_over_an_alias_of_it_in_any_order():
    tinker = get_preset("tinker")
    assert tinker.map_metrics({"reward/mean": 1.0, "reward/g": 2.0}) == {"reward/mean": 1.0}
    assert tinker.map_metrics({"reward/g": 2.0, "reward/mean": 1.0}) == {"reward/mean": 1.0}
    assert tinker.map_metrics({"reward/g": 2.0, "reward/f": 0.0}) == {"reward/mean": 2.0,
                                                                      "judge/score": 0.0}


# -- the preset found from the logged names ---------------------------------------------------

GRPO_KEYS = ["reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "grad_norm", "loss",
             "completions/clipped_ratio", "completions/mean_length", "learning_rate",
             "rewards/format/mean", "epoch"]
PPO_KEYS = ["objective/kl", "objective/scores", "policy/entropy_avg", "policy/clipfrac_avg",
            "loss/value_avg", "val/num_eos_tokens", "lr", "episode"]
DPO_KEYS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
            "logps/chosen", "logps/rejected", "loss", "grad_norm", "learning_rate", "epoch"]
TINKER_KEYS = ["reward/mean", "reward/f", "reward/g", "policy/entropy", "optim/lr", "progress/step"]


@pytest.mark.parametrize("keys, name", [
    (GRPO_KEYS, "trl-grpo"),
    (["train/" + k for k in GRPO_KEYS], "trl-grpo"),
    (["reward", "reward_std", "kl", "completion_length", "loss"], "trl-grpo"),   # older TRL / Unsloth
    (PPO_KEYS, "trl-ppo"),
    (["env/reward_mean", "env/reward_std", "ppo/policy/entropy"], "trl-ppo"),     # TRL < 0.12
    (DPO_KEYS, "trl-dpo"),
    (["rewards/chosen", "rewards/rejected", "rewards/accuracies", "reward_margin", "loss"], "trl-dpo"),
    (TINKER_KEYS, "tinker"),
    (["actor/entropy", "actor/pg_loss", "critic/score/mean", "response_length/mean"], "verl"),
    (["train/kl", "train/reward", "train/policy_loss", "train/critic_loss"], "openrlhf"),
    (["train/loss", "train/reward", "train/gen_kl_error", "train/critic/loss"], "nemo-rl"),
])
def test_the_framework_is_found_from_its_metric_names(keys, name):
    from contract.presets import detect_preset

    assert detect_preset(keys).name == name


@pytest.mark.parametrize("keys", [
    [],
    ["kl/mean", "reward/mean", "entropy/mean"],       # canonical names need no preset
    ["kl", "reward"],                                 # TRL GRPO and OpenRLHF both log these
    ["loss"],                                         # one name says nothing
    ["my/custom_metric", "another"],
])
def test_no_preset_is_guessed_without_evidence(keys):
    from contract.presets import detect_preset, guess_preset

    assert detect_preset(keys) is None
    assert guess_preset(keys).reason      # and it says why


def test_the_guess_names_its_evidence():
    from contract.presets import guess_preset

    g = guess_preset(GRPO_KEYS)
    assert g.preset.name == "trl-grpo"
    assert "frac_reward_zero_std" in g.distinctive and "kl" in g.matched and "kl" not in g.distinctive
    assert g.runner_up is not None and g.runner_up_matched < len(g.matched)

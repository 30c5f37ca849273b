"""Replay finds the framework from the metric names and says what the rules could see: "0 alerts"
must never mean "nothing was watched"."""

from __future__ import annotations

import json
from pathlib import Path

from contract.presets import get_preset
from rlwatch.replay import coverage_lines, replay
from rules.loader import load_pack, with_preset

PACK = load_pack("rlhf")


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def grpo_records(n=60, onset=30):
    """TRL GRPO names, truncation going to 100 % from ``onset``."""
    return [{"step": s, "metrics": {"reward": 0.5, "reward_std": 0.3, "frac_reward_zero_std": 0.1,
                                    "kl": 0.02, "completions/clipped_ratio": 0.02 if s < onset else 1.0,
                                    "completions/mean_length": 200.0 if s < onset else 512.0}}
            for s in range(1, n + 1)]


def test_without_a_preset_the_framework_is_found_and_the_fault_caught(tmp_path):
    f = write_jsonl(tmp_path / "grpo-run.jsonl", grpo_records())
    found = replay([f], PACK)
    given = replay([f], with_preset(PACK, get_preset("trl-grpo")), get_preset("trl-grpo"))
    key = lambda r: [(a.rule, a.severity, a.step) for a in r.alerts]
    assert key(found) == key(given) and any(a.rule == "truncation_rising" for a in found.alerts)
    cov = found.runs["grpo-run"]
    assert cov.preset == "trl-grpo" and cov.detected and "frac_reward_zero_std" in cov.evidence
    assert "truncation_rising" in cov.watched and "kl_above_target" in cov.watched
    assert "value_loss_divergence" in cov.unwatched      # no loss/value in a GRPO log
    assert not cov.blind


def test_detection_can_be_turned_off_and_then_nothing_is_watched_loudly(tmp_path):
    f = write_jsonl(tmp_path / "grpo-run.jsonl", grpo_records())
    result = replay([f], PACK, detect=False)
    assert result.alerts == []
    cov = result.runs["grpo-run"]
    assert cov.preset is None and cov.watched == [] and cov.blind
    text = "\n".join(coverage_lines(result))
    assert "WARNING" in text and "NO RULE HAD ITS INPUTS" in text and "--preset" in text
    assert "completions/clipped_ratio" in text          # the names it did see


def test_a_metric_named_like_a_distribution_is_not_mistaken_for_it(tmp_path):
    # TRL GRPO logs a metric "reward"; the per-sample distribution "reward" is something else
    f = write_jsonl(tmp_path / "r.jsonl", [{"step": s, "metrics": {"reward": 1.0}} for s in range(5)])
    cov = replay([f], PACK, detect=False).runs["r"]
    assert "reward_shape" not in cov.watched and "reward_length_corr" not in cov.watched


def test_canonical_names_need_no_preset_and_say_what_was_watched(tmp_path):
    recs = [{"step": s, "metrics": {"kl/mean": 0.02, "reward/mean": 1.0}} for s in range(10)]
    result = replay([write_jsonl(tmp_path / "c.jsonl", recs)], PACK)
    cov = result.runs["c"]
    assert cov.preset is None and not cov.detected
    assert {"kl_above_target", "reward_spike"} <= set(cov.watched)
    # nan_inf reads every metric; here it also watches reward/mean by name (its black tier)
    assert "nan_inf" in cov.any_metric + cov.watched
    lines = coverage_lines(result)
    assert any(f"{len(cov.watched)} of " in line for line in lines)
    assert not any("WARNING" in line for line in lines)


def test_rules_a_preset_disables_are_not_counted(tmp_path):
    grpo = get_preset("trl-grpo")
    f = write_jsonl(tmp_path / "g.jsonl", grpo_records(10))
    cov = replay([f], with_preset(PACK, grpo), grpo).runs["g"]
    assert "clip_frac_low" in grpo.disable
    assert "clip_frac_low" not in cov.watched + cov.unwatched + cov.any_metric


def test_only_a_catch_all_rule_is_not_watching(tmp_path):
    # nan_inf reads every metric, so it is never "nothing": but alone it does not count
    f = write_jsonl(tmp_path / "x.jsonl", [{"step": s, "metrics": {"my/thing": 1.0}} for s in range(5)])
    cov = replay([f], PACK).runs["x"]
    assert cov.any_metric == ["nan_inf"] and cov.blind
    assert cov.first_step == 0 and cov.last_step == 4 and cov.steps_logged == 5


def test_cli_replay_says_what_was_watched_and_warns_when_nothing_was(tmp_path, capsys):
    from rlwatch.cli import main

    f = write_jsonl(tmp_path / "grpo-run.jsonl", grpo_records())
    assert main(["replay", str(f)]) == 0
    err = capsys.readouterr().err
    assert "preset trl-grpo (found from the metric names" in err and "rules had their inputs" in err
    assert "WARNING" not in err
    g = write_jsonl(tmp_path / "mystery.jsonl", [{"step": s, "metrics": {"my/thing": 1.0}} for s in range(5)])
    assert main(["replay", str(g)]) == 0
    err = capsys.readouterr().err
    assert "WARNING: run mystery: NO RULE HAD ITS INPUTS" in err and "0 alerts fired" in err


def test_coverage_falls_back_to_the_processors_view_when_the_rule_shape_is_unknown(tmp_path, monkeypatch):
    import rlwatch.replay as rp

    f = write_jsonl(tmp_path / "grpo-run.jsonl", grpo_records(10))
    exact = rp.replay([f], PACK).runs["grpo-run"]
    monkeypatch.setattr(rp, "_rule_reads", lambda rule: None)
    rough = rp.replay([f], PACK).runs["grpo-run"]
    assert rough.known and "truncation_rising" in rough.watched
    assert "nan_inf" in rough.any_metric + rough.watched
    # the merged view may only say more (nan_inf reads every metric there)
    assert set(exact.watched) - {"nan_inf"} <= set(rough.watched)
    g = write_jsonl(tmp_path / "x.jsonl", [{"step": s, "metrics": {"my/thing": 1.0}} for s in range(5)])
    assert rp.replay([g], PACK).runs["x"].blind

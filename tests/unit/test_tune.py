"""`rlwatch rules tune DIR` and `rlwatch backtest DIR` on a small synthetic directory: a team whose
healthy GRPO runs keep KL near 0.02 learns a tighter KL target, writes it as an overrides file
the pack language accepts, and its slowly drifting run is caught earlier than with the defaults."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlwatch.backtest import Label, load_labels
from rlwatch.cli import main
from rlwatch.tune import MAX_FACTOR, compare, learn_profile, overrides_yaml, tune, tuned_packs
from rules.loader import load_pack, load_pack_text, merge_packs

PACK = load_pack("rlhf")


def grpo_run(n: int, seed: int, kl=lambda s: 0.02, every: int = 1):
    out = []
    for s in range(every, n + 1, every):
        wobble = 0.002 * math.sin(0.7 * s + seed)
        out.append({"step": s, "metrics": {
            "kl": kl(s) + wobble, "reward": 0.3 + 0.001 * s + 0.02 * math.sin(1.3 * s + seed),
            "reward_std": 0.3, "frac_reward_zero_std": 0.1, "entropy": 0.5 - 0.0002 * s,
            "completions/clipped_ratio": 0.02, "completions/mean_length": 200.0,
            "grad_norm": 0.2 + 0.02 * math.sin(s + seed)}})
    return out


@pytest.fixture()
def team_dir(tmp_path: Path) -> Path:
    runs = {"h1.jsonl": grpo_run(150, 1, every=2), "h2.jsonl": grpo_run(150, 2, every=2),
            "h3.jsonl": grpo_run(150, 3, every=2),
            # KL drifting up slowly from step 60: 0.02 -> 0.36 at step 200
            "drift.jsonl": grpo_run(200, 4, kl=lambda s: 0.02 if s < 60 else 0.02 + 0.0024 * (s - 60), every=2)}
    for name, recs in runs.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    labels = {n: {"label": "healthy", "onset": None, "preset": "trl-grpo"} for n in ("h1.jsonl", "h2.jsonl", "h3.jsonl")}
    labels["drift.jsonl"] = {"label": "kl_above_target", "onset": 60, "preset": "trl-grpo", "max_delay": 140}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    return tmp_path


def test_profile_of_healthy_runs(team_dir):
    from rlwatch.tune import healthy_runs

    runs = healthy_runs(team_dir, load_labels(team_dir))
    assert set(runs) == {"trl-grpo"} and set(runs["trl-grpo"]) == {"h1.jsonl", "h2.jsonl", "h3.jsonl"}
    prof = learn_profile(runs["trl-grpo"], "trl-grpo")
    kl = prof.metrics["kl/mean"]               # the preset's canonical name
    assert kl.runs == 3 and kl.points == 225
    assert 0.018 < kl.low < kl.level < kl.high < 0.023
    assert 0 < kl.noise < 0.005 and kl.peak3 <= kl.top
    assert prof.interval == 2


def test_tuning_sets_the_targets_and_parameters_the_pack_declares(team_dir):
    res = tuned_packs(team_dir, PACK, load_labels(team_dir))["trl-grpo"]
    assert res.targets["kl"] == pytest.approx(0.1 / MAX_FACTOR, rel=0.01)      # 0.022 learnt, held within 3x
    assert any(c["what"] == "targets.kl" and c["clipped"] for c in res.changes)
    assert res.params["kl_above_target"]["cap"] < 0.5                          # the preset's 0.5, scaled
    # a test statistic only loosens: these smooth healthy runs do not make reward_spike touchier
    assert "z" not in res.params.get("reward_spike", {})
    assert any(k.startswith("reward_spike.z") for k in res.kept)


def test_what_the_pack_has_no_parameter_for_is_reported_not_written(team_dir):
    mine = load_pack_text("""
pack: mine
targets: {kl: 0.1}
rules:
  - id: kl_above_target
    params: {yellow: 1.5}
    tiers:
      - severity: yellow
        when: {metric: kl/mean, above: {target: kl, factor: yellow}}
        actions: [notify]
""")
    res = tuned_packs(team_dir, mine, load_labels(team_dir))["trl-grpo"]
    assert "kl" in res.targets and not res.params
    assert "kl_above_target.cap" in {u["what"] for u in res.unused}
    assert "kl_above_target.cap" in overrides_yaml(res).split("pack:")[0]     # as a comment


def test_overrides_file_is_a_valid_pack_that_moves_the_thresholds(team_dir):
    res = tuned_packs(team_dir, PACK, load_labels(team_dir))["trl-grpo"]
    text = overrides_yaml(res)
    tuned = load_pack_text(text, "tuned.yaml")
    assert not tuned.rules and tuned.overrides[0].targets == res.targets
    merged = merge_packs(PACK, tuned)
    assert merged.overrides[-1].params["kl_above_target"]["cap"] == res.params["kl_above_target"]["cap"]


def test_tuned_pack_catches_the_drift_earlier_and_keeps_healthy_runs_quiet(team_dir):
    labels = load_labels(team_dir)
    comp = {c.run: c for c in compare(team_dir, PACK, tuned_packs(team_dir, PACK, labels), labels)}
    drift = comp["drift.jsonl"]
    assert drift.tuned.caught is not None
    assert drift.default.caught is None or drift.tuned.caught.step < drift.default.caught.step
    assert "earlier" in drift.change or drift.change.startswith("newly caught")
    for h in ("h1.jsonl", "h2.jsonl", "h3.jsonl"):
        assert comp[h].tuned.passed and comp[h].change == "same"


def test_nothing_is_learnt_from_a_single_run(team_dir):
    from rlwatch.tune import healthy_runs

    one = {"h1.jsonl": healthy_runs(team_dir, load_labels(team_dir))["trl-grpo"]["h1.jsonl"]}
    res = tune(learn_profile(one, "trl-grpo"), PACK)
    assert not res.targets and not res.params and res.skipped


def test_cli_rules_tune_writes_the_file_and_reports(team_dir, tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    assert main(["rules", "tune", str(team_dir), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "targets.kl" in text and "drift.jsonl" in text and ("earlier" in text or "newly caught" in text)
    assert load_pack_text(out.read_text()).overrides
    assert main(["rules", "check", str(out)]) == 0


def test_cli_rules_tune_without_labels_takes_every_run_as_healthy(team_dir, tmp_path, capsys):
    d = tmp_path / "plain"
    d.mkdir()
    for n in ("h1.jsonl", "h2.jsonl"):
        (d / n).write_text((team_dir / n).read_text())
    assert main(["rules", "tune", str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tuning"]["preset"] == "trl-grpo" and doc["tuning"]["targets"]["kl"] > 0


def test_cli_backtest_table_score_and_json(team_dir, capsys):
    assert main(["backtest", str(team_dir)]) == 0
    out = capsys.readouterr().out
    assert "score: " in out and "healthy quiet 3/3" in out and "drift.jsonl" in out
    assert main(["backtest", str(team_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["score"]["healthy"] == 3 and len(doc["runs"]) == 4
    assert {r["run"] for r in doc["runs"]} == {"h1.jsonl", "h2.jsonl", "h3.jsonl", "drift.jsonl"}


def test_cli_backtest_exits_1_when_a_file_fails(team_dir, capsys):
    labels = json.loads((team_dir / "labels.json").read_text())
    labels["h1.jsonl"] = {"label": "kl_above_target", "onset": 10, "preset": "trl-grpo"}   # a healthy run: missed
    (team_dir / "labels.json").write_text(json.dumps(labels))
    assert main(["backtest", str(team_dir)]) == 1
    assert "FAIL h1.jsonl" in capsys.readouterr().out
    assert main(["backtest", str(team_dir), "--json"]) == 1


def test_cli_backtest_per_source_with_tuning(team_dir, tmp_path, capsys):
    src = tmp_path / "sources.json"
    src.write_text(json.dumps({"h1.jsonl": "a", "h2.jsonl": "b", "h3.jsonl": "b", "drift.jsonl": "a"}))
    assert main(["backtest", str(team_dir), "--sources", str(src), "--tune", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["by_source"]) == {"a", "b"}
    rows = {r["source"]: r for r in doc["leave_one_source_out"]}
    # source a's drift run, scored with parameters learnt on source b's two healthy runs only
    assert rows["a"]["files"] == 2 and "targets.kl" in rows["a"]["note"]


def test_cli_backtest_scores_the_runs_re_logged_beside_their_own(team_dir, capsys):
    """--variant steps=2: the drift run over twice the steps still caught within its doubled
    window; every=3 keeps a third of the points. The exit status is the files' own."""
    assert main(["backtest", str(team_dir), "--variant", "steps=2", "--variant", "every=3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["variants"]) == {"steps=2", "every=3"}
    runs = {r["run"]: r for r in doc["variants"]["steps=2"]["runs"]}
    assert runs["drift.jsonl"]["onset"] == 120 and runs["drift.jsonl"]["caught"] is not None
    assert runs["h1.jsonl"]["interval"] == 4
    assert {r["run"]: r["interval"] for r in doc["variants"]["every=3"]["runs"]}["h2.jsonl"] == 6
    assert main(["backtest", str(team_dir), "--variant", "steps=2"]) == 0
    assert "re-logged steps=2: " in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["backtest", str(team_dir), "--variant", "stride=2"])
    assert "stride=2" in str(info.value.code) and "every" in str(info.value.code)


def test_cli_backtest_errors_are_one_line(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["backtest", str(tmp_path)])
    assert "labels.json" in str(info.value.code)
    (tmp_path / "labels.json").write_text(json.dumps({"gone.jsonl": {"label": "healthy"}}))
    with pytest.raises(SystemExit) as info:
        main(["backtest", str(tmp_path)])
    assert "gone.jsonl" in str(info.value.code)


def test_label_dataclass_defaults():
    lab = Label("x", "healthy")
    assert lab.onset is None and lab.source is None and not lab.onset_exact

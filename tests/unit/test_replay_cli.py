"""`rlwatch replay` (contract section 5): JSON lines out, envelope-less input, bad lines,
presets, and a real TRL GRPO log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlwatch.cli import main
from tests.support.paths import REAL_LOGS

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ("rule", "severity", "state", "run_id", "step")


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def kl_blowup_events(run_id="ppo-8b-a", n=60, onset=30):
    out = []
    for s in range(n):
        out.append({"schema": 1, "kind": "step", "run_id": run_id, "step": s,
                    "ts": 1764500000.0 + s,
                    "metrics": {"kl/mean": 0.02 if s < onset else 0.3, "reward/mean": 1.0}})
        if s == 20:
            out.append({"schema": 1, "kind": "checkpoint", "run_id": run_id, "step": s,
                        "path": f"/ckpt/{s}"})
    return out


def replay_json(capsys, *argv):
    code = main(["replay", *map(str, argv), "--json"])
    cap = capsys.readouterr()
    alerts = [json.loads(line) for line in cap.out.splitlines() if line.strip()]
    return code, alerts, cap.err


def test_replay_json_prints_one_contract_alert_per_line(tmp_path, capsys):
    f = write_jsonl(tmp_path / "events.jsonl", kl_blowup_events())
    code, alerts, err = replay_json(capsys, f)
    assert code == 0
    assert alerts, "a KL blow-up to 6x the target must raise alerts"
    for a in alerts:
        for key in REQUIRED:
            assert key in a, f"{key} missing from {a}"
        assert a["severity"] in ("info", "yellow", "orange", "red", "black")
        assert a["state"] in ("firing", "resolved")
        assert a["run_id"] == "ppo-8b-a" and isinstance(a["step"], int)
    kl = {(a["severity"], a["state"]) for a in alerts if a["rule"] == "kl_above_target"}
    assert {("red", "firing"), ("black", "firing"), ("yellow", "firing")} <= kl
    black = next(a for a in alerts if a["rule"] == "kl_above_target" and a["severity"] == "black")
    assert black["rollback_to"] == {"step": 20, "checkpoint": "/ckpt/20"}
    assert "replayed" in err


def test_replay_text_output_is_readable(tmp_path, capsys):
    f = write_jsonl(tmp_path / "events.jsonl", kl_blowup_events())
    assert main(["replay", str(f)]) == 0
    out = capsys.readouterr().out
    assert "[RED] ppo-8b-a" in out and "kl_above_target" in out


def test_replay_envelope_less_lines_use_the_file_name_as_run_id(tmp_path, capsys):
    recs = [{"step": s, "metrics": {"kl/mean": 0.02 if s < 30 else 0.3}} for s in range(40)]
    f = write_jsonl(tmp_path / "my-grpo-run.jsonl", recs)
    code, alerts, _ = replay_json(capsys, f)
    assert code == 0 and alerts
    assert {a["run_id"] for a in alerts} == {"my-grpo-run"}
    assert any(a["rule"] == "kl_above_target" and a["severity"] == "black" for a in alerts)


def test_replay_flat_logged_dicts_are_metrics(tmp_path, capsys):
    recs = [{"step": s, "kl/mean": 0.02 if s < 30 else 0.3, "epoch": 0.1 * s} for s in range(40)]
    f = write_jsonl(tmp_path / "flat.jsonl", recs)
    _, alerts, _ = replay_json(capsys, f)
    assert any(a["rule"] == "kl_above_target" and a["run_id"] == "flat" for a in alerts)


def test_bad_line_is_reported_with_its_line_number_and_the_rest_replays(tmp_path, capsys):
    recs = [{"step": s, "metrics": {"kl/mean": 0.02 if s < 30 else 0.3}} for s in range(40)]
    recs.insert(10, "{this is not json")                                   # line 11
    recs.insert(20, json.dumps({"step": -3, "metrics": {"kl/mean": 0.1}}))  # line 21
    recs.insert(25, json.dumps({"step": 24, "metrics": {"kl/mean": True}}))  # line 26
    f = write_jsonl(tmp_path / "broken.jsonl", recs)
    code, alerts, err = replay_json(capsys, f)
    assert code == 0
    assert f"{f}:11:" in err and "bad JSON" in err
    assert f"{f}:21:" in err and "step" in err
    assert f"{f}:26:" in err
    assert "3 lines skipped" in err
    # the blow-up after the bad lines is still found
    assert any(a["rule"] == "kl_above_target" and a["severity"] == "black" and a["step"] >= 30
               for a in alerts)


def test_replay_several_runs_in_one_file_keeps_them_apart(tmp_path, capsys):
    hot = kl_blowup_events("hot", n=40)
    cold = [dict(e, run_id="cold", metrics={"kl/mean": 0.02}) for e in hot if e["kind"] == "step"]
    mixed = [e for pair in zip(hot, cold) for e in pair]
    f = write_jsonl(tmp_path / "mixed.jsonl", mixed)
    _, alerts, _ = replay_json(capsys, f)
    assert alerts and {a["run_id"] for a in alerts} == {"hot"}


def test_replay_with_a_user_rule_file(tmp_path, capsys):
    rules = tmp_path / "mine.yaml"
    rules.write_text("pack: mine\nrules:\n  - id: reward_low\n    tiers:\n"
                     "      - severity: orange\n        when: {metric: reward/mean, below: 0.5}\n"
                     "        for: 3\n")
    recs = [{"step": s, "metrics": {"reward/mean": 1.0 if s < 10 else 0.1}} for s in range(20)]
    f = write_jsonl(tmp_path / "r.jsonl", recs)
    code, alerts, _ = replay_json(capsys, f, "--rules", rules)
    assert code == 0
    assert [(a["rule"], a["severity"], a["step"]) for a in alerts] == [("reward_low", "orange", 12)]


def test_replay_missing_file_or_unknown_preset_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["replay", str(tmp_path / "nope.jsonl")])
    assert "no such file" in str(info.value.code)
    f = write_jsonl(tmp_path / "x.jsonl", [{"step": 0, "metrics": {}}])
    with pytest.raises(SystemExit) as info:
        main(["replay", str(f), "--preset", "trl-nonsense"])
    assert "trl-grpo" in str(info.value.code)


# -- presets ----------------------------------------------------------------------------------

def test_trl_grpo_preset_maps_kl_to_kl_mean(tmp_path, capsys):
    recs = [{"step": s, "metrics": {"kl": 0.02 if s < 20 else 0.9}} for s in range(30)]
    f = write_jsonl(tmp_path / "grpo.jsonl", recs)
    _, without, _ = replay_json(capsys, f)
    assert not [a for a in without if a["rule"] == "kl_above_target"]
    _, with_preset, _ = replay_json(capsys, f, "--preset", "trl-grpo")
    kl = [a for a in with_preset if a["rule"] == "kl_above_target" and a["state"] == "firing"]
    assert kl and {a["metric"] for a in kl} == {"kl/mean"}
    # the preset's GRPO scale: cap 0.5 (0.9 is above it)
    black = [a for a in kl if a["severity"] == "black"]
    assert black and black[0]["threshold"] == pytest.approx(0.5)


def test_trl_grpo_preset_strips_the_train_prefix(tmp_path, capsys):
    recs = [{"step": s, "metrics": {"train/kl": 0.02 if s < 20 else 0.9}} for s in range(30)]
    f = write_jsonl(tmp_path / "grpo.jsonl", recs)
    _, alerts, _ = replay_json(capsys, f, "--preset", "trl-grpo")
    assert any(a["rule"] == "kl_above_target" and a["severity"] == "black" for a in alerts)


def test_real_grpo_log_with_truncation_is_caught(capsys):
    f = REAL_LOGS / "trl_grpo_chaos_economy_250.jsonl"
    code, alerts, err = replay_json(capsys, f, "--preset", "trl-grpo")
    assert code == 0 and "0 lines skipped" in err
    trunc = [a for a in alerts if a["rule"] == "truncation_rising" and a["state"] == "firing"]
    assert trunc, "clipped_ratio 0.6 -> 1.0 must raise truncation_rising"
    assert any(a["severity"] in ("orange", "red", "black") for a in trunc)
    assert {a["run_id"] for a in alerts} == {"trl_grpo_chaos_economy_250"}
    assert {a["metric"] for a in trunc} <= {"response/truncated_frac", "response/eos_frac",
                                            "response/eos_count"}


# -- the real entry point ------------------------------------------------------------------------

def test_python_dash_m_rlwatch_replay_end_to_end(tmp_path):
    f = write_jsonl(tmp_path / "events.jsonl", kl_blowup_events() + ["not json"])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "rlwatch", "replay", str(f), "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines and all(all(k in a for k in REQUIRED) for a in lines)
    assert f"{f}:62:" in proc.stderr

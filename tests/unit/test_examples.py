"""The example rule files shipped in examples/rules work as their comments say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rlwatch(*args):
    return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_example_rule_tests_pass():
    out = rlwatch("rules", "test", "examples/rules/tests.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed, 0 failed" in out.stdout


def test_overrides_apply_to_the_builtin_pack(tmp_path):
    run = tmp_path / "ppo-70b-a.jsonl"
    # KL 0.05 is under the default yellow line (1.5 x 0.05) but over 1.5 x the 0.03 of ppo-70b-*
    run.write_text("\n".join(f'{{"step": {s}, "metrics": {{"kl/mean": 0.05}}}}' for s in range(10)))
    plain = rlwatch("replay", str(run), "--json")
    assert "kl_above_target" not in plain.stdout
    strict = rlwatch("replay", str(run), "--json", "--rules", "rlhf,examples/rules/overrides.yaml")
    assert '"rule":"kl_above_target"' in strict.stdout and '"severity":"yellow"' in strict.stdout


def test_a_failing_rule_test_exits_non_zero(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("rules: rlhf\ntests:\n  - name: wrong\n    series: {kl/mean: '0.01x10'}\n"
                 "    expect: [{rule: kl_above_target, severity: red}]\n")
    out = rlwatch("rules", "test", str(f))
    assert out.returncode == 1 and "FAIL" in out.stdout and "0 passed, 1 failed" in out.stdout

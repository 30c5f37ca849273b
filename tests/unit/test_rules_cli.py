"""`rlwatch rules check | test | list` (contract section 5)."""

from __future__ import annotations

import textwrap

from rlwatch.cli import main
from tests.unit.test_rule_schema import catalog_ids

GOOD = """\
pack: mine
targets: {kl: 0.05}
rules:
  - id: my_kl
    tiers:
      - severity: red
        when:
          metric: kl/mean
          above: {target: kl, factor: 3}
"""

BAD_SIGNAL_LINE_7 = """\
pack: mine
rules:
  - id: my_kl
    tiers:
      - severity: red
        when:
          signal: fancy
          metric: kl/mean
          above: 0.1
"""


def test_rules_check_good_file_exits_0(tmp_path, capsys):
    f = tmp_path / "good.yaml"
    f.write_text(GOOD)
    assert main(["rules", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert f"{f}: OK, 1 rules" in out


def test_rules_check_bad_file_exits_1_with_file_and_line(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD_SIGNAL_LINE_7)
    assert main(["rules", "check", str(f)]) == 1
    cap = capsys.readouterr()
    assert f"{f}:7:" in cap.err
    assert "fancy" in cap.err
    assert "OK" not in cap.out


def test_rules_check_several_files_reports_each_and_fails_if_any_fails(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text("pack: x\nrules:\n  - id: a\n    tiers:\n      - severity: red\n"
                   "        when: {metric: m, above: 1}\n        actions: [pause, explode]\n")
    assert main(["rules", "check", str(bad), str(good)]) == 1
    cap = capsys.readouterr()
    assert f"{bad}:7:" in cap.err and "explode" in cap.err
    assert f"{good}: OK" in cap.out


def test_rules_check_missing_file_exits_1(tmp_path, capsys):
    assert main(["rules", "check", str(tmp_path / "none.yaml")]) == 1
    assert "no such rule file" in capsys.readouterr().err


def test_rules_check_names_targets_without_defaults(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text(GOOD.replace("targets: {kl: 0.05}\n", ""))
    assert main(["rules", "check", str(f)]) == 0
    assert "kl" in capsys.readouterr().out.split("targets without a default")[1]


def test_rules_list_lists_the_42_builtin_rules(capsys):
    assert main(["rules", "list"]) == 0
    cap = capsys.readouterr()
    lines = [line for line in cap.out.splitlines() if line.strip()]
    assert len(lines) == 42
    assert sorted(line.split()[0] for line in lines) == sorted(catalog_ids())
    kl = next(line for line in lines if line.startswith("kl_above_target"))
    assert "info/yellow/red/black" in kl
    assert "42 rules" in cap.err


def test_rules_test_passing_and_failing_cases(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: blow-up is red
            series:
              kl/mean: "0.02x9 0.3x3"
            expect:
              - {rule: kl_above_target, severity: red, step: 13}
          - name: expects black on a calm run
            series:
              kl/mean: "0.02x9"
            expect:
              - {rule: kl_above_target, severity: black}
        """))
    assert main(["rules", "test", str(f)]) == 1
    out = capsys.readouterr().out
    assert f"PASS {f}: blow-up is red" in out
    assert f"FAIL {f}: expects black on a calm run" in out
    assert "expected kl_above_target/black" in out
    assert "1 passed, 1 failed" in out


def test_rules_test_all_passing_exits_0(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text("rules: rlhf\ntests:\n  - name: calm\n    series:\n"
                 "      kl/mean: \"0.02x30\"\n    absent: [kl_above_target, kl_rising]\n")
    assert main(["rules", "test", str(f)]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_rules_test_unreadable_file_exits_1(tmp_path, capsys):
    f = tmp_path / "t.yaml"
    f.write_text("just: a mapping\n")
    assert main(["rules", "test", str(f)]) == 1
    assert str(f) in capsys.readouterr().err

"""The strict rule language: mistakes that once loaded "OK" and never fired are errors (or, for
metric names, warnings) with file:line; every threshold of the built-in pack is a parameter a
run can override; the pack is one readable source file whose diagnoses load with it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from rlwatch.cli import main
from rules.loader import RuleFileError, load_pack, load_pack_text, merge_packs, pack_warnings
from rules.schema import Threshold, leaves
from streams.processor import Pipeline
from tests.unit._core import T0, feed_series, firing, parse_event, rlhf_pack

PACKS = Path(__file__).resolve().parents[2] / "rules" / "packs"


def error_of(text: str, source: str = "mine.yaml") -> str:
    with pytest.raises(RuleFileError) as info:
        load_pack_text(textwrap.dedent(text).lstrip("\n"), source)
    return str(info.value)


def lines_of(message: str, source: str = "mine.yaml") -> list[int]:
    return [int(n) for n in re.findall(re.escape(source) + r":(\d+):", message)]


# -- errors with file:line ----------------------------------------------------------------------

def test_an_undefined_parameter_is_an_error_at_its_line():
    msg = error_of("""
        rules:
          - id: my_kl
            params: {kl_cap: 0.3}
            tiers:
              - severity: red
                when: {metric: kl/mean, above: {param: kl_cpa}}
        """)
    assert lines_of(msg) == [6], msg
    assert "'kl_cpa' is not a parameter of rule 'my_kl'" in msg and "kl_cap" in msg


def test_a_misspelt_parameter_name_as_a_threshold_is_an_error():
    msg = error_of("""
        rules:
          - id: my_kl
            params: {cap: 0.3}
            tiers:
              - severity: red
                when:
                  all:
                    - {metric: kl/mean, above: 0.1}
                    - {metric: kl/mean, signal: median, window: 3, above: cpa}
        """)
    assert lines_of(msg) == [9], msg
    assert "'cpa'" in msg


def test_a_factor_naming_no_parameter_is_an_error():
    msg = error_of("""
        targets: {kl: 0.05}
        rules:
          - id: my_kl
            params: {red: 2.5}
            tiers:
              - severity: red
                when: {metric: kl/mean, above: {target: kl, factor: redd}}
        """)
    assert lines_of(msg) == [7] and "'redd'" in msg


def test_a_number_without_a_dot_in_exponent_form_is_caught():
    # YAML reads 1e-6 as text: it then names no parameter instead of silently never firing
    msg = error_of("""
        rules:
          - id: tiny
            tiers:
              - severity: red
                when: {metric: kl/mean, below: 1e-6}
        """)
    assert lines_of(msg) == [5] and "'1e-6' is not a parameter" in msg


def test_disable_of_an_unknown_rule_is_an_error_at_its_line():
    msg = error_of("""
        rules:
          - id: a
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
        overrides:
          - runs: "x*"
            disable: [a, no_such_rule]
        """)
    assert lines_of(msg) == [8] and "no rule 'no_such_rule'" in msg


def test_override_params_of_an_unknown_rule_or_parameter_are_errors():
    msg = error_of("""
        rules:
          - id: a
            params: {cap: 0.2}
            tiers:
              - severity: red
                when: {metric: kl/mean, above: cap}
        overrides:
          - runs: "*"
            params:
              a: {cpa: 0.5}
              b: {cap: 0.5}
        """)
    assert "'cpa' is not a parameter of rule 'a'" in msg and "no rule 'b'" in msg
    assert set(lines_of(msg)) == {10, 11}, msg


def test_overrides_may_name_the_builtin_rules_and_their_parameters():
    pack = load_pack_text("overrides:\n  - runs: '*'\n    params: {kl_above_target: {cap: 0.5}}\n"
                          "    disable: [stagnation]\n", "ov.yaml")
    merged = merge_packs(rlhf_pack(), pack)
    assert merged.overrides[-1].params == {"kl_above_target": {"cap": 0.5}}
    with pytest.raises(RuleFileError, match=r"ov2.yaml:3: .*'cpa' is not a parameter"):
        load_pack_text("overrides:\n  - runs: '*'\n    params: {kl_above_target: {cpa: 0.5}}\n",
                       "ov2.yaml")


def test_an_unknown_key_is_an_error_at_its_line():
    msg = error_of("""
        rules:
          - id: a
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1, windw: 5}
        """)
    assert lines_of(msg) == [5] and "windw" in msg


def test_an_unknown_metric_is_a_warning_with_its_line_and_the_pack_still_loads():
    pack = load_pack_text(textwrap.dedent("""
        rules:
          - id: a
            tiers:
              - severity: red
                when: {metric: kl/mena, above: 0.1}
          - id: b
            tiers:
              - severity: red
                when: {metric: objective/kl, above: 0.1}
        """).lstrip("\n"), "mine.yaml")
    warnings = pack_warnings(pack)
    assert len(warnings) == 1, warnings      # objective/kl is a preset's name: known
    assert warnings[0].startswith("mine.yaml:5: warning:") and "kl/mena" in warnings[0]


def test_the_second_metric_and_the_warm_up_metric_are_checked_too():
    """versus (follow_z) and after_warmup_of name metrics: a misspelt one is warned about at
    its line, as the metric itself is; after_warmup_of without a warm-up to count is an error."""
    pack = load_pack_text(textwrap.dedent("""
        rules:
          - id: a
            tiers:
              - severity: orange
                when: {metric: reward/mean, signal: follow_z, versus: judge/scor, window: 50, below: 0.3}
          - id: b
            tiers:
              - severity: orange
                when: {metric: reward/mean, signal: mean, min_steps: 50, after_warmup_of: lr/actr, above: 1}
          - id: c
            tiers:
              - severity: orange
                when: {metric: reward/mean, signal: mean, min_steps: 50, after_warmup_of: lr/actor, above: 1}
        """).lstrip("\n"), "mine.yaml")
    warnings = pack_warnings(pack)
    assert [w.split(" warning:")[0] for w in warnings] == ["mine.yaml:5:", "mine.yaml:9:"], warnings
    # the steps past the warm-up given apart from the run's
    load_pack_text("rules:\n  - id: a\n    tiers:\n      - severity: orange\n        when: "
                   "{metric: reward/mean, signal: mean, min_steps: 100, after_warmup_of: lr/actor, "
                   "after_warmup_steps: 20, above: 1}\n", "mine.yaml")
    assert "judge/scor" in warnings[0] and "lr/actr" in warnings[1]
    for when, why in (
            ("{metric: reward/mean, signal: mean, after_warmup_of: lr/actor, above: 1}",
             "give min_steps of 2 or more"),
            ("{ranks: grad_norm/actor, stat: max_over_median, after_warmup_of: lr/actor, above: 3}",
             "after_warmup_of belongs to metric conditions"),
            ("{metric: reward/mean, signal: mean, min_steps: 50, after_warmup_steps: 20, above: 1}",
             "name its metric with after_warmup_of"),
            ("{metric: reward/mean, signal: mean, after_warmup_of: lr/actor, after_warmup_steps: 20, above: 1}",
             "give min_steps of 2 or more"),
            ("{metric: reward/mean, signal: mean, min_steps: 9, after_warmup_of: lr/actor, after_warmup_steps: 1, above: 1}",
             "after_warmup_steps")):
        msg = error_of("rules:\n  - id: a\n    tiers:\n      - severity: orange\n"
                       f"        when: {when}\n")
        assert lines_of(msg) == [5] and why in msg, msg


def test_the_built_in_pack_names_only_metrics_the_contract_knows():
    """`rlwatch rules check` of the pack users copy says nothing but OK (nan_inf reads
    loss/total, a framework's total loss)."""
    assert pack_warnings(load_pack("rlhf")) == []


def test_rules_check_prints_the_warning_and_passes(tmp_path, capsys):
    f = tmp_path / "w.yaml"
    f.write_text("rules:\n  - id: a\n    tiers:\n      - severity: red\n"
                 "        when: {metric: kl/mena, above: 0.1}\n")
    assert main(["rules", "check", str(f)]) == 0
    cap = capsys.readouterr()
    assert f"{f}:5: warning:" in cap.err and "kl/mena" in cap.err
    assert f"{f}: OK" in cap.out


def test_rules_check_fails_on_an_undefined_parameter(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("rules:\n  - id: a\n    tiers:\n      - severity: red\n"
                 "        when: {metric: kl/mean, above: {param: kl_cap}}\n")
    assert main(["rules", "check", str(f)]) == 1
    assert f"{f}:5:" in capsys.readouterr().err


# -- the built-in pack ---------------------------------------------------------------------------

def test_every_threshold_of_the_builtin_pack_is_a_named_parameter():
    literal = []
    for rule in rlhf_pack().rules:
        conds = [leaf for t in rule.tiers for leaf in leaves(t.when)]
        conds += [leaf for n in rule.notes for leaf in leaves(n.when)]
        for c in conds:
            for key in ("above", "below", "abs_above", "cap", "stalled_seconds"):
                spec = getattr(c, key)
                if isinstance(spec, (int, float)) and not isinstance(spec, bool):
                    literal.append((rule.id, key, spec))
                if isinstance(spec, Threshold) and not isinstance(spec.factor, str) and spec.param:
                    literal.append((rule.id, key, spec.factor))
    assert literal == []


def test_rules_list_params_shows_defaults(capsys):
    assert main(["rules", "list", "--params"]) == 0
    out = capsys.readouterr().out
    kl = out.split("kl_above_target", 1)[1].split("\nkl_rising", 1)[0]
    assert "cap = 0.2" in kl and "yellow = 1.5" in kl and "red = 2.5" in kl


def test_a_run_overrides_a_builtin_threshold_without_copying_the_rule():
    pack = rlhf_pack()
    text = "overrides:\n  - runs: 'loose-*'\n    params: {kl_above_target: {red: 10, cap: 5}}\n"
    pack = merge_packs(pack, load_pack_text(text, "ov.yaml"))
    values = [0.02] * 10 + [0.3] * 6
    loose = firing(feed_series(Pipeline(pack), "loose-1", "kl/mean", values), "kl_above_target")
    strict = firing(feed_series(Pipeline(pack), "prod-1", "kl/mean", values), "kl_above_target")
    assert {a.severity for a in loose} == {"yellow"}
    assert {a.severity for a in strict} == {"info", "yellow", "red", "black"}


def test_the_pack_is_one_commented_source_file_whose_diagnoses_load_with_it(tmp_path):
    text = (PACKS / "rlhf.yaml").read_text()
    assert text.startswith("#") and "diagnoses: diagnoses.yaml" in text
    assert not (PACKS / "rlhf.rules.yaml").exists()
    # a user's copy loads with the diagnoses beside it, like the built-in pack
    (tmp_path / "rlhf.yaml").write_text(text)
    (tmp_path / "diagnoses.yaml").write_text((PACKS / "diagnoses.yaml").read_text())
    copy = load_pack(str(tmp_path / "rlhf.yaml"))
    assert [r.diagnosis for r in copy.rules] == [r.diagnosis for r in rlhf_pack().rules]
    assert all(r.diagnosis.startswith("Probably:") for r in copy.rules)
    # and without them it says which file is missing, at the line naming it
    (tmp_path / "diagnoses.yaml").unlink()
    with pytest.raises(RuleFileError, match="diagnoses: no such file"):
        load_pack(str(tmp_path / "rlhf.yaml"))


def test_a_dist_condition_with_its_cap_from_a_parameter_fires():
    pack = load_pack_text(textwrap.dedent("""
        rules:
          - id: long_tail
            params: {long: 500, share: 0.25}
            tiers:
              - severity: yellow
                when: {dist: response_length, stat: tail_mass, cap: long, above: share}
        """).lstrip("\n"), "mine.yaml")
    p = Pipeline(pack)
    out = []
    for step in range(3):
        lengths = [100.0] * 6 + ([900.0] * 4 if step == 2 else [100.0] * 4)
        ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": step, "ts": T0 + step,
                          "dists": {"response_length": lengths}}, T0)
        out += p.feed(ev, ev.ts)
    (a,) = firing(out, "long_tail")
    assert a.step == 2 and a.value == pytest.approx(0.4) and a.threshold == pytest.approx(0.25)


def test_as_many_steps_past_the_warm_up_as_from_the_start_read_the_same_statistics():
    """``after_warmup_steps`` equal to ``min_steps`` says what leaving it out says: the two
    conditions are planned alike, so a run keeps one reader for both."""
    from rules.compile import _plan_leaf
    from rules.schema import Condition

    base = {"metric": "reward/mean", "signal": "mean", "min_steps": 20, "after_warmup_of": "lr/actor",
            "above": 1}
    same = _plan_leaf(Condition(**base, after_warmup_steps=20), {}, {})
    assert same == _plan_leaf(Condition(**base), {}, {})
    assert same != _plan_leaf(Condition(**base, after_warmup_steps=30), {}, {})


HELD = textwrap.dedent("""
    rules:
      - id: two_speeds
        tiers:
          - severity: orange
            when:
              any:
                - for: 30
                  all:
                    - {metric: a, above: 0.5}
                - for: 10
                  any:
                    - {metric: b, above: 0.5}
    """).lstrip("\n")


GATED = textwrap.dedent("""
    rules:
      - id: two_speeds
        tiers:
          - severity: orange
            when:
              all:
                - {metric: a, above: 0.5}
                - for: 10
                  any:
                    - {metric: b, above: 0.5}
    """).lstrip("\n")


def _held_run(a, b, every=1, restore_at=None, text=HELD):
    """The steps two_speeds fires at over series ``a`` and ``b`` (one point per ``every``
    steps); ``restore_at``: the run's state written and read back after that point."""
    from streams.processor import Processor
    from streams.state_codec import decode_state, encode_state

    proc = Processor(load_pack_text(text, "mine.yaml"))
    state = proc.new_state("r")
    fired = []
    for i, (x, y) in enumerate(zip(a, b)):
        ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": i * every,
                          "ts": T0 + i, "metrics": {"a": x, "b": y}}, T0)
        fired += [al.step for al in proc.process(state, ev, ev.ts)
                  if al.rule == "two_speeds" and al.state == "firing"]
        if i == restore_at:
            state = proc.load_state(decode_state(encode_state(state.to_state())))
    return fired


def test_each_branch_of_a_tier_may_hold_over_its_own_steps():
    """``for`` on an all/any branch: the branch counts once it held over that many steps."""
    on, off = 1.0, 0.0
    assert _held_run([on] * 40, [off] * 40) == [29]                 # a held 30 steps
    assert _held_run([off] * 40, [off] * 5 + [on] * 35) == [14]     # b held 10 steps
    assert _held_run([on] * 25 + [off] * 15, [off] * 40) == []      # a, 25 steps: not enough
    gap = [on] * 20 + [off] + [on] * 19
    assert _held_run(gap, [off] * 40) == []                         # a false point starts it over
    # logged every 10 steps: a point at steps 0, 10, 20 and 30 holds over 31 steps
    assert _held_run([on] * 6, [off] * 6, every=10) == [30]


def test_a_held_branch_counts_every_point_though_a_branch_before_it_is_false():
    """The branches around a held one are all read at each point: `b` is counted from its
    first true point while `a`, read first, is false (no short-circuit past it), and the tier
    fires as soon as `a` is true and `b` has held 10 steps."""
    on, off = 1.0, 0.0
    assert _held_run([off] * 5 + [on] * 35, [on] * 40, text=GATED) == [9]
    assert _held_run([off] * 12 + [on] * 28, [on] * 40, text=GATED) == [12]


def test_a_held_branch_goes_on_counting_in_a_restored_run():
    """The onset of a held branch is part of the run's state: a worker restarted mid-hold fires
    at the same step as one that never stopped."""
    on, off = 1.0, 0.0
    a = [off] * 5 + [on] * 40
    assert _held_run(a, [off] * 45) == [34]
    assert _held_run(a, [off] * 45, restore_at=20) == [34]


def test_a_held_branch_keeps_its_count_when_the_pack_around_it_changes():
    """A worker restarted with an edited pack (a branch added before a held one) goes on
    counting the unchanged branch; a branch whose test changed starts its count afresh."""
    from streams.processor import Processor
    from streams.state_codec import decode_state, encode_state

    edited = HELD.replace("          any:\n            - for: 30",
                          "          any:\n            - {metric: c, above: 0.5}\n            - for: 30")
    retuned = HELD.replace("for: 30", "for: 31")
    assert edited != HELD and retuned != HELD

    def fires(after: str) -> list[int]:
        proc = Processor(load_pack_text(HELD, "mine.yaml"))
        state = proc.new_state("r")
        fired = []
        for i in range(55):
            if i == 20:      # the worker restarts with the pack ``after``
                proc = Processor(load_pack_text(after, "mine.yaml"))
                state = proc.load_state(decode_state(encode_state(state.to_state())))
            ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": i, "ts": T0 + i,
                              "metrics": {"a": 1.0 if i >= 5 else 0.0, "b": 0.0, "c": 0.0}}, T0)
            fired += [al.step for al in proc.process(state, ev, ev.ts)
                      if al.rule == "two_speeds" and al.state == "firing"]
        return fired

    assert fires(HELD) == [34]
    assert fires(edited) == [34]
    assert fires(retuned) == [50]       # counted from the restart at step 20: 31 steps on


@pytest.mark.parametrize("where", [
    "when: {metric: a, above: 0.5, for: 3}",
    "when: {metric: a, above: 0.5}\n        keep_firing_while: {for: 3, all: [{metric: a, above: 0.2}]}",
])
def test_for_belongs_to_tiers_and_all_any_branches_of_their_when(where):
    text = textwrap.dedent("""
        rules:
          - id: r
            tiers:
              - severity: yellow
                WHERE
        """).lstrip("\n").replace("WHERE", where)
    msg = error_of(text)
    assert "for" in msg and ("all/any" in msg or "cannot be held" in msg), msg

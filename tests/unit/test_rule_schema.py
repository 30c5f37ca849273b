"""rules.schema + rules.loader: rule files are validated, and errors point at the right line."""

from __future__ import annotations

import re
import textwrap

import pytest

from rules.loader import RuleFileError, load_pack, load_pack_text, merge_packs
from rules.schema import Override, Pack
from tests.unit._core import rlhf_pack
from tests.support.paths import FAILURE_MODES



def catalog_ids() -> list[str]:
    """The `id` column of the table in failure-modes.md (continuation rows have an empty id)."""
    ids = []
    in_table = False
    for line in FAILURE_MODES.read_text().splitlines():
        if line.startswith("| id |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            cell = line.split("|")[1].strip()
            m = re.fullmatch(r"`([a-z0-9_]+)`", cell)
            if m:
                ids.append(m.group(1))
    return ids


def error_of(text: str, source: str = "rules.yaml") -> str:
    with pytest.raises(RuleFileError) as info:
        load_pack_text(textwrap.dedent(text).lstrip("\n"), source)
    return str(info.value)


def lines_of(message: str, source: str = "rules.yaml") -> list[int]:
    return [int(n) for n in re.findall(re.escape(source) + r":(\d+):", message)]


# -- the built-in pack ------------------------------------------------------------------------

def test_catalog_table_parses_to_42_ids():
    ids = catalog_ids()
    assert len(ids) == 42 and len(set(ids)) == 42
    assert ids[0] == "kl_above_target" and ids[-1] == "proxy_divergence"


def test_builtin_pack_has_exactly_the_catalog_rules():
    pack = rlhf_pack()
    assert pack.pack == "rlhf"
    assert len(pack.rules) == 42
    assert sorted(r.id for r in pack.rules) == sorted(catalog_ids())


def test_builtin_pack_default_kl_target_and_cap():
    pack = rlhf_pack()
    assert pack.targets["kl"] == 0.05
    kl = next(r for r in pack.rules if r.id == "kl_above_target")
    assert kl.params["cap"] == 0.2
    tiers = {t.severity: t for t in kl.tiers}
    assert list(tiers) == ["info", "yellow", "red", "black"]
    # a one-point excursion only notifies; the red and black tiers need the level to hold
    assert tiers["info"].action_names() == ["notify"]
    assert tiers["red"].action_names() == ["pause", "snapshot"] and tiers["red"].for_ > 1
    assert {"stop", "rollback"} <= set(tiers["black"].action_names()) and tiers["black"].for_ > 1
    assert tiers["yellow"].adjust_params() == {"beta": 1.5}


def test_only_unambiguous_or_corroborated_tiers_brake():
    # severity discipline (failure-modes.md): a brake needs a `for` over several steps, a
    # level signal (median of the last points), or an absolute condition (non-finite, hashes)
    from rules.schema import leaves

    brakes = {"pause", "stop", "rollback"}
    level_signals = {"median", "min", "max", "shift_z", "level_ratio", "shift_rel", "start_z",
                     "ratio_to_start", "trend_z", "level_to_max", "ratio_to_start_max", "ema"}
    for r in rlhf_pack().rules:
        for t in r.tiers:
            if not brakes & set(t.action_names()):
                continue
            metric_leaves = [c for c in leaves(t.when) if c.metric is not None]
            absolute = any(c.nonfinite is not None or c.hashes is not None for c in leaves(t.when))
            several = t.for_ > 1 or all(c.signal in level_signals for c in metric_leaves)
            assert absolute or (metric_leaves and several) or len(metric_leaves) > 1, \
                f"{r.id}/{t.severity} brakes on a single statistical excursion"


def test_every_builtin_rule_has_a_diagnosis_and_a_summary():
    for r in rlhf_pack().rules:
        assert r.diagnosis.strip(), f"{r.id} has no diagnosis"
        assert r.summary.strip(), f"{r.id} has no summary"


def test_load_pack_by_missing_path_names_the_file():
    with pytest.raises(RuleFileError, match="no such rule file"):
        load_pack("/nonexistent/rules.yaml")


def test_load_pack_from_a_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("pack: mine\nrules:\n  - id: kl_hi\n    tiers:\n"
                 "      - severity: red\n        when: {metric: kl/mean, above: 0.1}\n")
    pack = load_pack(str(f))
    assert pack.pack == "mine" and [r.id for r in pack.rules] == ["kl_hi"]
    # defaults: one step, notify
    assert pack.rules[0].tiers[0].for_ == 1
    assert pack.rules[0].tiers[0].actions == ["notify"]


# -- errors with line numbers -----------------------------------------------------------------

def test_unknown_signal_points_at_its_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: red
                when:
                  signal: fancy
                  metric: kl/mean
                  above: 0.1
        """)
    assert "rules.yaml:7:" in msg
    assert "fancy" in msg and "unknown signal" in msg


def test_unknown_action_points_at_the_actions_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
                actions: [pause, explode]
        """)
    assert lines_of(msg) == [7]
    assert "explode" in msg


def test_condition_with_two_sources_is_refused_at_the_condition():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: red
                when:
                  metric: kl/mean
                  nonfinite: any
                  above: 0.1
        """)
    assert lines_of(msg) and all(6 <= n <= 9 for n in lines_of(msg)), msg
    assert "exactly one of" in msg and "metric" in msg and "nonfinite" in msg


def test_metric_condition_without_above_or_below_is_refused():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: red
                when:
                  metric: kl/mean
        """)
    assert lines_of(msg) and all(6 <= n <= 7 for n in lines_of(msg)), msg
    assert "above" in msg and "below" in msg


def test_unknown_severity_points_at_its_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: purple
                when: {metric: kl/mean, above: 0.1}
        """)
    assert lines_of(msg) == [5]


def test_misspelt_key_is_refused_at_its_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: my_kl
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
                for_steps: 3
        """)
    assert lines_of(msg) == [7] and "for_steps" in msg


def test_error_in_second_rule_points_into_the_second_rule():
    msg = error_of("""
        pack: mine
        rules:
          - id: first
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
          - id: second
            tiers:
              - severity: red
                when: {metric: kl/mean, below: {factor: 2}}
        """)
    assert lines_of(msg) and all(n == 10 for n in lines_of(msg)), msg


def test_invalid_yaml_reports_a_line():
    msg = error_of("pack: mine\nrules:\n  - id: a\n    tiers: [\n")
    assert "not valid YAML" in msg and lines_of(msg)


def test_non_mapping_file_is_refused_at_line_1():
    assert "rules.yaml:1:" in error_of("- just\n- a list\n")


def test_duplicate_ids_are_refused_and_named():
    msg = error_of("""
        pack: mine
        rules:
          - id: kl_hi
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
          - id: kl_hi
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.2}
        """)
    assert "kl_hi" in msg and "unique" in msg


def test_duplicate_id_error_points_at_a_line_of_the_repeated_id():
    msg = error_of("""
        pack: mine
        rules:
          - id: kl_hi
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
          - id: kl_hi
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.2}
        """)
    # the id is written on lines 3 and 7; pointing at line 1 (the file start) helps nobody
    assert lines_of(msg) and set(lines_of(msg)) <= {3, 7}, msg


def test_same_severity_twice_in_one_rule_is_refused():
    msg = error_of("""
        pack: mine
        rules:
          - id: kl_hi
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
              - severity: red
                when: {metric: kl/mean, above: 0.2}
        """)
    assert "same severity" in msg


def test_dist_condition_needs_a_known_stat():
    msg = error_of("""
        pack: mine
        rules:
          - id: shape
            tiers:
              - severity: yellow
                when: {dist: reward, stat: wobble, above: 1}
        """)
    assert "stat" in msg and "bimodality" in msg


def test_override_model_fields():
    ov = Override(runs="ppo-8b-*", targets={"kl": 0.03}, disable=["stagnation"],
                  params={"kl_above_target": {"cap": 0.5}})
    assert ov.runs == "ppo-8b-*" and ov.params["kl_above_target"]["cap"] == 0.5
    with pytest.raises(ValueError):
        Override(runs="*", unknown_field=1)


def test_merge_packs_later_rule_with_same_id_wins():
    a = load_pack_text("pack: a\ntargets: {kl: 0.05}\nrules:\n  - id: x\n    title: old\n"
                       "    tiers:\n      - severity: red\n        when: {metric: m, above: 1}\n")
    b = load_pack_text("pack: b\ntargets: {kl: 0.1}\nrules:\n  - id: x\n    title: new\n"
                       "    tiers:\n      - severity: red\n        when: {metric: m, above: 2}\n"
                       "  - id: y\n    tiers:\n      - severity: red\n"
                       "        when: {metric: m, above: 3}\n")
    m = merge_packs(a, b)
    assert isinstance(m, Pack)
    assert [r.id for r in m.rules] == ["x", "y"]
    assert m.rules[0].title == "new"
    assert m.targets == {"kl": 0.1}


def test_error_inside_a_composite_points_at_the_nested_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: a
            tiers:
              - severity: red
                when:
                  any:
                    - {metric: kl/mean, above: 0.1}
                    - metric: kl/mean
                      signal: bogus
                      above: 0.2
        """)
    assert lines_of(msg) == [10] and "any.1.signal" in msg


def test_error_in_an_override_points_at_its_line():
    msg = error_of("""
        pack: mine
        rules:
          - id: a
            tiers:
              - severity: red
                when: {metric: kl/mean, above: 0.1}
        overrides:
          - runs: "x*"
            params: {a: {cap: lots}}
        """)
    assert lines_of(msg) == [9] and "cap" in msg

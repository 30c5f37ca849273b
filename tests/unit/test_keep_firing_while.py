"""keep_firing_while: a firing alert does not resolve while its recovery condition holds
(the state machine, the rule language, and a run through the pipeline)."""

from __future__ import annotations

import re
import textwrap

import pytest

from rules.loader import RuleFileError, load_pack_text, pack_warnings
from rules.state import AlertState, advance
from streams.processor import Pipeline
from tests.unit._core import feed_series, firing, resolved, step_event


def run(verdicts, keeps, **kw):
    """Advance one state through (holds, keep) pairs at steps 0, 1, ...; the transitions and
    the steps at which ``keep`` was read."""
    s, out, read = AlertState(), [], []
    for step, (holds, kept) in enumerate(zip(verdicts, keeps)):
        def keep(step=step, kept=kept):
            read.append(step)
            return kept
        t = advance(s, holds, step, 1000.0 + step, keep=keep, **kw)
        if t is not None:
            out.append((step, t))
    return out, read


def test_a_firing_alert_stays_firing_while_keep_holds_and_resolves_when_it_does_not():
    out, _ = run([True, False, False, False, False], [None, True, True, False, False])
    assert out == [(0, "firing"), (3, "resolved")]


def test_keep_is_read_only_while_firing_and_false():
    out, read = run([False, True, True, False, True, False], [True] * 6, for_steps=2)
    assert out == [(2, "firing")]
    assert read == [3, 5]     # not while inactive (0) or pending (1), nor at true points


def test_an_undecided_keep_keeps_nothing():
    out, _ = run([True, False], [None, None])
    assert out == [(0, "firing"), (1, "resolved")]


def test_keep_firing_for_counts_from_the_first_step_at_which_neither_holds():
    out, _ = run([True, False, False, False, False, False], [None, True, True, False, False, False],
                 keep_firing_for=2)
    assert out == [(0, "firing"), (5, "resolved")]


# -- the language --------------------------------------------------------------------------------

RULE = """
    rules:
      - id: kl_high
        params: {cap: 0.2, back: 0.1}
        tiers:
          - severity: orange
            when: {metric: kl/mean, above: cap}
            keep_firing_while: %s
"""


def load(keep: str, source: str = "mine.yaml"):
    return load_pack_text(textwrap.dedent(RULE % keep).lstrip("\n"), source)


def test_an_undefined_parameter_in_keep_firing_while_is_an_error_at_its_line():
    with pytest.raises(RuleFileError) as info:
        load("{metric: kl/mean, above: bakc}")
    msg = str(info.value)
    assert re.findall(r"mine\.yaml:(\d+):", msg) == ["7"], msg
    assert "keep_firing_while" in msg and "'bakc' is not a parameter of rule 'kl_high'" in msg


def test_keep_firing_while_reads_the_step_not_ranks_samples_or_silence():
    for keep in ("{ranks: grad_norm/actor, stat: max_over_median, above: back}",
                 "{samples: token_kl_argmax, stat: top_share, above: back}",
                 "{stalled_seconds: 300}"):
        with pytest.raises(RuleFileError, match="keep_firing_while reads the step's metrics"):
            load(keep)


def test_a_misspelt_metric_in_keep_firing_while_is_a_warning_at_its_line():
    pack = load("{metric: kl/mena, above: back}")
    [warning] = pack_warnings(pack)
    assert warning.startswith("mine.yaml:7:") and "'kl/mena'" in warning


# -- through the pipeline ------------------------------------------------------------------------

def test_the_alert_resolves_when_the_recovery_condition_lets_go_not_when_its_own_does():
    pack = load("{metric: kl/mean, above: back}")
    kl = [0.05] * 5 + [0.3] * 3 + [0.15] * 10 + [0.05] * 3
    alerts = feed_series(Pipeline(pack), "r", "kl/mean", kl)
    assert [a.step for a in firing(alerts, "kl_high")] == [5]
    assert [a.step for a in resolved(alerts, "kl_high")] == [18]   # the first 0.05, not 0.15


def test_a_keep_on_another_metric_is_one_of_the_rule_s_inputs():
    from rules.compile import rule_inputs
    [rule] = load("{metric: reward/mean, below: back}").rules
    assert rule_inputs(rule) == frozenset({"kl/mean", "reward/mean"})


def test_the_keep_reads_another_metric_logged_in_the_same_events():
    pack = load("{metric: reward/mean, below: back}")
    p = Pipeline(pack)
    out = []
    for step, (kl, reward) in enumerate([(0.05, 0.05), (0.3, 0.05), (0.05, 0.05), (0.05, 0.05),
                                         (0.05, 0.5)]):
        ev = step_event("r", step, {"kl/mean": kl, "reward/mean": reward})
        out += p.feed(ev, ev.ts)
    assert [a.step for a in firing(out, "kl_high")] == [1]
    assert [a.step for a in resolved(out, "kl_high")] == [4]

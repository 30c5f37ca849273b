"""Honest backtest: every labelled run judged by *its own* rule(s), at the severity its label
needs, within its window, with the false alarms and brakes that came before the onset.

Used by ``rlwatch backtest DIR`` (rlwatch/backtest_cli.py), ``bench/backtest.py`` and the tests. It reaches the rules only
through stable, high-level APIs (``rlwatch.replay.replay``, ``streams.processor.Pipeline.feed``,
``rules.loader.load_pack`` / ``merge_packs`` / ``with_preset``), so it keeps working while the
rule engine changes underneath.

A directory to backtest holds recorded runs and a ``labels.json`` beside them::

    {"run-a.jsonl": {"label": "truncation", "onset": 65, "preset": "trl-grpo"},
     "run-b.jsonl": {"label": "healthy", "onset": null},
     "run-c.jsonl": {"label": "stagnation", "onset": 1, "max_delay": 400, "source": "team-x"}}

What each label expects (:func:`expectation`):

* ``healthy``: quiet, nothing orange or above and no brake anywhere. Yellow notices are counted
  (per 1,000 training steps), not failed.
* a fault label: caught by one of its own rules (:data:`OWN_RULES`, else the catalog id itself
  with its :data:`EQUIVALENT` ids) at the required severity (orange, or the rule's own top tier
  when that is lower: ``stagnation`` is yellow) within the window after the onset: the label's
  ``max_delay``, else :data:`DEFAULT_WINDOW` steps (at least :data:`MIN_WINDOW_LOGS` logging
  intervals); ``stagnation`` without ``max_delay``: until the end of the run (flat can only be
  called after a while). A copy re-logged with its step numbers K times larger
  (``vary_real`` steps=K) has K times each window and grace counted in steps. And no brake from another rule before the onset.
  A simulated onset is exact: anything orange or above more than :data:`PRE_ONSET_GRACE` steps
  (or one logging interval) before it fails the run, own rule included. A reader's onset (a
  recorded run) is an estimate, good to two logged points: an own-rule alert up to one window
  before it is an early catch (negative delay); another rule's orange-or-above alert before it
  is reported and counted, but fails only if it brakes (recorded runs often have a second,
  unlabelled problem; issue 10's criterion for them is the own rule, the window and no brake).
* notify-only labels (:data:`NOTIFY_ONLY`, e.g. a one-step KL / gradient spike): an own-rule
  notice (info or yellow) within :data:`NOTIFY_WINDOW` steps of the onset (the label's
  ``max_delay``; until the end of the run for :data:`RECURRING` events), and nothing orange or
  above and no brake anywhere in the run ("warn, don't alarm").
* anything else (``other`` without an id, a label the catalog does not know): reported, not
  scored.

A *brake* is an alert whose actions include ``pause``, ``stop`` or ``rollback``.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from contract.alert import Alert, severity_rank

__all__ = [
    "BRAKES", "CATALOG_TIER", "DEFAULT_WINDOW", "EQUIVALENT", "Label", "NOTIFY_ONLY", "OWN_RULES",
    "REAL_VARIANTS", "RealReport", "Score", "SimCase", "SimReport", "Span", "Verdict", "as_pack", "delay_table", "expectation", "judge", "load_labels", "replay_labelled", "run_sim", "score",
    "parse_variant", "score_real", "score_sim", "score_variant", "table", "vary_real",
]

BRAKES = frozenset({"pause", "stop", "rollback"})

#: Steps after the onset a fault must be caught within, unless its label says ``max_delay``.
DEFAULT_WINDOW = 100
#: ... but never fewer than this many logging intervals (a run logging every 10 steps).
MIN_WINDOW_LOGS = 10
#: Steps after the onset a notify-only event must be noticed within (it is over at once).
NOTIFY_WINDOW = 10
#: Exact (simulated) onsets: alerts this many steps before the onset still belong to the fault
#: (an injector may start a step or two early); at least one logging interval.
PRE_ONSET_GRACE = 5

#: Highest tier of each catalog id in failure-modes.md (the required severity of a simulated
#: fault is the lower of orange and this).
CATALOG_TIER: dict[str, str] = {
    "kl_above_target": "black", "kl_rising": "orange", "kl_zero": "black",
    "token_kl_spike": "red", "tool_words": "yellow", "entropy_collapse": "red",
    "reward_spike": "orange", "reward_oscillation": "yellow", "reward_periodic": "yellow",
    "reward_collapse": "red", "reward_degradation": "orange", "reward_shape": "orange",
    "length_hacking": "orange", "truncation_rising": "orange", "length_shape": "yellow",
    "reward_length_corr": "orange", "reward_quality_divergence": "red",
    "value_loss_divergence": "red", "nan_inf": "black", "value_shift": "red",
    "clip_frac_high": "red", "clip_frac_low": "yellow", "aggressive_update": "orange",
    "kl_cycle_delta": "yellow", "grad_norm_anomaly": "orange", "update_ratio": "yellow",
    "rank_outlier": "orange", "param_hash_mismatch": "black", "category_imbalance": "orange",
    "prompt_extreme_reward": "yellow", "stagnation": "yellow", "gpu_memory_spike": "orange",
    "run_stalled": "orange", "rm_overfit": "orange", "dpo_saturation": "yellow",
    "grpo_zero_variance": "yellow", "degenerate_text": "orange", "entropy_blowup": "red",
    "reward_crash": "red", "dead_reward": "orange", "dpo_chosen_decline": "orange",
    "proxy_divergence": "orange",
}

#: Catalog ids that name the same failure seen through different metrics: either catches it.
#: ``reward_collapse`` / ``dead_reward`` / ``grpo_zero_variance`` are all "the reward gives no
#: learning signal" (through reward/std, constant values, or GRPO's zero-variance groups; which
#: one can fire depends on what the framework logs); ``proxy_divergence`` is the general form of
#: ``reward_quality_divergence``. The required severity stays the label's (orange for a
#: collapse), so a yellow ``grpo_zero_variance`` alone does not catch a collapse.
EQUIVALENT: dict[str, tuple[str, ...]] = {
    "reward_collapse": ("dead_reward", "grpo_zero_variance"),
    "dead_reward": ("reward_collapse",),
    "proxy_divergence": ("reward_quality_divergence",),
    "reward_quality_divergence": ("proxy_divergence",),
}

#: Label -> the rule ids that should catch it (labels that are not catalog ids themselves).
OWN_RULES: dict[str, tuple[str, ...]] = {
    "truncation": ("truncation_rising",),
    "other:transient_kl_grad_spike": ("kl_above_target", "grad_norm_anomaly", "token_kl_spike"),
    "other:dpo_chosen_reward_decline": ("dpo_chosen_decline",),
    "other:proxy_reward_hacking": ("proxy_divergence", "reward_quality_divergence"),
    "nan_inf:skipped_step": ("nan_inf",),
}

#: Labels that must be noticed (info or yellow) and must never alarm or brake.
NOTIFY_ONLY = frozenset({"other:transient_kl_grad_spike", "nan_inf:skipped_step"})
#: Notify-only labels whose event recurs at isolated steps (a run logging every k steps may show
#: the first one late): the notice may come until the end of the run.
RECURRING = frozenset({"nan_inf:skipped_step"})


def own_rules(label: str) -> tuple[str, ...] | None:
    """The rule ids that should catch ``label``; None when the label is not scored."""
    if label in OWN_RULES:
        return OWN_RULES[label]
    if label in CATALOG_TIER:
        return (label, *EQUIVALENT.get(label, ()))
    return None


def required_severity(label: str) -> str:
    if label in NOTIFY_ONLY:
        return "info"
    rules = own_rules(label) or ()
    tier = CATALOG_TIER.get(rules[0], "orange") if rules else "orange"
    return min(tier, "orange", key=severity_rank)


# -- labels and expectations ------------------------------------------------------------------

@dataclass(frozen=True)
class Label:
    run: str                      # the file name (real logs) or run id (simulated)
    label: str
    onset: int | None = None
    max_delay: int | None = None
    preset: str | None = None
    source: str | None = None     # grouping for leave-one-source-out
    onset_exact: bool = False     # simulated onsets are exact; a reader's are an estimate
    unseen: str | None = None     # why the fault never reached a logged point (unscored)
    lost: tuple[str, ...] = ()    # metrics a re-logged copy keeps no point of (vary_real)
    step_scale: int = 1           # a copy's step numbers x this (vary_real steps=K): the default
                                  # windows, counted in the original's steps, scale with them


@dataclass(frozen=True)
class Span:
    """The training steps a run covered, as logged."""

    first_step: int
    last_step: int
    logged: int

    @property
    def interval(self) -> int:
        """The logging interval in steps (1 for a run logging every step)."""
        if self.logged < 2:
            return 1
        return max(1, round((self.last_step - self.first_step) / (self.logged - 1)))

    @property
    def steps(self) -> int:
        """Training steps covered (a run logging every 5 from 5 to 200 covers 200)."""
        return self.last_step - self.first_step + self.interval


@dataclass(frozen=True)
class Expectation:
    kind: str                     # "quiet" | "catch" | "notify" | "unscored"
    own: tuple[str, ...] = ()
    required: str | None = None
    onset: int | None = None
    window_end: int | None = None     # last step a catch counts at
    early_from: int | None = None     # first step an own-rule alert counts at
    note: str = ""


def expectation(label: Label, span: Span) -> Expectation:
    if label.label == "healthy":
        return Expectation("quiet")
    own = own_rules(label.label)
    if own is None:
        return Expectation("unscored", note=f"label {label.label!r} names no catalog failure: "
                                            "reported, not scored")
    if label.unseen:
        return Expectation("unscored", own, note=label.unseen)
    onset = label.onset if label.onset is not None else span.first_step
    k = label.step_scale
    grace = max(PRE_ONSET_GRACE * k, span.interval)
    if label.label in NOTIFY_ONLY:
        window = max(NOTIFY_WINDOW * k, 2 * span.interval)
        if label.label in RECURRING or label.max_delay is not None:
            window = label.max_delay if label.max_delay is not None else max(window, span.last_step - onset)
        return Expectation("notify", own, "info", onset, onset + window, onset - grace)
    if label.max_delay is not None:
        window = int(label.max_delay)
    elif "stagnation" in own:
        window = max(span.last_step - onset, MIN_WINDOW_LOGS * span.interval)
    else:
        window = max(DEFAULT_WINDOW * k, MIN_WINDOW_LOGS * span.interval)
    early = onset - grace if label.onset_exact else onset - window
    return Expectation("catch", own, required_severity(label.label), onset, onset + window, early)


# -- one run's verdict --------------------------------------------------------------------------

@dataclass(frozen=True)
class Hit:
    rule: str
    severity: str
    step: int
    actions: tuple[str, ...] = ()

    @classmethod
    def of(cls, a: Alert) -> "Hit":
        return cls(a.rule, a.severity, a.step, tuple(a.actions))

    def __str__(self) -> str:
        brake = sorted(BRAKES & set(self.actions))
        return f"{self.rule} {self.severity}@{self.step}" + (f" ({'/'.join(brake)})" if brake else "")


@dataclass
class Verdict:
    run: str
    label: str
    kind: str
    passed: bool | None               # None: not scored
    source: str | None = None
    own: tuple[str, ...] = ()
    required: str | None = None
    onset: int | None = None
    window_end: int | None = None
    caught: Hit | None = None         # first own-rule alert at the required severity in window
    delay: int | None = None          # caught.step - onset (negative: before a reader's onset)
    reached: str | None = None        # highest severity of the own rules within the window
    first_own: Hit | None = None      # first own-rule alert of any severity
    open_at_end: str | None = None    # highest own-rule severity still firing at the end
    false_alarms: list[Hit] = field(default_factory=list)   # orange+ where it must not be
    brakes: list[Hit] = field(default_factory=list)         # every brake of the run
    wrong_brakes: list[Hit] = field(default_factory=list)   # brakes on healthy / before onset
    loud: list[Hit] = field(default_factory=list)           # every orange+ alert of the run
    yellow: int = 0
    info: int = 0
    yellow_rules: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    interval: int = 1
    own_missing: tuple[str, ...] = ()     # own rules the pack does not have
    own_unwatched: tuple[str, ...] = ()   # own rules none of whose inputs were logged
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)     # magnitude, log_every, algo, ...

    @property
    def yellow_per_1k(self) -> float:
        return 1000.0 * self.yellow / self.steps if self.steps else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["yellow_per_1k"] = round(self.yellow_per_1k, 3)
        return d


def _brakes(a: Alert) -> bool:
    return bool(BRAKES & set(a.actions))


def judge(label: Label, alerts: Iterable[Alert], span: Span, *,
          pack_rules: Iterable[str] | None = None, watched: Iterable[str] | None = None) -> Verdict:
    """The verdict on one run from its alerts (pure). ``pack_rules`` / ``watched``: the rule ids
    of the pack and those that had their inputs, to say why an own rule stayed silent."""
    alerts = list(alerts)
    exp = expectation(label, span)
    firing = [a for a in alerts if a.state == "firing"]
    v = Verdict(label.run, label.label, exp.kind, None, label.source, exp.own, exp.required,
                exp.onset, exp.window_end, steps=span.steps, interval=span.interval)
    v.yellow = sum(a.severity == "yellow" for a in firing)
    for a in firing:
        if a.severity == "yellow":
            v.yellow_rules[a.rule] = v.yellow_rules.get(a.rule, 0) + 1
    v.info = sum(a.severity == "info" for a in firing)
    v.brakes = [Hit.of(a) for a in firing if _brakes(a)]
    v.loud = [Hit.of(a) for a in firing if severity_rank(a.severity) >= 2]
    if pack_rules is not None:
        v.own_missing = tuple(r for r in exp.own if r not in set(pack_rules))
    if watched is not None:
        w = set(watched)
        v.own_unwatched = tuple(r for r in exp.own if r not in w and r not in v.own_missing)
        if label.lost and exp.kind in ("catch", "notify") and v.own_unwatched \
                and len(v.own_unwatched) + len(v.own_missing) == len(exp.own):
            # the re-logged copy kept no point of what the own rules read: nothing to judge
            v.kind = "unscored"
            v.problems.append(f"the re-logged copy keeps no point of {', '.join(label.lost[:4])}"
                              + (" ..." if len(label.lost) > 4 else "") + ": not scored")
            return v

    own = set(exp.own)
    open_: dict[tuple[str, str], bool] = {}
    for a in alerts:
        if a.rule in own:
            open_[(a.rule, a.severity)] = a.state == "firing"
    still = [sev for (_, sev), on in open_.items() if on]
    v.open_at_end = max(still, key=severity_rank) if still else None

    if exp.kind == "unscored":
        v.problems.append(exp.note)
        return v
    if exp.kind == "quiet":
        v.false_alarms = list(v.loud)
        v.wrong_brakes = list(v.brakes)
        if v.false_alarms:
            v.problems.append("healthy run alarmed: " + ", ".join(map(str, v.false_alarms[:5])))
        elif v.wrong_brakes:
            v.problems.append("healthy run braked: " + ", ".join(map(str, v.wrong_brakes[:5])))
        v.passed = not v.false_alarms and not v.wrong_brakes
        return v

    assert exp.onset is not None and exp.window_end is not None and exp.early_from is not None
    onset, end, early = exp.onset, exp.window_end, exp.early_from

    def counts_for_fault(a: Alert) -> bool:
        return a.rule in own and early <= a.step <= end

    def before_onset(a: Alert) -> bool:
        if counts_for_fault(a) or a.step >= onset:
            return False
        return a.step < onset - pre_grace

    # an exact onset holds to a logging interval; a reader's estimate to two logged points
    pre_grace = max(PRE_ONSET_GRACE, (1 if label.onset_exact else 2) * span.interval)
    own_alerts = [a for a in firing if counts_for_fault(a)]
    if own_alerts:
        v.first_own = Hit.of(own_alerts[0])
        v.reached = max((a.severity for a in own_alerts), key=severity_rank)

    if exp.kind == "notify":
        notices = [a for a in own_alerts if a.step >= early and severity_rank(a.severity) <= 1]
        if notices:
            v.caught = Hit.of(notices[0])
            v.delay = notices[0].step - onset
        v.false_alarms = list(v.loud)
        v.wrong_brakes = list(v.brakes)
        if not notices:
            v.problems.append(f"no notice from {'/'.join(exp.own)} within {end - onset} steps of the "
                              f"step-{onset} event" + _why_silent(v))
        if v.false_alarms:
            v.problems.append("alarmed instead of notifying: " + ", ".join(map(str, v.false_alarms[:5])))
        if v.wrong_brakes:
            v.problems.append("braked: " + ", ".join(map(str, v.wrong_brakes[:5])))
        v.passed = bool(notices) and not v.false_alarms and not v.wrong_brakes
        return v

    need = severity_rank(exp.required or "orange")
    hits = [a for a in own_alerts if severity_rank(a.severity) >= need]
    if hits:
        v.caught = Hit.of(hits[0])
        v.delay = hits[0].step - onset
    v.false_alarms = [Hit.of(a) for a in firing if severity_rank(a.severity) >= 2 and before_onset(a)]
    v.wrong_brakes = [Hit.of(a) for a in firing if _brakes(a) and before_onset(a)]
    if not hits:
        if own_alerts:
            v.problems.append(f"{'/'.join(exp.own)} reached only {v.reached} (needs {exp.required}) "
                              f"within {end - onset} steps of the onset")
        else:
            v.problems.append(f"not caught by {'/'.join(exp.own)} within {end - onset} steps of the "
                              f"onset" + _why_silent(v))
    if v.wrong_brakes:
        v.problems.append("braked before the onset: " + ", ".join(map(str, v.wrong_brakes[:5])))
    if v.false_alarms:
        v.problems.append(("orange+ before the onset: " if label.onset_exact else
                           "orange+ before the reader's onset (reported; a recorded run may have a "
                           "second, unlabelled problem): ") + ", ".join(map(str, v.false_alarms[:5])))
    v.passed = bool(hits) and not v.wrong_brakes and (not v.false_alarms or not label.onset_exact)
    return v


def _why_silent(v: Verdict) -> str:
    why = []
    for r in v.own:
        if r in v.own_missing:
            why.append(f"{r}: not in the pack")
        elif r in v.own_unwatched:
            why.append(f"{r}: none of its inputs logged")
    return f" ({'; '.join(why)})" if why else ""


# -- scores -----------------------------------------------------------------------------------

@dataclass
class Score:
    scored: int = 0
    passed: int = 0
    healthy: int = 0
    quiet: int = 0
    faults: int = 0
    caught: int = 0
    notify: int = 0
    notified: int = 0
    alarmed_runs: int = 0         # runs with orange+ where it must not be
    wrong_brakes: int = 0         # brakes on healthy runs / before an onset / on notify-only runs
    healthy_steps: int = 0
    healthy_yellow: int = 0
    unscored: int = 0
    delays: list[int] = field(default_factory=list)

    @property
    def yellow_per_1k(self) -> float:
        return 1000.0 * self.healthy_yellow / self.healthy_steps if self.healthy_steps else 0.0

    @property
    def recall(self) -> float:
        return self.caught / self.faults if self.faults else float("nan")

    def line(self, what: str = "runs") -> str:
        parts = [f"{self.passed}/{self.scored} {what} pass"]
        if self.healthy:
            parts.append(f"healthy quiet {self.quiet}/{self.healthy}")
        if self.faults:
            med = f", median delay {statistics.median(self.delays):.0f}" if self.delays else ""
            parts.append(f"faults caught {self.caught}/{self.faults}{med}")
        if self.notify:
            parts.append(f"notify-only right {self.notified}/{self.notify}")
        parts.append(f"{self.alarmed_runs} runs with orange+ on healthy or before the onset")
        parts.append(f"{self.wrong_brakes} wrong brakes")
        if self.healthy_steps:
            parts.append(f"{self.yellow_per_1k:.2f} yellow per 1,000 healthy steps")
        if self.unscored:
            parts.append(f"{self.unscored} unscored")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("delays")
        d["yellow_per_1k"] = round(self.yellow_per_1k, 3)
        d["recall"] = None if math.isnan(self.recall) else round(self.recall, 4)
        d["median_delay"] = statistics.median(self.delays) if self.delays else None
        return d


def score(verdicts: Iterable[Verdict]) -> Score:
    s = Score()
    for v in verdicts:
        if v.kind == "quiet":
            s.healthy_steps += v.steps
            s.healthy_yellow += v.yellow
        if v.passed is None:
            s.unscored += 1
            continue
        s.scored += 1
        s.passed += bool(v.passed)
        s.alarmed_runs += bool(v.false_alarms)
        s.wrong_brakes += len(v.wrong_brakes)
        if v.kind == "quiet":
            s.healthy += 1
            s.quiet += bool(v.passed)
        elif v.kind == "notify":
            s.notify += 1
            s.notified += bool(v.passed)
        else:
            s.faults += 1
            s.caught += v.caught is not None
            if v.caught is not None and v.delay is not None:
                s.delays.append(v.delay)
    return s


# -- recorded runs ----------------------------------------------------------------------------

def load_labels(directory: str | Path, sources: dict[str, str] | None = None) -> list[Label]:
    """The labels of ``directory/labels.json`` (sorted by file name). ``sources``: file name ->
    source, for leave-one-source-out (an entry's own ``"source"`` field is used otherwise)."""
    path = Path(directory) / "labels.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no labels.json beside the logs (see rlwatch backtest --help)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of file name -> label")
    out = []
    for name, entry in sorted(data.items()):
        if not isinstance(entry, dict) or "label" not in entry:
            raise ValueError(f"{path}: entry {name!r} needs a 'label'")
        src = (sources or {}).get(name, entry.get("source"))
        md = entry.get("max_delay")
        out.append(Label(name, str(entry["label"]), entry.get("onset"),
                         int(md) if md is not None else None, entry.get("preset"), src))
    return out


@dataclass
class Replayed:
    label: Label
    alerts: list[Alert]
    span: Span
    preset: str | None
    watched: list[str]
    pack_rules: list[str]
    events: int
    rejected: int


def replay_labelled(directory: str | Path, label: Label, pack, *, tuned=None) -> Replayed:
    """Replay one labelled file with its preset (found from its names when the label has none
    or names one this version does not know) through ``pack`` (+ ``tuned`` overrides: a pack, or
    a mapping preset name -> pack whose overrides apply to that preset's runs only)."""
    from contract.presets import get_preset
    from rlwatch.replay import replay
    from rules.loader import merge_packs, with_preset

    try:
        preset = get_preset(label.preset)
    except ValueError:
        preset = None
    if tuned is not None:
        extra = tuned.get(label.preset) if isinstance(tuned, dict) else tuned
        if extra is not None:
            pack = merge_packs(pack, extra)
    if preset is not None:
        res = replay([Path(directory) / label.run], with_preset(pack, preset), preset)
    else:
        res = replay([Path(directory) / label.run], pack)
    cov = next(iter(res.runs.values()), None)
    if cov is None or cov.first_step is None:
        span = Span(0, 0, 0)
    else:
        span = Span(cov.first_step, cov.last_step, cov.steps_logged)
    return Replayed(label, res.alerts, span, cov.preset if cov else None,
                    list(cov.watched) if cov else [], [r.id for r in pack.rules], res.events,
                    len(res.rejected))


@dataclass
class RealReport:
    verdicts: list[Verdict]
    score: Score
    by_source: dict[str, Score]

    def to_dict(self) -> dict:
        return {"score": self.score.to_dict(), "line": self.score.line("files"),
                "by_source": {k: s.to_dict() for k, s in self.by_source.items()},
                "runs": [v.to_dict() for v in self.verdicts]}


def as_pack(pack):
    from rules.loader import load_pack

    return load_pack(pack) if isinstance(pack, (str, Path)) else pack


def score_real(directory: str | Path, pack="rlhf", *, labels: list[Label] | None = None,
               sources: dict[str, str] | None = None, tuned=None,
               progress: Callable[[Verdict], None] | None = None) -> RealReport:
    """Every labelled file of ``directory`` replayed and judged by its own rule(s)."""
    pack = as_pack(pack)
    labels = labels if labels is not None else load_labels(directory, sources)
    verdicts = []
    for lab in labels:
        r = replay_labelled(directory, lab, pack, tuned=tuned)
        v = judge(lab, r.alerts, r.span, pack_rules=r.pack_rules, watched=r.watched)
        v.extra.update(preset=r.preset, events=r.events, rejected=r.rejected, watched=len(r.watched))
        verdicts.append(v)
        if progress is not None:
            progress(v)
    by_source: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_source.setdefault(v.source or "-", []).append(v)
    return RealReport(verdicts, score(verdicts), {k: score(vs) for k, vs in sorted(by_source.items())})


#: The ways :func:`vary_real` re-logs a recorded run, as another run of its family would log it.
REAL_VARIANTS = ("every", "every_shifted", "steps", "reward_scale", "reward_offset", "resume")
#: the variants whose number is a whole count (of logged steps, or a factor on step numbers)
_WHOLE_VARIANTS = ("every", "every_shifted", "steps")


def parse_variant(spec: str) -> tuple[str, float]:
    """``"every=2"`` -> ("every", 2.0); a malformed spec raises ValueError naming the choices."""
    name, sep, value = spec.partition("=")
    try:
        number = float(value)
    except ValueError:
        sep = ""
    if not sep or name not in REAL_VARIANTS:
        raise ValueError(f"real-log variant {spec!r}: expected NAME=NUMBER, NAME one of "
                         f"{', '.join(REAL_VARIANTS)} (every=2, steps=2, reward_scale=10, reward_offset=-1)")
    if name in _WHOLE_VARIANTS and (number < 1 or number != int(number)):
        raise ValueError(f"real-log variant {spec!r}: {name} takes a whole number >= 1")
    if name == "reward_scale" and number == 0:
        raise ValueError(f"real-log variant {spec!r}: a scale of 0 leaves no reward")
    if name == "resume" and not 0 < number < 1:
        raise ValueError(f"real-log variant {spec!r}: resume takes the share of the run before "
                         "the resume point, over 0 and under 1 (resume=0.3)")
    return name, number


def vary_real(directory: str | Path, labels: list[Label], variant: tuple[str, float],
              out: str | Path) -> list[Label]:
    """Each labelled file of ``directory`` re-logged into ``out`` as another run of its family
    would log it, and the labels that go with the copies:

    * ``every=K``: only every K-th logged step kept (a run logging less often), from the first;
    * ``every_shifted=K``: the same from the second logged step (the run logging at the other
      steps: a baseline, a spike, a dry spell then fall on other points);
    * ``steps=K``: step numbers K times larger (the same curve over K times the steps, as a run
      with smaller batches logs it; onsets and windows scale with it);
    * ``reward_scale=K``, ``reward_offset=B``: the optimised reward as another reward model
      gives it, ``K * r + B`` (:func:`reward_as`; a judge's score is left as it is);
    * ``resume=F``: only the logged steps from the share F of the run on (a run first watched
      part way through, its warm-up baselines from the middle of the training). A fault that
      began before that point is unscored: the copy holds no step before it.

    The copies hold the preset's canonical names (a preset renames them to themselves)."""
    from contract.presets import get_preset

    name, value = variant
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    k = int(value) if name in _WHOLE_VARIANTS else 1
    phase = 1 if name == "every_shifted" else 0
    new_labels = []
    for lab in labels:
        try:
            preset = get_preset(lab.preset)
        except ValueError:
            preset = None
        cut = _resume_step(Path(directory) / lab.run, value) if name == "resume" else None
        lines = []
        seen: dict[Any, int] = {}
        names: set[str] = set()           # metric names of the whole file
        kept_names: set[str] = set()      # and of the kept lines
        kept_steps: set[Any] = set()
        for line in (Path(directory) / lab.run).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            raw = json.loads(line)
            if isinstance(raw.get("metrics"), dict) and preset is not None:
                raw["metrics"] = preset.map_metrics(raw["metrics"])
            step = raw.get("step")
            if name in ("every", "every_shifted"):
                metrics = raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {}
                names.update(metrics)
                nth = seen.setdefault(step, len(seen))
                if (nth - phase) % k:
                    continue
                kept_names.update(metrics)
                kept_steps.add(step)
            elif name == "steps" and _is_step(step):
                raw["step"] = step * k
            elif name == "reward_scale":
                raw = reward_as(raw, value, 0.0)
            elif name == "reward_offset":
                raw = reward_as(raw, 1.0, value)
            elif name == "resume" and _is_step(step) and step < cut:
                continue
            lines.append(json.dumps(raw))
        (out / lab.run).write_text("\n".join(lines) + "\n", encoding="utf-8")
        if name == "steps":
            lab = replace(lab, onset=None if lab.onset is None else lab.onset * k,
                          max_delay=None if lab.max_delay is None else lab.max_delay * k,
                          step_scale=lab.step_scale * k)
        if name in ("every", "every_shifted"):
            # a run that logs some metrics every N steps loses them all when the kept steps
            # miss that grid; a one-step event is gone with its step: nothing left to judge
            lab = replace(lab, lost=tuple(sorted(names - kept_names)))
            if (lab.label in NOTIFY_ONLY and lab.label not in RECURRING and lab.onset is not None
                    and lab.onset not in kept_steps):
                lab = replace(lab, unseen=f"the re-logged copy does not keep step {lab.onset}, "
                                          "the one-step event: nothing to notice")
        if name == "resume" and lab.onset is not None and lab.onset < cut:
            lab = replace(lab, unseen=f"the fault began at step {lab.onset}, before the resume "
                                      f"point (step {cut}): the copy holds no step before it")
        new_labels.append(lab)
    return new_labels


def _is_step(step: Any) -> bool:
    return isinstance(step, int) and not isinstance(step, bool)


def _resume_step(path: Path, share: float) -> int:
    """The first logged step at or after the share ``share`` of the run's logged steps."""
    steps = sorted({raw["step"] for raw in map(json.loads, filter(
        str.strip, path.read_text(encoding="utf-8").splitlines())) if _is_step(raw.get("step"))})
    return steps[min(len(steps) - 1, int(share * len(steps)))] if steps else 0


def score_variant(directory: str | Path, labels: list[Label], spec: str, pack="rlhf") -> RealReport:
    """The labelled files of ``directory`` re-logged as ``spec`` says (:func:`parse_variant`,
    :func:`vary_real`) in a temporary directory, and scored there."""
    import tempfile

    variant = parse_variant(spec)
    with tempfile.TemporaryDirectory(prefix="rlwatch-variant-") as tmp:
        return score_real(tmp, pack, labels=vary_real(directory, labels, variant, tmp))


# -- simulated runs ---------------------------------------------------------------------------

#: Seeds below this were (or may be) used to tune the pack; held-out runs use seeds above it.
HELDOUT_SEEDS_FROM = 1000
#: Steps after a simulated onset a fault must be caught within (every fault alike).
SIM_WINDOW = 300
#: Length of a healthy simulated run.
HEALTHY_STEPS = 1500


@dataclass(frozen=True)
class SimCase:
    fault: str                        # a catalog id, "healthy", or "nan_inf:skipped_step"
    algo: str = "ppo"
    seed: int = HELDOUT_SEEDS_FROM
    log_every: int = 1
    magnitude: float | None = None    # position in the fault's range, 0 mild .. 1 strong; None: drawn
    healthy_variant: str | None = "random"
    steps: int | None = None          # None: onset + SIM_WINDOW + 1 (healthy: HEALTHY_STEPS)
    window: int = SIM_WINDOW
    reward_scale: float = 1.0         # the reward as another reward model would give it:
    reward_offset: float = 0.0        # scale * reward + offset (:func:`reward_as`)
    metric_scales: tuple = ()         # ((metric prefix, factor), ...): :func:`scaled_metrics`
    metric_noise: tuple = ()          # ((metric prefix, relative sd), ...): :func:`noisy_metrics`
    step_scale: float = 1             # step numbers x K, as a run counting smaller steps logs
                                      # them (onset and window x K too); K < 1: a faster run
                                      # (0.5: every other step kept, its number halved)
    resume: float = 0.0               # the share of the run before it is first watched (its
                                      # warm-up mid-training)
    relaunch: float = 0.0             # the share of the run after which it is relaunched (a new
                                      # incarnation from that step on, as a run preempted and
                                      # resumed from a checkpoint of its last step; watched before)

    @property
    def run_id(self) -> str:
        return f"sim-{self.fault.replace(':', '-')}-{self.algo}-s{self.seed}-e{self.log_every}"


def _sim_api():
    from producers import sim

    fields = set(getattr(sim.SimConfig, "__dataclass_fields__", {}))
    return sim, fields


def _sim_config(case: SimCase):
    sim, fields = _sim_api()
    fault = case.fault.split(":")[0]
    kw: dict[str, Any] = dict(run_id=case.run_id, fault=fault, seed=case.seed)
    algo = case.algo
    if hasattr(sim, "effective_algo"):
        algo = sim.effective_algo(case.algo, fault)
    kw["algo"] = algo
    if fault in ("rank_outlier", "param_hash_mismatch"):
        kw["world_size"] = 4
    if case.fault == "nan_inf:skipped_step":
        kw["fault_params"] = {"where": "grad_norm"}
    if "magnitude" in fields:
        kw["magnitude"] = case.magnitude
    if "log_every" in fields:
        kw["log_every"] = case.log_every
    if "healthy_variant" in fields:
        kw["healthy_variant"] = case.healthy_variant
    if "onset" in fields and getattr(sim.SimConfig.__dataclass_fields__["onset"], "default", None) is None:
        kw["onset"] = None            # drawn by the seed
    return sim, sim.SimConfig(**kw), fields


def reward_as(raw: dict, scale: float, offset: float) -> dict:
    """A simulated event with its reward given by another reward model: ``scale * r + offset``
    for the mean reward (its groups, the per-sample rewards and their distribution too), its
    spread scaled. A reward model's zero and unit are arbitrary (a Bradley-Terry model's scores
    shift freely), so a rule should judge a run alike under any of them."""
    def aff(v):
        return scale * v + offset if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    m = raw.get("metrics")
    if m:
        m = dict(m)
        if "reward/mean" in m:
            m["reward/mean"] = aff(m["reward/mean"])
        if isinstance(m.get("reward/std"), (int, float)):
            m["reward/std"] = abs(scale) * m["reward/std"]
        raw = {**raw, "metrics": m}
    g = (raw.get("groups") or {}).get("reward/mean")
    if g:
        raw = {**raw, "groups": {**raw["groups"], "reward/mean": {k: aff(v) for k, v in g.items()}}}
    d = (raw.get("dists") or {}).get("reward")
    if d is not None:
        raw = {**raw, "dists": {**raw["dists"], "reward": [aff(v) for v in d]}}
    if raw.get("samples"):
        raw = {**raw, "samples": [{**x, "reward": aff(x["reward"])} if "reward" in x else x
                                  for x in raw["samples"]]}
    return raw


#: the per-sample array that follows a metric family when it is scaled
_DIST_OF = {"response/length": "response_length"}


def scaled_metrics(raw: dict, scales) -> dict:
    """A simulated event as a run of another size would log it: each metric whose name starts
    with one of ``scales``' prefixes multiplied by its factor (``entropy/`` x 3: another
    vocabulary; ``grad_norm/`` x 10: another model; ``response/length`` x 4: a task with longer
    answers, its per-sample lengths too). A rule should read such a run alike."""
    m = raw.get("metrics")
    if m:
        m = dict(m)
        for k, v in m.items():
            for prefix, factor in scales:
                if k.startswith(prefix) and isinstance(v, (int, float)) and not isinstance(v, bool):
                    m[k] = v * factor
        raw = {**raw, "metrics": m}
    dists = raw.get("dists")
    for prefix, factor in scales:
        name = _DIST_OF.get(prefix)
        if dists and name in dists:
            dists = {**dists, name: [x * factor for x in dists[name]]}
            raw = {**raw, "dists": dists}
    return raw


#: How much public runs scatter from one logged point to the next: per metric family, about
#: the median over the real logs of the robust scale of the point-to-point changes over the
#: level (``bench/backtest.py --noise-profile real``). The simulator scatters a tenth to a fifth
#: of that (entropy 1 %, reward std 4 %, gradient norm 13 %); public GRPO and PPO runs scatter
#: entropy 6-34 %, reward std 22-100 %, KL 13-62 %, gradient norm 36-180 %, clip fraction
#: 22-52 %, response length 4-36 %. Non-negative families scatter log-normally (a gradient
#: norm is never negative, and its spikes are upward); the reward's mean normally.
REAL_NOISE: tuple = (
    ("reward/mean", 0.1), ("reward/std", 0.35, "log"), ("entropy/mean", 0.15, "log"),
    ("kl/mean", 0.3, "log"), ("kl/ppo", 0.4, "log"), ("grad_norm/", 0.7, "log"),
    ("response/length_mean", 0.1, "log"), ("ppo/clip_frac", 0.3, "log"),
    ("loss/value", 0.1, "log"),
)

#: named noise profiles for ``--noise-profile``
NOISE_PROFILES = {"real": REAL_NOISE}


def noisy_metrics(raw: dict, noise) -> dict:
    """A simulated event as a noisier run logs it (smaller batches, fewer tokens per step):
    each metric whose name starts with one of ``noise``' prefixes multiplied by ``1 + sd * g``,
    ``g`` a standard normal drawn from the event's run, rank and step (the same case gives the
    same numbers in any process). An entry ``(prefix, sd, "log")`` scatters log-normally
    instead, by ``exp(s * g - s^2 / 2)`` with the same relative SD: the value keeps its sign
    (a fraction stays at most 1)."""
    m = raw.get("metrics")
    if not m:
        return raw
    rng = random.Random(f"{raw.get('run_id')}|{raw.get('rank', 0)}|{raw.get('step')}")
    m = dict(m)
    for k, v in m.items():
        for prefix, sd, *how in noise:
            if k.startswith(prefix) and isinstance(v, (int, float)) and not isinstance(v, bool):
                g = rng.gauss(0.0, 1.0)
                if how and how[0] == "log":
                    s = math.sqrt(math.log1p(sd * sd))
                    v = v * math.exp(s * g - 0.5 * s * s)
                    m[k] = min(v, 1.0) if k.endswith("_frac") else v
                else:
                    m[k] = v * (1.0 + sd * g)
    return {**raw, "metrics": m}


def run_sim(case: SimCase, pack) -> tuple[Label, list[Alert], Span, dict]:
    """Simulate ``case`` and feed it through a Pipeline of ``pack``; (label, alerts, span, info)."""
    from contract.events import parse_event
    from streams.processor import Pipeline

    pack = as_pack(pack)
    sim, cfg, fields = _sim_config(case)
    info: dict[str, Any] = {"algo": cfg.algo, "log_every": case.log_every, "seed": case.seed,
                            "magnitude": None, "magnitude_drawn": "magnitude" in fields}
    onset = getattr(cfg, "onset", None)
    if hasattr(sim, "Simulator"):
        s = sim.Simulator(cfg)
        onset = getattr(s, "onset", onset)
        info["magnitude"] = getattr(s, "magnitude", case.magnitude)
        info["size"] = getattr(s, "size", None)
        info["healthy_features"] = list(getattr(s, "healthy_features", ()))
    healthy = case.fault == "healthy"
    steps = case.steps or (HEALTHY_STEPS if healthy else int(onset) + case.window + 1)
    subsample = "log_every" not in fields and case.log_every > 1
    cut = int(case.resume * steps)      # simulated steps before it are never seen
    again = int(case.relaunch * steps)  # from this simulated step on, a new incarnation
    pipeline = Pipeline(pack)
    alerts: list[Alert] = []
    first = last = None
    logged, last_ts = 0, 0.0
    # skipped steps land anywhere: the event to notice is the first one a logged point carries
    skipped = case.fault == "nan_inf:skipped_step"
    seen_at = None
    for raw in sim.simulate(cfg, steps):
        if subsample and raw.get("kind") in ("step", "samples") and raw["step"] % case.log_every:
            continue
        if cut and raw.get("step", cut) < cut:
            continue
        if again:
            raw = {**raw, "incarnation": "a" if raw.get("step", 0) < again else "b"}
        if case.reward_scale != 1.0 or case.reward_offset != 0.0:
            raw = reward_as(raw, case.reward_scale, case.reward_offset)
        if case.metric_scales:
            raw = scaled_metrics(raw, case.metric_scales)
        if case.metric_noise:
            raw = noisy_metrics(raw, case.metric_noise)
        if case.step_scale != 1 and "step" in raw:
            scaled = raw["step"] * case.step_scale
            if scaled != int(scaled):
                continue                # (between two steps of the faster run)
            raw = {**raw, "step": int(scaled)}
        ev = parse_event(raw, raw["ts"])
        last_ts = max(last_ts, ev.ts or 0.0)
        if ev.kind == "step" and ev.rank == 0:
            logged += 1
            first = ev.step if first is None else first
            last = ev.step
        if skipped and seen_at is None and raw.get("kind") == "step" and _non_finite(raw):
            seen_at = raw["step"]
        alerts += pipeline.feed(ev, ev.ts)
    if case.fault == "run_stalled":
        alerts += pipeline.tick(last_ts + 600)
    k = case.step_scale
    label = Label(case.run_id, "healthy" if healthy else case.fault,
                  None if healthy else int(int(onset) * k), None if healthy else int(case.window * k),
                  source=f"sim-{info['algo']}", onset_exact=True)
    if cut and not healthy and int(onset) < cut:
        label = replace(label, unseen=f"the fault began at step {int(int(onset) * k)}, before "
                                      f"the run was first watched (step {int(cut * k)})")
    elif skipped:
        end = int(int(onset) * k + case.window * k)
        if seen_at is None or seen_at > end:
            label = replace(label, unseen=f"no logged point carries a skipped step within "
                                          f"{int(case.window * k)} steps of the onset: nothing to notice")
        else:
            label = replace(label, onset=seen_at, max_delay=end - seen_at)
    span = Span(first or 0, last or 0, logged)
    return label, alerts, span, info


def _non_finite(raw: dict) -> bool:
    return any(isinstance(v, float) and not math.isfinite(v) for v in (raw.get("metrics") or {}).values())


@dataclass
class SimReport:
    verdicts: list[Verdict]
    score: Score

    def to_dict(self) -> dict:
        return {"score": self.score.to_dict(), "line": self.score.line("simulated runs"),
                "delay_vs_magnitude": delay_table(self.verdicts),
                "runs": [v.to_dict() for v in self.verdicts]}


def _judge_case(args) -> Verdict:
    case, pack = args
    pack = as_pack(pack)
    label, alerts, span, info = run_sim(case, pack)
    v = judge(label, alerts, span, pack_rules=[r.id for r in pack.rules])
    v.extra.update(info)
    return v


def score_sim(cases: Iterable[SimCase], pack="rlhf", *, jobs: int = 1,
              progress: Callable[[Verdict], None] | None = None) -> SimReport:
    """Every case simulated, fed through ``pack`` and judged. ``jobs`` > 1 runs cases in worker
    processes (``pack`` is then passed by name or path, or pickled)."""
    cases = list(cases)
    verdicts: list[Verdict] = []
    if jobs > 1 and len(cases) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for v in ex.map(_judge_case, [(c, pack) for c in cases]):
                verdicts.append(v)
                if progress is not None:
                    progress(v)
    else:
        p = as_pack(pack)
        for c in cases:
            v = _judge_case((c, p))
            verdicts.append(v)
            if progress is not None:
                progress(v)
    return SimReport(verdicts, score(verdicts))


MAGNITUDE_BINS = ((0.0, 1 / 3, "mild"), (1 / 3, 2 / 3, "middle"), (2 / 3, 1.0001, "strong"))


def delay_table(verdicts: Iterable[Verdict]) -> list[dict]:
    """Detection delay against fault magnitude: per magnitude bin and logging interval, the
    faults caught, and the median and 90th percentile of the delay in steps. Faults without a
    magnitude range (all-or-nothing) form their own row ("not drawn": a simulator without
    magnitudes)."""
    rows: dict[tuple[str, int], list[Verdict]] = {}
    for v in verdicts:
        if v.kind != "catch":
            continue
        m = v.extra.get("magnitude")
        if m is None:
            name = "all-or-nothing" if v.extra.get("magnitude_drawn", True) else "not drawn"
        else:
            name = next(n for lo, hi, n in MAGNITUDE_BINS if lo <= m < hi)
        rows.setdefault((name, int(v.extra.get("log_every", v.interval))), []).append(v)
    order = {n: i for i, (_, _, n) in enumerate(MAGNITUDE_BINS)}
    out = []
    for (name, every), vs in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
        d = sorted(v.delay for v in vs if v.caught is not None and v.delay is not None)
        out.append({"magnitude": name, "log_every": every, "runs": len(vs),
                    "caught": sum(v.caught is not None for v in vs),
                    "median_delay": statistics.median(d) if d else None,
                    "p90_delay": d[min(len(d) - 1, int(0.9 * len(d)))] if d else None})
    return out


# -- text ---------------------------------------------------------------------------------------

def verdict_row(v: Verdict) -> str:
    mark = {True: "PASS", False: "FAIL", None: "  - "}[v.passed]
    if v.kind == "quiet":
        what = f"quiet; yellow {v.yellow_per_1k:.1f}/1k steps"
    elif v.kind == "unscored":
        what = "unscored"
    else:
        own = "/".join(v.own)
        if v.caught is not None:
            what = f"{v.caught.rule} {v.caught.severity} delay {v.delay:+d}"
        else:
            what = f"{own} " + (f"only {v.reached}" if v.reached else "silent")
    extra = []
    if v.false_alarms:
        extra.append("alarms: " + ", ".join(map(str, v.false_alarms[:3])))
    if v.brakes:
        extra.append("brakes: " + ", ".join(map(str, v.brakes[:3])))
    return (f"{mark} {v.run[:44]:44s} {v.label[:32]:32s} {str(v.onset if v.onset is not None else '-'):>5s} "
            f"{what:44s} {'; '.join(extra)}")


def table(verdicts: Iterable[Verdict]) -> str:
    head = f"{'':4s} {'run':44s} {'label':32s} {'onset':>5s} {'verdict':44s} alarms / brakes"
    return "\n".join([head] + [verdict_row(v) for v in verdicts])


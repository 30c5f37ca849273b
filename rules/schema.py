"""The rule language: pydantic models of a rule file (YAML). Pure.

A rule file (a *pack*) looks like::

    pack: rlhf
    diagnoses: diagnoses.yaml          # optional: titles, summaries, diagnoses by rule id
    targets: {kl: 0.05}                # per-run targets, overridable per run
    rules:
      - id: kl_above_target
        params: {yellow: 1.5, red: 2.5, cap: 0.2}
        summary: "KL {value:.3g} above {threshold:.3g}"
        tiers:
          - severity: yellow
            when: {metric: kl/mean, above: {target: kl, factor: yellow}}
            for: 5                     # held over 5 training steps
            actions: [notify, {adjust: {beta: 1.5}, at_most: 2}]   # x2.25 at most, then a person
          - severity: black
            when: {metric: kl/mean, signal: median, window: 3, above: cap}
            actions: [stop, rollback, snapshot]
    overrides:
      - runs: "ppo-8b-*"               # glob on run_id
        targets: {kl: 0.03}
        disable: [stagnation]
        params: {kl_above_target: {cap: 0.5}}

Thresholds (``above``, ``below``, ``abs_above``, ``cap``) are a number, the name of one of the
rule's ``params`` (``above: cap``), or ``{target: NAME, factor: F}`` / ``{param: NAME, factor:
F}`` where ``F`` is a number or a parameter name. A name that is not a parameter of the rule is
an error; so is an unknown key anywhere, an override of an unknown rule or parameter. Write
numbers with a dot (``1.0e-6``): YAML reads ``1e-6`` as text, which then names no parameter.

**Steps, not entries.** Every count of the language is in training steps, whatever the
logging interval of the run:

* ``window: W`` -- a rolling window holds the points whose step is within the last W steps
  (``step > now - W``), and never fewer than the points its signal needs to mean anything
  (:data:`MIN_POINTS`: 3 for a median, 8 for a range -- exactly constant means nothing over
  two points --, 16 for a trend, 20 for a z-score). On a run logging
  every step that is exactly the last W values; on a run logging every 10 steps a 50-step trend
  reads the last 16 points (160 steps) instead of 5, too few for a trend test. A signal is
  undefined until it has :data:`READY_POINTS` points (3 for a trend, 3 for a median: the median
  of one point is that point and of two their mean, no level that held).
* ``for: N`` -- the condition held at every logged point from its onset (the step of the first
  true point) over at least N training steps: ``step - onset_step + 1 >= N``. Logged every
  step, ``for: 5`` fires on the 5th true point; logged every 10 steps, on the 2nd consecutive
  true point (11 steps). ``for: 1`` fires at once. ``for_points: P`` asks besides that the
  condition held at P logged points in a row: a brake that must not follow a transient
  (``for: 3, for_points: 3``) then needs three true points however sparsely the run logs.
* ``for: N`` on an ``all``/``any`` branch of a tier's ``when`` -- that branch counts as true
  only once it has held at every logged point over N steps, counted the same way; the tier's
  own ``for`` then counts from there. Branches whose evidence comes at different speeds get
  holds of their own: a branch that must fire within a short run's first 50 steps, beside one
  whose signal flickers across its line on healthy runs for 10 to 15 steps at a time. A held
  branch, and every branch around it, is read at every evaluation of its tier (no
  short-circuit), so that its count sees every point; its count is part of the run's state.
* ``keep_firing_for: N`` -- a firing alert resolves once its condition has been false for more
  than N steps since the first false point; ``escalate_after: N`` -- N steps after firing.
* ``keep_firing_while: CONDITION`` -- a firing alert does not resolve while this condition
  holds, though its own is false (a recovery threshold): a crash alert whose change point has
  left the window stays firing while the reward is still down (``keep_firing_for`` counts from
  the first step at which neither holds). It reads the step's metrics (metric, dist, corr and
  groups tests) and opens no alert; undecided, it keeps nothing.
* ``{adjust: {beta: 1.5}, at_most: 2, when: CONDITION}`` -- an action asking the run's
  ``on_adjust`` to multiply its hyperparameters. ``at_most: N``: a run is sent it N times
  (an escalation counts; the count starts again after a rollback or a relaunch), and a firing
  after that says it was not sent again, since the factors compound. ``when``: sent only if
  this holds as the alert fires (it reads the step's metrics): a tier whose branches call for
  different remedies adjusts for the one that holds.
* ``min_steps: N`` -- a warm-up: the condition is undecided until the metric has been logged
  across N steps (``step - first_step + 1 >= N``) and at least ``min(N, 5)`` points.
  ``after_warmup_of: lr/actor`` counts the N steps from the end of that metric's warm-up as
  well: the last step at which it rose above its high (by more than a millionth of it). A
  learning rate that rises over its first 200 steps ends its warm-up at step 200; a constant
  or decaying one has none, nor has a run that does not log it: those are judged from the
  metric's first step, as without the option. ``after_warmup_steps: M`` counts M steps from
  the warm-up's end instead of N (``min_steps: 100, after_warmup_of: lr/actor,
  after_warmup_steps: 20``: 100 steps into the run and 20 past the warm-up).
* ``smooth: N`` and ``signal: ema`` with ``window: N`` -- an EMA with a span of N steps; a gap of
  k steps between two points decays the average as k single steps would, but never below the
  decay of an EMA of N/20 points: a run logged more than 20 steps apart (its step numbers count
  samples) is still averaged over its last points, not read at its last one alone.
* baselines (``start``, ``ratio_to_start``, ``start_z``, ``gain_t``, ``noise_ratio``) -- the points of the
  run's first ``window`` steps, but at least 3 of them: the run's own warm-up.
* change points (``shift_z``, ``level_ratio``, ``shift_rel``, ``over_max_z``, ``shift_dz``,
  ``jump_dz``, ``shift_gain``, ``drawdown_gain``, ``level_to_max``, ``range_pos``) -- the *level* is the median of the points of
  the last 5 steps (at least 3 points), so one outlying point never moves it; it is compared with
  the window's earlier points (at least 12 of them), in their robust scale (1.4826 x MAD, never
  below 1.2533 x the mean absolute deviation, so mostly-constant data does not make every change
  infinite, nor below the smallest deviation that is not 0: data on a lattice, a reward that
  moves in quarters, is not read finer than its resolution). ``shift_gain`` measures the change in what the run moved since its first 20 steps
  (at least 3 points): prefer it to ``shift_rel`` and ``level_ratio`` for a reward, whose zero a
  reward model sets arbitrarily. ``drawdown_gain`` measures the level against the best of the
  window's earlier levels (medians of 3 points in a row) in the same unit. A metric first logged
  after step 40 was first watched mid-training (a run resumed, or a monitor attached late): its
  first 20 steps are a plateau, not its start, and the unit of these gain signals (and
  ``trend_gain``'s) is then at least half that plateau's level.
* two metrics: ``{metric: reward/mean, signal: follow_z, versus: judge/score, window: 100}``.

A condition (``when``) is one of:

* a metric test: ``{metric, signal?, window?, smooth?, above?|below?|abs_above?, min_steps?}``;
* ``{nonfinite: any}`` or ``{nonfinite: [metric, ...]}``;
* across ranks: ``{ranks: METRIC, stat: max_over_median, above: 3}`` (also ``max``, ``median``,
  and ``held_over_median``: a rank's ratio to the ranks' median at two of its last three
  logged steps, so the same rank, not whichever is highest at each step);
  ``{hashes: actor, mismatch: true}``;
* a per-sample distribution of the step: ``{dist: reward, stat: bimodality, above: 0.6}``;
  ``tail_mass`` is the share above ``cap``, ``tail_over_median`` the share above ``cap`` times
  the step's median (a tail in the batch's own unit, for positive values such as lengths);
* a correlation of two per-sample arrays: ``{corr: [reward, response_length], window: 20, above: 0.5}``;
* per-category groups: ``{groups: reward/mean, stat: gap_slope, above: 0}``; the slopes
  per step (``min_slope``, ``max_slope``, ``gap_slope``, ``spread_slope``), or the same with
  ``_z`` (``max_slope_z``): the move over ``window`` steps in the categories' own noise (the
  sigma of their scatter around their trends), which reads alike whatever the reward's unit;
* samples: ``{samples: token_kl_argmax, stat: top_share, above: 0.5}``;
* silence: ``{stalled_seconds: 300}`` (or a parameter name);
* composites: ``{all: [...]}``, ``{any: [...]}``, ``{not: {...}}``.

A condition is undecided (neither true nor false) at a step where its metric was not logged or
its signal is not defined yet; undecided changes no alert state.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

__all__ = [
    "ACTIONS",
    "Condition",
    "MIN_POINTS",
    "Override",
    "READY_POINTS",
    "Pack",
    "Rule",
    "SIGNALS",
    "Threshold",
    "Tier",
    "leaves",
]

ACTIONS = ("notify", "adjust", "snapshot", "pause", "stop", "rollback")

#: signal -> what it is. Windows are in steps (see the module doc).
SIGNALS = {
    "value": "the metric itself",
    "ema": "bias-corrected EMA with a span of `window` steps",
    "mean": "rolling mean over the window",
    "std": "rolling standard deviation over the window",
    "median": "rolling median over the window",
    "min": "rolling minimum over the window",
    "max": "rolling maximum over the window",
    "range": "rolling maximum - minimum over the window (exactly 0 for a constant)",
    "zscore": "newest value against the mean and std of the window before it",
    "robust_z": "newest value against the median and MAD of the window before it",
    "ratio_to_median": "newest value / median of the window before it",
    "ratio_to_start": "current level (median of the last few points) / median of the run's first `window` steps",
    "rel_drop": "fraction below the window's peak",
    "rel_rise": "fraction above the window's trough",
    "trend_z": "Mann-Kendall z over the window (> 0 rising)",
    "trend_tau": "Kendall's tau of value against step over the window",
    "slope": "least-squares slope per step over the window",
    "flat_range": "(max - min) / |mean| over the window",
    "autocorr": "strength of the dominant autocorrelation lag over the window",
    "sign_flip_rate": "share of point-to-point changes that flip sign",
    "diff_ratio": "std of point-to-point changes / std of the values over the window",
    "delta": "newest value minus the previous point",
    "cycle_rise": "rise since the start of the update cycle (see cycle_metric), or the last ended cycle's rise over a whole cycle when larger (carried to every epoch of a cycle when the run logs only some)",
    "rel_trend": "least-squares slope x window / |median|: relative change across the window",
    "level_change": "median of the window's last points / median of its first points - 1",
    "shift_z": "change point: current level (median of the last few points) against the median "
               "and robust scale (1.4826 x MAD) of the window's earlier points",
    "level_ratio": "change point: current level (median of the last few points) / median of "
                   "the window's earlier points",
    "shift_rel": "change point: (current level - median of the window's earlier points) / |that "
                 "median|",
    "range_pos": "where the current level (median of the last few points) lies in the window's "
                 "range: 0 at its minimum, 1 at its maximum",
    "start": "the median of the run's first `window` steps (at least 3 points): where the run "
             "started (NaN until then)",
    "start_z": "current level against the median and robust scale (1.4826 x MAD) of the run's "
               "first `window` steps (its warm-up)",
    "ratio_to_max": "|newest value| / the largest |value| of the window before it (a spike above "
                    "everything seen lately)",
    "level_to_max": "change point: current level (median of the last few points) / the largest "
                    "of the window's earlier points",
    "ratio_to_start_max": "current level / the largest value of the run's first `window` steps",
    "over_max_z": "change point: how far the current level (median of the last few points) lies "
                  "above the largest of the window's earlier points, in units of their "
                  "point-to-point noise (robust scale of their changes)",
    "shift_dz": "change point: current level (median of the last few points) - median of the "
                "window's earlier points, in units of their point-to-point noise (robust scale "
                "of their changes: a learning curve in the window does not swell it)",
    "jump_dz": "change point: current level (median of the last few points) - the level just "
               "before it (median of as many points before them), in units of the window's "
               "earlier points' point-to-point noise: a jump between two adjacent levels, which "
               "a learning curve in the window does not dilute",
    "shift_gain": "change point: current level (median of the last few points) - median of the "
                  "window's earlier points, in the run's own unit: how far that median lies from "
                  "the median of the run's first 20 steps, plus their robust scale: "
                  "-0.5 lost half of what the run gained since its start, whatever the reward "
                  "model's zero and unit (first logged after step 40: at least half the level "
                  "of its first 20 steps)",
    "jump_t": "change point: mean of the window's last quarter (at least 6 points, without its "
              "lowest and highest) - that of as many points just before them, in standard "
              "errors of that difference (from the standard deviation of the window's points "
              "before the quarter): a crash a noisy reward hides from one point's noise shows "
              "in the mean of a dozen",
    "drawdown_gain": "change point: current level (median of the last few points) - the best "
                     "level of the window's earlier points (the largest median of 3 points in a "
                     "row), in what the run had gained at that best since its first 20 steps, "
                     "plus their robust scale: -0.5 gave back half of its best gain",
    "trend_gain": "least-squares slope x window, in the run's own unit (shift_gain's): the "
                  "climb across the window as a share of how far the window's median lies from "
                  "the median of the run's first 20 steps, plus their robust scale",
    "noise_ratio": "robust scale of the point-to-point changes over the window / that of the "
                   "run's first `window` steps (the noise grew: oscillation, instability)",
    "follow_z": "how much of the metric's trend `versus` follows: Mann-Kendall z of `versus` / "
                "that of the metric, over the same window (about 1 when both move alike, ~0 when "
                "`versus` stays flat)",
    "gain_t": "the window's median against the median of the run's first `window` steps, in "
              "standard errors (robust scales of both blocks): has the run moved since its start?",
}

#: The fewest points a signal's window holds: on a sparsely logged run it reaches further back
#: than `window` steps rather than hold fewer (a trend over 5 points cannot reach z = 4).
MIN_POINTS = {
    "value": 1, "ema": 1, "mean": 3, "std": 3, "median": 3, "min": 2, "max": 2, "zscore": 20,
    "robust_z": 20, "ratio_to_median": 16, "ratio_to_start": 1, "start": 1, "rel_drop": 3, "rel_rise": 3,
    "trend_z": 16, "trend_tau": 16, "slope": 8, "flat_range": 5, "autocorr": 24,
    "sign_flip_rate": 12, "diff_ratio": 16, "delta": 2, "cycle_rise": 1, "rel_trend": 10, "trend_gain": 16,
    "level_change": 12,
    # change points, warm-up baselines, spikes (the detection pack's signals)
    "shift_z": 16, "level_ratio": 16, "shift_rel": 16, "range_pos": 16, "level_to_max": 16,
    "over_max_z": 16, "shift_dz": 16, "jump_dz": 16, "shift_gain": 16, "drawdown_gain": 16, "ratio_to_max": 10, "start_z": 1, "ratio_to_start_max": 1, "gain_t": 12,
    "follow_z": 16, "range": 8, "noise_ratio": 16, "jump_t": 24,
}
#: The fewest points a signal needs before it is defined at all (besides `min_steps`).
READY_POINTS = {
    "value": 1, "ema": 1, "mean": 1, "std": 2, "median": 3, "min": 1, "max": 1, "zscore": 5,
    "robust_z": 5, "ratio_to_median": 2, "ratio_to_start": 1, "start": 1, "rel_drop": 1, "rel_rise": 1,
    "trend_z": 3, "trend_tau": 3, "slope": 2, "flat_range": 2, "autocorr": 8,
    "sign_flip_rate": 3, "diff_ratio": 3, "delta": 2, "cycle_rise": 1, "rel_trend": 3, "trend_gain": 3,
    "level_change": 10,
    "shift_z": 15, "level_ratio": 15, "shift_rel": 15, "range_pos": 15, "level_to_max": 15,
    "over_max_z": 15, "shift_dz": 15, "jump_dz": 15, "shift_gain": 15, "drawdown_gain": 15, "ratio_to_max": 4, "start_z": 1, "ratio_to_start_max": 1, "gain_t": 2,
    "follow_z": 3, "range": 8, "noise_ratio": 8, "jump_t": 24,
}

DIST_STATS = ("bimodality", "skewness", "mean", "std", "median", "p99", "max", "tail_mass",
              "frac_at_cap", "ratio_to_start", "tail_over_median")
RANK_STATS = ("max_over_median", "max", "median", "held_over_median")
GROUP_STATS = ("gap", "gap_slope", "min_slope", "max_slope", "spread_slope",
               "gap_slope_z", "min_slope_z", "max_slope_z", "spread_slope_z")
SAMPLE_STATS = ("top_share", "repetition", "prompt_extreme")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Threshold(_Strict):
    """A threshold relative to a per-run target or a rule parameter; ``factor`` is a number or
    a parameter name."""

    target: str | None = None
    param: str | None = None
    factor: Union[float, str] = 1.0

    @model_validator(mode="after")
    def _one(self) -> "Threshold":
        if (self.target is None) == (self.param is None):
            raise ValueError("a threshold object needs exactly one of 'target' or 'param'")
        return self


#: a number, a parameter name, or a Threshold object
ThresholdSpec = Union[float, str, Threshold]


class Condition(_Strict):
    # metric tests
    metric: str | None = None
    signal: str = "value"
    window: int = Field(default=50, ge=1, le=100_000)
    min_steps: int = Field(default=0, ge=0)
    smooth: int | None = Field(default=None, ge=2, le=10_000,
                               description="EMA span in steps applied to the metric before the signal")
    cycle_metric: str | None = None
    versus: str | None = Field(default=None, description="the second metric of a two-metric "
                               "signal (follow_z)")
    after_warmup_of: str | None = Field(
        default=None, description="count min_steps (or after_warmup_steps) from the last step "
        "this metric (a learning rate) rose above its high, the end of its warm-up, as well as "
        "min_steps from the metric's first")
    after_warmup_steps: int | None = Field(
        default=None, ge=2, le=100_000, description="the steps counted from the end of "
        "after_warmup_of's warm-up (min_steps when not given)")
    # other sources
    nonfinite: Union[Literal["any"], list[str], None] = None
    ranks: str | None = None
    hashes: str | None = None
    mismatch: bool | None = None
    dist: str | None = None
    corr: list[str] | None = None
    groups: str | None = None
    samples: str | None = None
    stat: str | None = None
    cap: ThresholdSpec | None = None
    stalled_seconds: Union[float, str, None] = None
    # comparison
    above: ThresholdSpec | None = None
    below: ThresholdSpec | None = None
    abs_above: ThresholdSpec | None = None
    # composites
    all: list["Condition"] | None = None
    any: list["Condition"] | None = None
    not_: "Condition | None" = Field(default=None, alias="not")
    for_: int | None = Field(default=None, ge=1, alias="for", description="an all/any branch of "
                             "a tier's when: held at every logged point over this many steps")

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if v not in SIGNALS:
            raise ValueError(f"unknown signal {v!r}; one of: {', '.join(SIGNALS)}")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "Condition":
        sources = [name for name in ("metric", "nonfinite", "ranks", "hashes", "dist", "corr",
                                     "groups", "samples", "stalled_seconds", "all", "any", "not_")
                   if getattr(self, name) is not None]
        if len(sources) != 1:
            shown = ", ".join(s.rstrip("_") for s in sources) or "nothing"
            raise ValueError(
                "a condition needs exactly one of metric, nonfinite, ranks, hashes, dist, corr, "
                f"groups, samples, stalled_seconds, all, any, not (got {shown})")
        source = sources[0]
        compares = [c for c in (self.above, self.below, self.abs_above) if c is not None]
        needs_compare = source in ("metric", "ranks", "dist", "corr", "groups", "samples")
        if needs_compare and len(compares) != 1:
            raise ValueError(f"a {source} condition needs exactly one of above, below, abs_above")
        if not needs_compare and compares:
            raise ValueError(f"a {source.rstrip('_')} condition takes no above/below")
        allowed = {"dist": DIST_STATS, "ranks": RANK_STATS, "groups": GROUP_STATS,
                   "samples": SAMPLE_STATS}.get(source)
        if allowed is not None:
            if self.stat not in allowed:
                raise ValueError(f"{source} conditions need stat: one of {', '.join(allowed)}")
        elif self.stat is not None:
            raise ValueError(f"a {source.rstrip('_')} condition takes no stat")
        if source == "corr" and len(self.corr or []) != 2:
            raise ValueError("corr takes two per-sample arrays, e.g. [reward, response_length]")
        if source == "hashes" and self.mismatch is not True:
            raise ValueError("a hashes condition is written {hashes: NAME, mismatch: true}")
        if source != "metric":
            for name in ("smooth", "cycle_metric", "versus", "after_warmup_of", "after_warmup_steps"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} belongs to metric conditions")
        if self.cap is not None and source != "dist":
            raise ValueError("cap belongs to dist conditions (tail_mass, frac_at_cap, tail_over_median)")
        least = {"autocorr": 5, "trend_z": 3, "trend_tau": 3, "slope": 3}.get(self.signal, 1)
        if self.window < least:
            raise ValueError(f"signal {self.signal} needs a window of at least {least} steps")
        if self.signal == "cycle_rise" and not self.cycle_metric:
            raise ValueError("signal cycle_rise needs cycle_metric (e.g. ppo/epoch)")
        if self.after_warmup_steps is not None and self.after_warmup_of is None:
            raise ValueError("after_warmup_steps counts from the end of a warm-up: name its "
                             "metric with after_warmup_of (e.g. lr/actor)")
        if self.after_warmup_of is not None and self.min_steps < 2:
            raise ValueError("after_warmup_of counts steps from the end of "
                             f"{self.after_warmup_of}'s warm-up, once one is seen: give min_steps "
                             "of 2 or more, the steps from the run's start")
        if self.for_ is not None and source not in ("all", "any"):
            raise ValueError("for belongs to a tier, or to an all/any branch of its when (a "
                             "branch held over that many steps)")
        if (self.signal == "follow_z") != (self.versus is not None):
            raise ValueError("signal follow_z needs versus: METRIC (and versus belongs to follow_z)")
        return self


def held_branches(c: Condition) -> Iterator[Condition]:
    """The all/any branches inside ``c`` (itself included) that carry their own ``for``."""
    if c.for_ is not None:
        yield c
    for part in (c.all or c.any or ([c.not_] if c.not_ is not None else [])):
        yield from held_branches(part)


def _reads_the_step(c: Condition | None, what: str) -> Condition | None:
    """``c``, when it reads only the step's metrics (a condition read when an alert changes)."""
    if c is not None and next(held_branches(c), None) is not None:
        raise ValueError(f"{what} is read when an alert changes, not at every step: a branch "
                         "of it cannot be held (for)")
    for leaf in leaves(c) if c is not None else ():
        for kind in ("ranks", "hashes", "samples", "stalled_seconds"):
            if getattr(leaf, kind) is not None:
                raise ValueError(f"{what} reads the step's metrics (metric, dist, corr and "
                                 f"groups tests), not {kind}")
    return c


class ActionSpec(_Strict):
    adjust: dict[str, float]
    at_most: int | None = Field(
        default=None, ge=1,
        description="times one run is sent this adjust (its factors compound with each); a "
                    "firing after that notifies without it, saying so. Counted per tier, from the "
                    "run's start or its last rollback or relaunch")
    when: Condition | None = Field(
        default=None,
        description="sent only when this holds as the alert fires (a tier whose branches call "
                    "for different remedies: a learning rate halved when updates are too large, "
                    "not when they are too small)")

    @field_validator("when")
    @classmethod
    def _when_reads_the_step(cls, v):
        return _reads_the_step(v, "an adjust's when")


class Tier(_Strict):
    severity: Literal["info", "yellow", "orange", "red", "black"]
    when: Condition
    for_: int = Field(default=1, ge=1, alias="for", description="training steps held")
    for_points: int = Field(default=1, ge=1, description="logged points in a row held (besides `for` steps)")
    for_seconds: float = Field(default=0.0, ge=0)
    keep_firing_for: int = Field(default=0, ge=0, description="steps to keep firing once false")
    escalate_after: int | None = Field(default=None, ge=1,
                                       description="steps of firing after which it escalates a tier")
    keep_firing_while: Condition | None = Field(
        default=None, description="a firing alert does not resolve while this holds")
    actions: list[Union[str, ActionSpec]] = Field(default_factory=lambda: ["notify"])

    @field_validator("keep_firing_while")
    @classmethod
    def _keep_reads_the_step(cls, v: Condition | None) -> Condition | None:
        return _reads_the_step(v, "keep_firing_while")

    def conditions(self) -> list[Condition]:
        """The tier's conditions: ``when``, its ``keep_firing_while`` and its adjusts' ``when``."""
        out = [self.when] if self.keep_firing_while is None else [self.when, self.keep_firing_while]
        return out + [a.when for a in self.actions if isinstance(a, ActionSpec) and a.when is not None]

    @field_validator("actions")
    @classmethod
    def _actions(cls, v: list) -> list:
        for a in v:
            if isinstance(a, str) and a not in ACTIONS:
                raise ValueError(f"unknown action {a!r}; one of: {', '.join(ACTIONS)}")
        return v

    def action_names(self) -> list[str]:
        return [a if isinstance(a, str) else "adjust" for a in self.actions]

    def adjust_params(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for a in self.actions:
            if isinstance(a, ActionSpec):
                out.update(a.adjust)
        return out

    def adjust_limit(self) -> int | None:
        """How many times one run is sent the tier's adjust (None: every firing)."""
        limits = [a.at_most for a in self.actions if isinstance(a, ActionSpec) and a.at_most]
        return min(limits) if limits else None


class Note(_Strict):
    """Extra diagnosis text added when its condition holds at firing time."""

    when: Condition
    text: str
    otherwise: str | None = None

    @field_validator("when")
    @classmethod
    def _no_hold(cls, v: Condition) -> Condition:
        if next(held_branches(v), None) is not None:
            raise ValueError("a note is read when an alert fires, not at every step: a branch "
                             "of it cannot be held (for)")
        return v


class Rule(_Strict):
    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
    title: str = ""
    description: str = ""
    scope: Literal["rank0", "each_rank"] = "rank0"
    params: dict[str, float] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    summary: str = "{rule} {metric} = {value:.4g} (threshold {threshold:.4g})"
    diagnosis: str = ""
    notes: list[Note] = Field(default_factory=list)
    tiers: list[Tier] = Field(min_length=1)
    enabled: bool = True

    @model_validator(mode="after")
    def _tiers(self) -> "Rule":
        seen = [t.severity for t in self.tiers]
        if len(set(seen)) != len(seen):
            raise ValueError(f"rule {self.id!r} declares the same severity twice: {seen}")
        return self


class Override(_Strict):
    runs: str = "*"
    targets: dict[str, float] = Field(default_factory=dict)
    disable: list[str] = Field(default_factory=list)
    params: dict[str, dict[str, float]] = Field(default_factory=dict)


class Pack(_Strict):
    pack: str = "custom"
    description: str = ""
    diagnoses: str | None = None
    targets: dict[str, float] = Field(default_factory=dict)
    rules: list[Rule] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    tests: list[dict[str, Any]] = Field(default_factory=list)
    # where the overrides came from (file, YAML node, location) and the load warnings
    _meta: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _unique(self) -> "Pack":
        ids = [r.id for r in self.rules]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"rule ids must be unique; repeated: {', '.join(dup)}")
        return self


Condition.model_rebuild()


def leaves(cond: Condition) -> Iterator[Condition]:
    """Every non-composite condition inside ``cond``."""
    if cond.all is not None or cond.any is not None:
        for c in (cond.all or cond.any):
            yield from leaves(c)
    elif cond.not_ is not None:
        yield from leaves(cond.not_)
    else:
        yield cond

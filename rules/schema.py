"""The rule language: pydantic models of a rule file (YAML).

A rule file (a *pack*) looks like::

    pack: rlhf
    targets: {kl: 0.1}                 # per-run targets, overridable per run
    rules:
      - id: kl_above_target
        params: {cap: 0.2}
        summary: "KL {value:.3g} above {threshold:.3g}"
        diagnosis: "..."
        tiers:
          - severity: yellow
            when: {metric: kl/mean, above: {target: kl, factor: 1.5}}
            for: 5                     # consecutive steps
            actions: [notify, {adjust: {beta: 1.5}}]
          - severity: red
            when: {metric: kl/mean, above: {target: kl, factor: 2.5}}
            actions: [pause, snapshot]
    overrides:
      - runs: "ppo-8b-*"               # glob on run_id
        targets: {kl: 0.03}
        disable: [stagnation]
        params: {kl_above_target: {cap: 0.5}}

A condition (``when``) is one of:

* a metric test: ``{metric, signal?, window?, above?|below?|equals?, min_steps?}``;
  thresholds are numbers, ``{target: NAME, factor: F}`` or ``{param: NAME, factor: F}``;
* ``{nonfinite: any}`` or ``{nonfinite: [metric, ...]}``;
* across ranks: ``{ranks: METRIC, stat: max_over_median, above: 3}``;
  ``{hashes: actor, mismatch: true}``;
* a per-sample distribution of the step: ``{dist: reward, stat: bimodality, above: 0.555}``;
* a correlation of two per-sample arrays: ``{corr: [reward, response_length], window: 20, above: 0.5}``;
* per-category groups: ``{groups: reward/mean, stat: gap_slope, above: 0}``;
* samples: ``{samples: token_kl_argmax, stat: top_share, above: 0.5}``;
* silence: ``{stalled_seconds: 300}``;
* composites: ``{all: [...]}``, ``{any: [...]}``, ``{not: {...}}``.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ACTIONS",
    "Condition",
    "Override",
    "Pack",
    "Rule",
    "Threshold",
    "Tier",
]

ACTIONS = ("notify", "adjust", "snapshot", "pause", "stop", "rollback")
SIGNALS = (
    "value",        # the metric itself
    "ema",          # bias-corrected EMA (alpha from window: 2/(window+1))
    "mean", "std", "median", "min", "max",      # rolling, over `window` steps
    "zscore",       # newest value vs mean/std of the window before it
    "robust_z",     # newest value vs median/MAD of the window before it
    "ratio_to_median",   # newest value / median of the window before it
    "ratio_to_start",    # median of the last 5 values / median of the run's first `window` values
    "rel_drop",     # fraction below the window's peak
    "rel_rise",     # fraction above the window's trough
    "trend_z",      # Mann-Kendall z over the window (> 0 rising)
    "trend_tau",    # Kendall's tau of value vs step over the window
    "slope",        # Theil-Sen slope per step over the window
    "flat_range",   # (max - min) / |mean| over the window
    "autocorr",     # strength of the dominant autocorrelation lag over the window
    "sign_flip_rate",    # share of step-to-step changes that flip sign
    "diff_ratio",   # std of step-to-step changes / std of values over the window
    "delta",        # newest value minus the previous one
    "cycle_rise",   # rise of the value since the start of its update cycle (see cycle_metric)
    "rel_trend",    # Theil-Sen slope x window / |median|: relative change across the window
    "level_change", # median of the window's last values / median of its first values - 1
)
DIST_STATS = ("bimodality", "skewness", "mean", "std", "median", "p99", "max", "tail_mass",
              "frac_at_cap", "ratio_to_start")
RANK_STATS = ("max_over_median", "max", "median")
GROUP_STATS = ("gap", "gap_slope", "min_slope", "max_slope", "spread_slope")
SAMPLE_STATS = ("top_share", "repetition", "prompt_extreme")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Threshold(_Strict):
    """A threshold relative to a per-run target or a rule parameter."""

    target: str | None = None
    param: str | None = None
    factor: float = 1.0

    @model_validator(mode="after")
    def _one(self) -> "Threshold":
        if (self.target is None) == (self.param is None):
            raise ValueError("a threshold object needs exactly one of 'target' or 'param'")
        return self


ThresholdSpec = Union[float, Threshold]


class Condition(_Strict):
    # metric tests
    metric: str | None = None
    signal: str = "value"
    window: int = Field(default=50, ge=2, le=5000)
    min_steps: int = Field(default=0, ge=0)
    smooth: int | None = Field(default=None, ge=2, le=1000,
                               description="EMA span applied to the metric before the signal")
    cycle_metric: str | None = None
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
    stalled_seconds: float | None = Field(default=None, gt=0)
    # comparison
    above: ThresholdSpec | None = None
    below: ThresholdSpec | None = None
    abs_above: ThresholdSpec | None = None
    # composites
    all: list["Condition"] | None = None
    any: list["Condition"] | None = None
    not_: "Condition | None" = Field(default=None, alias="not")

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
        if source == "corr" and len(self.corr or []) != 2:
            raise ValueError("corr takes two per-sample arrays, e.g. [reward, response_length]")
        if source == "hashes" and self.mismatch is not True:
            raise ValueError("a hashes condition is written {hashes: NAME, mismatch: true}")
        least = {"autocorr": 5, "trend_z": 3, "trend_tau": 3, "slope": 3}.get(self.signal, 2)
        if self.window < least:
            raise ValueError(f"signal {self.signal} needs a window of at least {least} steps")
        if self.signal == "cycle_rise" and not self.cycle_metric:
            raise ValueError("signal cycle_rise needs cycle_metric (e.g. ppo/epoch)")
        return self


class ActionSpec(_Strict):
    adjust: dict[str, float]


class Tier(_Strict):
    severity: Literal["info", "yellow", "orange", "red", "black"]
    when: Condition
    for_: int = Field(default=1, ge=1, alias="for", description="consecutive steps true")
    for_seconds: float = Field(default=0.0, ge=0)
    keep_firing_for: int = Field(default=0, ge=0, description="steps to keep firing once false")
    escalate_after: int | None = Field(default=None, ge=1,
                                       description="steps of firing after which it escalates a tier")
    actions: list[Union[str, ActionSpec]] = Field(default_factory=lambda: ["notify"])

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


class Note(_Strict):
    """Extra diagnosis text added when its condition holds at firing time."""

    when: Condition
    text: str
    otherwise: str | None = None


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
    targets: dict[str, float] = Field(default_factory=dict)
    rules: list[Rule] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    tests: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> "Pack":
        ids = [r.id for r in self.rules]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"rule ids must be unique; repeated: {', '.join(dup)}")
        return self


Condition.model_rebuild()

"""``rlwatch rules tune DIR``: a team's own parameters, learnt from its healthy past runs.

1. :func:`learn_profile` reads the healthy runs (names mapped by their preset) and keeps, per
   canonical metric, what healthy looks like for this team: the typical level and the band its
   runs stay in (the steady band leaves out the first fifth of each run), what a median of 3
   logged points reaches, the robust scale of the step-to-step noise (1.4826 x MAD of the changes
   between logged points), and the statistics the rules test, measured on healthy runs: the
   largest z-score against the preceding 50 steps, the largest ratio to the median of the
   preceding 50 steps, the deepest level change over 200 steps, the lowest ratio to the start.
2. :data:`KNOBS` turns the profile into values for the pack's own targets and named parameters,
   only those the pack declares (a target some rule reads, or a rule's ``params:``). Level-like
   thresholds (the KL target, the truncated share a notice starts at) may move both ways: the
   healthy band is known, and a fault is a departure from it. Test statistics (z-scores, spike
   ratios of noisy metrics) only loosen: healthy runs show how far noise goes, never how small a
   fault can be. A learnt value stays within a factor :data:`MAX_FACTOR` of the pack's (the
   preset's) default and inside the quantity's own bounds: a handful of runs may move a
   threshold, not replace the catalog's judgement. Anything learnt that the pack has no
   parameter for is reported (and written as a comment).
3. :func:`overrides_yaml` writes it as an overrides file (``pack:``, ``overrides: [{runs,
   targets, params}]``), used as ``--rules rlhf,FILE``.
4. :func:`compare` replays the labelled runs of DIR with the default and the tuned pack and
   says, per faulty run, what each caught and how many steps earlier or later;
   :func:`leave_one_source_out` learns on the other sources' healthy runs and scores the left-out
   source, the honest number.

A directory's runs may come from several frameworks: the profile is learnt per preset, and a
tuned override applies to the runs of its preset only (``tuned_packs``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from rlwatch.backtest import Label, Verdict, judge, load_labels, replay_labelled, score

__all__ = ["KNOBS", "Knob", "MetricProfile", "Profile", "TuneResult", "compare", "learn_profile",
           "leave_one_source_out", "overrides_yaml", "tune", "tuned_packs"]

#: A learnt value stays within this factor of the default it replaces.
MAX_FACTOR = 3.0
#: A metric is learnt from at least this many healthy runs with at least MIN_POINTS points in all.
MIN_RUNS = 2
MIN_POINTS = 40
#: The part of a run left out of its steady band (warm-up: KL growing from 0, early truncation).
WARMUP_SHARE = 0.2
#: Step spans of the statistics, as the built-in pack's rules use them.
BASELINE_STEPS = 50        # z-score and ratio-to-median baselines
LEVEL_STEPS = 200          # level change (entropy_collapse)
START_STEPS = 20           # the run's start (ratio_to_start)


# -- the profile --------------------------------------------------------------------------------

def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


NAN = float("nan")


@dataclass
class MetricProfile:
    metric: str
    runs: int = 0
    points: int = 0
    level: float = NAN        # median of the runs' medians
    low: float = NAN          # lowest 5th percentile of a run
    high: float = NAN         # highest 95th percentile of a run
    high_steady: float = NAN  # highest 95th percentile of a run after its first fifth
    floor: float = NAN        # lowest value seen
    top: float = NAN          # highest value seen
    peak3: float = NAN        # highest median of 3 consecutive logged points
    noise: float = NAN        # median over runs of 1.4826 x MAD of the point-to-point changes
    max_z: float = NAN        # largest z-score against the preceding BASELINE_STEPS
    spike_ratio: float = NAN  # largest value / median of the preceding BASELINE_STEPS
    level_drop: float = NAN   # deepest (most negative) level change over LEVEL_STEPS
    min_ratio_to_start: float = NAN   # lowest median of 5 points / median of the first START_STEPS


def _before(steps: list[int], i: int, span: int) -> range:
    j = i
    while j > 0 and steps[i] - steps[j - 1] <= span:
        j -= 1
    return range(j, i)


def _run_stats(steps: list[int], xs: list[float]) -> dict:
    n = len(xs)
    d = [b - a for a, b in zip(xs, xs[1:])]
    noise = NAN
    if len(d) >= 3:
        md = statistics.median(d)
        noise = 1.4826 * statistics.median(abs(x - md) for x in d)
    peak3 = max((sorted(xs[i:i + 3])[1] for i in range(n - 2)), default=NAN)
    max_z = spike = NAN
    for i in range(n):
        prev = [xs[j] for j in _before(steps, i, BASELINE_STEPS)]
        if len(prev) < 5:
            continue
        mu, sd = statistics.fmean(prev), statistics.pstdev(prev)
        if sd > 0:
            z = (xs[i] - mu) / sd
            max_z = z if math.isnan(max_z) else max(max_z, z)
        base = statistics.median(prev)
        if base > 0 and xs[i] > 0:
            r = xs[i] / base
            spike = r if math.isnan(spike) else max(spike, r)
    drop = NAN
    for i in range(n):
        window = list(_before(steps, i, LEVEL_STEPS)) + [i]
        if steps[i] - steps[window[0]] < LEVEL_STEPS // 4 or len(window) < 6:
            continue
        first = statistics.median(xs[k] for k in window[:5])
        last = statistics.median(xs[k] for k in window[-5:])
        if first > 0:
            c = last / first - 1.0
            drop = c if math.isnan(drop) else min(drop, c)
    start = [x for s, x in zip(steps, xs) if s - steps[0] < START_STEPS] or xs[:1]
    s0 = statistics.median(start)
    rts = NAN
    if s0 > 0 and n >= 5:
        rts = min(statistics.median(xs[i - 4:i + 1]) / s0 for i in range(4, n))
    steady = xs[int(WARMUP_SHARE * n):] or xs
    return {"median": statistics.median(xs), "p05": _q(xs, 0.05), "p95": _q(xs, 0.95),
            "p95_steady": _q(steady, 0.95), "min": min(xs), "max": max(xs), "peak3": peak3,
            "noise": noise, "max_z": max_z, "spike": spike, "drop": drop, "rts": rts}


def _nanmax(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return max(xs) if xs else NAN


def _nanmin(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return min(xs) if xs else NAN


def _nanmedian(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else NAN


@dataclass
class Profile:
    preset: str | None
    runs: list[str] = field(default_factory=list)
    interval: int = 1
    metrics: dict[str, MetricProfile] = field(default_factory=dict)

    def usable(self, metric: str) -> MetricProfile | None:
        m = self.metrics.get(metric)
        if m is None or m.runs < MIN_RUNS or m.points < MIN_POINTS:
            return None
        return m


def learn_profile(runs: dict[str, list[tuple[int, dict[str, float]]]], preset: str | None = None) -> Profile:
    """The profile of healthy runs given as ``{run: [(step, {canonical name: value})]}``."""
    per_metric: dict[str, list[dict]] = {}
    points: dict[str, int] = {}
    gaps = []
    for steps in runs.values():
        if len(steps) > 1:
            gaps.append(statistics.median(b[0] - a[0] for a, b in zip(steps, steps[1:])))
        series: dict[str, tuple[list[int], list[float]]] = {}
        for step, m in steps:
            for k, v in m.items():
                if isinstance(v, float) and math.isfinite(v):
                    ss, xs = series.setdefault(k, ([], []))
                    ss.append(step)
                    xs.append(v)
        for k, (ss, xs) in series.items():
            if len(xs) >= 5:
                per_metric.setdefault(k, []).append(_run_stats(ss, xs))
                points[k] = points.get(k, 0) + len(xs)
    prof = Profile(preset, sorted(runs), int(statistics.median(gaps)) if gaps else 1)
    for k, st in sorted(per_metric.items()):
        prof.metrics[k] = MetricProfile(
            k, len(st), points[k], level=_nanmedian([s["median"] for s in st]),
            low=_nanmin([s["p05"] for s in st]), high=_nanmax([s["p95"] for s in st]),
            high_steady=_nanmax([s["p95_steady"] for s in st]),
            floor=_nanmin([s["min"] for s in st]), top=_nanmax([s["max"] for s in st]),
            peak3=_nanmax([s["peak3"] for s in st]), noise=_nanmedian([s["noise"] for s in st]),
            max_z=_nanmax([s["max_z"] for s in st]), spike_ratio=_nanmax([s["spike"] for s in st]),
            level_drop=_nanmin([s["drop"] for s in st]),
            min_ratio_to_start=_nanmin([s["rts"] for s in st]))
    return prof


# -- from the profile to the pack's parameters ---------------------------------------------------

@dataclass(frozen=True)
class Knob:
    """One target or rule parameter learnt from one metric's profile.

    ``learn(profile_of_metric, default, values_so_far)`` returns the value or None. ``rule`` is
    None for a target (``name`` is then the target's name). ``sense``: +1 for a threshold the
    value must rise above to fire, -1 for one it must fall below. ``loosen_only``: the learnt
    value replaces the default only where it is less sensitive. ``bounds``: the quantity's own
    range (a share stays in 0..1)."""

    rule: str | None
    name: str
    metric: str
    learn: Callable[[MetricProfile, float | None, dict], float | None]
    why: str
    sense: int = 1
    loosen_only: bool = False
    bounds: tuple[float, float] = (-math.inf, math.inf)


def _kl_target(m, default, got):
    # the healthy band's upper end: yellow (1.5 x target for 5 steps) stays half again above every
    # healthy run's 95th percentile, red (median of 3 over 2.5 x target) above the highest
    # 3-point median with room
    return max(m.high, m.peak3 / 2.0)


def _kl_cap(m, default, got):
    # keep the pack's ratio of cap to target; never under twice the highest 3-point median
    t, t0 = got.get(("target", "kl")), got.get(("default", "kl"))
    scaled = default * t / t0 if (t and t0 and default) else None
    return max(scaled or 0.0, 2.0 * m.peak3) or None


def _spike_red(m, default, got):
    o, o0 = got.get(("token_kl_spike", "orange")), got.get(("default", "token_kl_spike.orange"))
    return default * o / o0 if (o and o0 and default) else None


KNOBS: tuple[Knob, ...] = (
    Knob(None, "kl", "kl/mean", _kl_target,
         "KL target: the highest 95th percentile of a healthy run (or half its highest 3-point median)"),
    Knob("kl_above_target", "cap", "kl/mean", _kl_cap,
         "absolute KL cap: the pack's cap/target ratio on the learnt target, at least 2x the highest "
         "3-point median of a healthy run"),
    Knob("token_kl_spike", "orange", "kl/token_max", lambda m, d, g: 1.5 * m.top,
         "token KL spike: 1.5x the highest per-token KL of a healthy run"),
    Knob("token_kl_spike", "red", "kl/token_max", _spike_red, "the pack's red/orange ratio kept"),
    Knob("length_shape", "long", "response/length_max", lambda m, d, g: m.high,
         "a long response: the highest 95th percentile of a healthy run's longest response"),
    Knob("truncation_rising", "yellow", "response/truncated_frac", lambda m, d, g: 1.5 * m.high_steady,
         "truncation notice: 1.5x the highest steady 95th percentile of a healthy run's truncated share",
         bounds=(0.01, 0.45)),
    Knob("grpo_zero_variance", "zero_std_frac", "reward/frac_zero_std", lambda m, d, g: m.high_steady + 0.05,
         "zero-variance share: 0.05 above the highest steady 95th percentile of a healthy run",
         bounds=(0.2, 0.99)),
    Knob("entropy_collapse", "level_drop", "entropy/mean", lambda m, d, g: 1.5 * m.level_drop,
         "entropy drop over 200 steps: 1.5x the deepest drop of a healthy run", sense=-1,
         bounds=(-0.95, -0.1)),
    Knob("entropy_collapse", "ratio", "entropy/mean", lambda m, d, g: 0.67 * m.min_ratio_to_start,
         "entropy against the run's start: 2/3 of the lowest ratio of a healthy run", sense=-1,
         bounds=(0.02, 0.8)),
    Knob("grad_norm_anomaly", "spike_ratio", "grad_norm/actor", lambda m, d, g: 1.5 * m.spike_ratio,
         "gradient-norm spike: 1.5x the largest ratio to the preceding 50-step median of a healthy run"),
    Knob("value_loss_divergence", "ratio", "loss/value", lambda m, d, g: 1.5 * m.spike_ratio,
         "value-loss spike: 1.5x the largest ratio to the preceding 50-step median of a healthy run",
         loosen_only=True),
    Knob("reward_spike", "z", "reward/mean", lambda m, d, g: 1.25 * m.max_z,
         "reward jump: 1.25x the largest z-score against the preceding 50 steps of a healthy run",
         loosen_only=True),
)


def _pack_defaults(pack, preset_name: str | None) -> tuple[dict[str, float], dict[str, dict[str, float]], set[str], set[tuple[str, str]]]:
    """(targets, params per rule, with the preset's override applied; the targets and the
    (rule, parameter) pairs the pack itself declares)."""
    from contract.presets import get_preset

    targets = dict(pack.targets)
    params = {r.id: dict(getattr(r, "params", {}) or {}) for r in pack.rules}
    declared = {(rid, name) for rid, p in params.items() for name in p}
    declared_targets = set(targets)
    try:
        preset = get_preset(preset_name)
    except ValueError:
        preset = None
    if preset is not None:
        targets.update(preset.targets)
        for rid, p in preset.params.items():
            params.setdefault(rid, {}).update(p)
    return targets, params, declared_targets, declared


def _bound(knob: Knob, value: float, default: float | None) -> float:
    if default is not None and default != 0 and value * default > 0:   # same sign: within 3x
        lo, hi = sorted((default / MAX_FACTOR, default * MAX_FACTOR))
        value = min(max(value, lo), hi)
    if knob.loosen_only and default is not None:
        value = max(value, default) if knob.sense > 0 else min(value, default)
    return min(max(value, knob.bounds[0]), knob.bounds[1])


def _round(x: float) -> float:
    return float(f"{x:.3g}")


@dataclass
class TuneResult:
    profile: Profile
    targets: dict[str, float] = field(default_factory=dict)
    params: dict[str, dict[str, float]] = field(default_factory=dict)
    changes: list[dict] = field(default_factory=list)      # {what, default, learnt, why, clipped}
    unused: list[dict] = field(default_factory=list)       # learnt, no parameter takes it yet
    skipped: list[str] = field(default_factory=list)       # knobs without data
    kept: list[str] = field(default_factory=list)          # defaults the healthy runs confirm

    def to_dict(self) -> dict:
        prof = asdict(self.profile)
        for m in prof["metrics"].values():
            for k, v in list(m.items()):
                if isinstance(v, float) and not math.isfinite(v):
                    m[k] = None
        return {"preset": self.profile.preset, "runs": self.profile.runs, "targets": self.targets,
                "params": self.params, "changes": self.changes, "unused": self.unused,
                "skipped": self.skipped, "kept": self.kept, "profile": prof}

    def pack(self, runs: str = "*"):
        """The overrides as a pack, to merge after the default one."""
        from rules.schema import Override, Pack

        return Pack(pack=f"tuned-{self.profile.preset or 'runs'}",
                    overrides=[Override(runs=runs, targets=dict(self.targets),
                                        params={k: dict(v) for k, v in self.params.items()})])


def tune(profile: Profile, pack) -> TuneResult:
    """The pack's targets and parameters learnt from ``profile`` (see :data:`KNOBS`)."""
    targets, params, used_targets, declared_params = _pack_defaults(pack, profile.preset)
    res = TuneResult(profile)
    got: dict = {}
    for knob in KNOBS:
        m = profile.usable(knob.metric)
        if knob.rule is None:
            declared = knob.name in used_targets
            default = targets.get(knob.name)
            what = f"targets.{knob.name}"
        else:
            declared = (knob.rule, knob.name) in declared_params
            default = params.get(knob.rule, {}).get(knob.name)
            what = f"{knob.rule}.{knob.name}"
        if m is None:
            res.skipped.append(f"{what}: fewer than {MIN_RUNS} healthy runs / {MIN_POINTS} points of {knob.metric}")
            continue
        if default is not None:
            got[("default", knob.name if knob.rule is None else f"{knob.rule}.{knob.name}")] = default
        raw = knob.learn(m, default, got)
        if raw is None or not math.isfinite(raw) or (knob.sense > 0 and raw <= 0):
            res.skipped.append(f"{what}: nothing to learn from {knob.metric}")
            continue
        value = _round(_bound(knob, raw, default))
        if default is not None and value == _round(default):
            res.kept.append(f"{what} = {default}: the healthy runs agree with it (learnt {_round(raw)})")
            continue
        if not declared:
            res.unused.append({"what": what, "learnt": value, "metric": knob.metric, "why": knob.why})
            continue
        got[("target", knob.name) if knob.rule is None else (knob.rule, knob.name)] = value
        if knob.rule is None:
            res.targets[knob.name] = value
        else:
            res.params.setdefault(knob.rule, {})[knob.name] = value
        res.changes.append({"what": what, "default": default, "learnt": value, "why": knob.why,
                            "raw": _round(raw), "clipped": value != _round(raw),
                            "loosen_only": knob.loosen_only})
    return res


def overrides_yaml(res: TuneResult, runs: str = "*") -> str:
    """The overrides file: ``--rules rlhf,FILE``."""
    import yaml

    p = res.profile
    lines = [f"# Learnt by `rlwatch rules tune` from {len(p.runs)} healthy run(s)"
             + (f" ({p.preset})" if p.preset else "") + f", logged every {p.interval} step(s):",
             *[f"#   {r}" for r in p.runs[:20]],
             f"# Use: rlwatch replay RUN --rules rlhf,THIS_FILE (or rlwatch worker --rules rlhf,THIS_FILE)."]
    for c in res.changes:
        lines.append(f"# {c['what']}: {c['default']} -> {c['learnt']}"
                     + (f" (learnt {c['raw']}, held within 3x of the default and the quantity's bounds"
                        f"{', and loosen-only' if c['loosen_only'] else ''})" if c["clipped"] else "") + f": {c['why']}")
    if res.unused:
        lines.append("# Learnt, but no parameter of the pack takes it yet:")
        lines += [f"#   {u['what']} = {u['learnt']}: {u['why']}" for u in res.unused]
    body: dict = {"pack": f"tuned-{p.preset or 'runs'}",
                  "overrides": [{"runs": runs, **({"targets": res.targets} if res.targets else {}),
                                 **({"params": res.params} if res.params else {})}]}
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None)


# -- reading a directory -----------------------------------------------------------------------

RUN_SUFFIXES = (".jsonl", ".json", ".csv", ".log", ".txt")


def _labels_or_all(directory: Path, labels: list[Label] | None) -> list[Label]:
    if labels is not None:
        return labels
    if (directory / "labels.json").exists():
        return load_labels(directory)
    files = sorted(f.name for f in directory.iterdir()
                   if f.is_file() and f.suffix in RUN_SUFFIXES and f.name != "labels.json")
    return [Label(f, "healthy") for f in files]


def healthy_runs(directory: str | Path, labels: Iterable[Label]) -> dict[str | None, dict[str, list]]:
    """{preset name: {file: steps}} of the healthy labelled runs."""
    from contract.presets import get_preset
    from rlwatch.replay import read_steps

    out: dict[str | None, dict[str, list]] = {}
    for lab in labels:
        if lab.label != "healthy":
            continue
        try:
            preset = get_preset(lab.preset)
        except ValueError:
            preset = None
        used, steps = read_steps(Path(directory) / lab.run, preset)
        out.setdefault(used.name if used is not None else None, {})[lab.run] = steps
    return out


def tuned_packs(directory: str | Path, pack, labels: Iterable[Label]) -> dict[str | None, TuneResult]:
    """One tuning per preset found among the healthy runs of ``labels``."""
    return {name: tune(learn_profile(runs, name), pack)
            for name, runs in healthy_runs(directory, labels).items()}


# -- what the tuned pack changes ----------------------------------------------------------------

@dataclass
class Comparison:
    run: str
    label: str
    default: Verdict
    tuned: Verdict

    @property
    def change(self) -> str:
        d, t = self.default, self.tuned
        if d.kind == "unscored":
            return "unscored"
        if d.kind == "quiet":
            return "same" if d.passed == t.passed else ("now quiet" if t.passed else "now alarms")
        if d.caught is None and t.caught is None:
            return "missed by both"
        if d.caught is None:
            return f"newly caught ({t.delay:+d})"
        if t.caught is None:
            return "lost"
        diff = d.caught.step - t.caught.step
        return "same step" if diff == 0 else (f"{diff} steps earlier" if diff > 0 else f"{-diff} steps later")

    def to_dict(self) -> dict:
        return {"run": self.run, "label": self.label, "change": self.change,
                "default": self.default.to_dict(), "tuned": self.tuned.to_dict()}


def compare(directory: str | Path, pack, tuned: dict[str | None, TuneResult],
            labels: Iterable[Label]) -> list[Comparison]:
    """Each labelled run replayed with the default pack and with the overrides tuned for its
    preset (runs of a preset nothing was tuned for get the default twice)."""
    packs = {name: res.pack() for name, res in tuned.items() if res.targets or res.params}
    out = []
    for lab in labels:
        d = replay_labelled(directory, lab, pack)
        vd = judge(lab, d.alerts, d.span, pack_rules=d.pack_rules, watched=d.watched)
        extra = packs.get(lab.preset if lab.preset is not None else d.preset)
        if extra is None:
            vt = vd
        else:
            t = replay_labelled(directory, lab, pack, tuned=extra)
            vt = judge(lab, t.alerts, t.span, pack_rules=t.pack_rules, watched=t.watched)
        out.append(Comparison(lab.run, lab.label, vd, vt))
    return out


def leave_one_source_out(directory: str | Path, pack="rlhf", *, labels: list[Label] | None = None,
                         sources: dict[str, str] | None = None) -> list[dict]:
    """Per source: learn on the healthy runs of every other source, score the left-out one with
    the default and with the tuned pack."""
    from rlwatch.backtest import as_pack

    pack = as_pack(pack)
    directory = Path(directory)
    labels = labels if labels is not None else load_labels(directory, sources)
    rows = []
    for src in sorted({lab.source or "-" for lab in labels}):
        train = [lab for lab in labels if (lab.source or "-") != src]
        test = [lab for lab in labels if (lab.source or "-") == src]
        tuned = tuned_packs(directory, pack, train)
        comp = compare(directory, pack, tuned, test)
        sd, st = score(c.default for c in comp), score(c.tuned for c in comp)
        presets = sorted({lab.preset or "-" for lab in test})
        note = "; ".join(f"{p}: " + (", ".join(f"{c['what']}={c['learnt']}" for c in tuned[p].changes) or "nothing learnt")
                         if p in tuned else f"{p}: no healthy runs elsewhere" for p in presets)
        rows.append({"source": src, "files": len(test), "scored": sd.scored, "default_passed": sd.passed,
                     "tuned_passed": st.passed, "default": sd.to_dict(), "tuned": st.to_dict(),
                     "changes": [(c.run, c.change) for c in comp], "note": note})
    return rows


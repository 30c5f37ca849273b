"""Backtest of a rule pack on data it was not tuned on (issue 10), with rlwatch.backtest.

* Real logs (../shared/real-logs, labels.json; where it says a bare "other", the README's label): each file judged by its own rule(s), severity,
  delay after the onset, alarms and brakes before it, yellow notices per 1,000 healthy steps;
  then the score per left-out source repository (leave-one-source-out; with --tune also the
  score of a pack tuned by ``rlwatch rules tune`` on the other sources' healthy runs).
* Simulated runs from held-out seeds (>= 1000; nobody tunes on them), fault magnitudes drawn by
  those seeds over each fault's range, healthy runs with random healthy features, each logged
  every 1, 5 and 10 steps: recall, orange+ on healthy runs or before the onset, yellow per 1,000
  healthy steps, and detection delay against magnitude.

    python bench/backtest.py [--seeds 2] [--every 1,5,10] [--seed-from N] [--jobs 2] [--faults a,b] [--real-only]
                             [--sim-only] [--tune] [--rules PACK] [--json OUT]
                             [--reward-scale K] [--reward-offset B] [--metric-scale PREFIX=K ...]
                             [--metric-noise PREFIX=SD ...] [--noise-profile real] [--real-variant every=2 ...]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlwatch.backtest import (  # noqa: E402
    HELDOUT_SEEDS_FROM, NOISE_PROFILES, SimCase, delay_table, parse_variant, score, score_real,
    score_sim, score_variant, table,
)
from tests.support.paths import REAL_LOGS  # noqa: E402
from tests.support.real_logs import labels  # noqa: E402

ALGOS = ("ppo", "grpo", "dpo")


def sim_faults() -> list[str]:
    from producers.sim import FAULTS

    return [f for f in FAULTS if f != "healthy"] + ["nan_inf:skipped_step"]


def sim_cases(faults, seeds: int, every: list[int], healthy_seeds: int,
              seed_from: int = HELDOUT_SEEDS_FROM, reward: tuple[float, float] = (1.0, 0.0),
              scales: tuple = (), noise: tuple = (), step_scale: float = 1,
              resume: float = 0.0, relaunch: float = 0.0) -> list[SimCase]:
    """The held-out cases; ``reward``: (scale, offset) of the reward as another reward model
    would give it (rlwatch.backtest.reward_as); ``scales``: metric families of another size
    (rlwatch.backtest.scaled_metrics); ``noise``: noisier ones (rlwatch.backtest.noisy_metrics);
    ``step_scale``: step numbers x K (a run counting smaller steps; under 1, a faster run);
    ``resume``: the share of each run before it is first watched (relaunched from a checkpoint);
    ``relaunch``: the share after which each run is relaunched from its checkpoint, watched
    before and after."""
    cases = []
    for fault in faults:
        for i in range(seeds):
            for j, k in enumerate(every):
                algo = ("ppo", "grpo")[(i + j) % 2]          # alternate; the sim falls back
                cases.append(SimCase(fault, algo, seed_from + 10 * i + j, k,
                                     reward_scale=reward[0], reward_offset=reward[1],
                                     metric_scales=scales, metric_noise=noise,
                                     step_scale=step_scale, resume=resume,
                                     relaunch=relaunch))
    for i in range(healthy_seeds):
        for j, k in enumerate(every):
            for algo in ALGOS:
                cases.append(SimCase("healthy", algo, seed_from + 500 + 10 * i + j, k,
                                     reward_scale=reward[0], reward_offset=reward[1],
                                     metric_scales=scales, metric_noise=noise,
                                     step_scale=step_scale, resume=resume,
                                     relaunch=relaunch))
    return cases


def _scales(specs: list[str], option: str) -> tuple:
    """``["entropy/=3", ...]`` as ((prefix, factor), ...); a malformed one exits with its name."""
    out = []
    for spec in specs:
        prefix, sep, factor = spec.rpartition("=")
        try:
            out.append((prefix, float(factor)))
        except ValueError:
            sep = ""
        if not sep or not prefix:
            raise SystemExit(f"{option} {spec!r}: expected PREFIX=NUMBER, e.g. entropy/=3")
    return tuple(out)


def variant_section(pack, specs: list[str], out: dict) -> None:
    """The real logs re-logged as other runs of their families would log them
    (rlwatch.backtest.vary_real): one score line per variant, with the files that fail."""
    print("\n== Real logs re-logged (every=K: every K-th step; every_shifted=K: from the second; "
          "steps=K: steps K times larger; "
          "reward_scale / reward_offset: another reward model; resume=F: first watched after "
          "the share F of the run)")
    labs = labels()
    out["real_variants"] = {}
    for spec in specs:
        report = score_variant(REAL_LOGS, labs, spec, pack)
        failed = [v for v in report.verdicts if v.passed is False]
        print(f"{spec:20s} {report.score.line('files')}")
        for v in failed:
            print(f"    {v.run}: {'; '.join(v.problems) or v.label}")
        out["real_variants"][spec] = report.to_dict()


def real_section(pack, tune: bool, out: dict) -> None:
    print(f"== Real logs ({REAL_LOGS})")
    labs = labels()          # labels.json; the README's label where it says a bare "other"
    t0 = time.time()
    report = score_real(REAL_LOGS, pack, labels=labs)
    print(table(report.verdicts))
    print(f"score: {report.score.line('files')}   ({time.time() - t0:.0f} s)")
    for v in report.verdicts:
        for p in v.problems:
            if v.passed is False:
                print(f"  {v.run}: {p}")
    healthy = [v for v in report.verdicts if v.kind == "quiet"]
    yellow = Counter()
    for v in healthy:
        yellow.update(v.yellow_rules)
    print(f"yellow notices on healthy runs: {dict(yellow)}")
    out["real"] = report.to_dict()

    print("\n== Leave one source out (score on the left-out source's files)")
    tuned_rows = {}
    if tune:
        from rlwatch.tune import leave_one_source_out

        tuned_rows = {row["source"]: row for row in leave_one_source_out(REAL_LOGS, pack, labels=labs)}
    print(f"{'left-out source':58s} {'files':>5s} {'default pack':>14s}" + (f" {'tuned pack':>12s}" if tune else ""))
    for name, s in report.by_source.items():
        line = f"{name[:58]:58s} {s.scored + s.unscored:5d} {s.passed:>6d}/{s.scored:<7d}"
        if tune and name in tuned_rows:
            t = tuned_rows[name]
            line += f" {t['tuned_passed']:>5d}/{t['scored']:<6d} {t.get('note', '')}"
        print(line)
    out["real_by_source"] = {k: s.to_dict() for k, s in report.by_source.items()}
    if tune:
        out["real_loso_tuned"] = list(tuned_rows.values())


def _profile(name: str | None) -> tuple:
    """The noise entries of a named profile (rlwatch.backtest.NOISE_PROFILES)."""
    return NOISE_PROFILES[name] if name else ()


def sim_section(pack, args, out: dict) -> None:
    every = [int(x) for x in args.every.split(",")]
    faults = args.faults.split(",") if args.faults else sim_faults()
    cases = sim_cases(faults, args.seeds, every, args.healthy_seeds, args.seed_from,
                      (args.reward_scale, args.reward_offset), _scales(args.metric_scale, "--metric-scale"),
                      _scales(args.metric_noise, "--metric-noise") + _profile(args.noise_profile),
                      args.step_scale, args.resume, args.relaunch)
    print(f"\n== Simulated runs: {len(cases)} cases, held-out seeds >= {args.seed_from}, "
          f"logging every {', '.join(map(str, every))} steps")
    t0 = time.time()
    done = [0]

    def tick(v):
        done[0] += 1
        if done[0] % 25 == 0:
            print(f"  ... {done[0]}/{len(cases)} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    report = score_sim(cases, args.rules, jobs=args.jobs, progress=tick)
    vs = report.verdicts
    print(f"({time.time() - t0:.0f} s)")

    print(f"\n{'fault':30s} {'caught':>8s} {'median delay':>13s} {'max delay':>10s} {'reached':>8s}  "
          f"{'orange+ before onset':22s} failed runs: seed/every/magnitude:why (miss, alarm before onset)")
    by_fault = defaultdict(list)
    for v in vs:
        if v.kind != "quiet":
            by_fault[v.label].append(v)
    for fault, group in by_fault.items():
        unseen = sum(v.kind == "unscored" for v in group)     # the fault reached no logged point
        group = [v for v in group if v.kind != "unscored"]
        if not group:
            print(f"{fault[:30]:30s} {'-':>8s}  ({unseen} unscored: the fault reached no logged point)")
            continue
        caught = [v for v in group if v.caught is not None]
        d = [v.delay for v in caught if v.delay is not None]
        reached = Counter(v.reached or "none" for v in group).most_common(1)[0][0]
        pre = sum(bool(v.false_alarms) for v in group)   # notify-only: orange+ anywhere
        missed = [f"{v.extra.get('seed')}/{v.extra.get('log_every')}/"
                  f"{'-' if v.extra.get('magnitude') is None else format(v.extra['magnitude'], '.2f')}"
                  f":{'miss' if v.caught is None else 'alarm'}"
                  for v in group if v.passed is False][:4]
        print(f"{fault[:30]:30s} {len(caught):>3d}/{len(group):<4d} "
              f"{(f'{statistics.median(d):.0f}' if d else '-'):>13s} {(str(max(d)) if d else '-'):>10s} "
              f"{reached:>8s}  {pre:<22d} {' '.join(missed)}"
              + (f"  ({unseen} unscored: the fault reached no logged point)" if unseen else ""))

    healthy = [v for v in vs if v.kind == "quiet"]
    print(f"\nHealthy runs: {len(healthy)} ({sum(v.steps for v in healthy)} steps)")
    for k in every:
        for algo in ALGOS:
            hs = [v for v in healthy if v.extra.get("log_every") == k and v.extra.get("algo") == algo]
            if not hs:
                continue
            s = score(hs)
            loud = Counter(h.rule for v in hs for h in v.loud)
            yellow = Counter()
            for v in hs:
                yellow.update(v.yellow_rules)
            print(f"  every {k:2d} {algo:4s}: {len(hs)} runs, orange+ on {s.alarmed_runs}, "
                  f"yellow {s.yellow_per_1k:.2f}/1k steps" + (f" {dict(yellow)}" if yellow else "")
                  + (f"; orange+: {dict(loud)}" if loud else ""))

    s = report.score
    print(f"\nscore: {s.line('simulated runs')}")
    print(f"recall {s.recall:.3f} (target >= 0.95); runs with orange+ on healthy or before the onset: "
          f"{s.alarmed_runs} (target 0); yellow per 1,000 healthy steps {s.yellow_per_1k:.2f} (target <= 1)")
    for k in every:
        sk = score(v for v in vs if v.extra.get("log_every") == k)
        print(f"  logging every {k:2d}: recall {sk.recall:.3f}, alarmed runs {sk.alarmed_runs}, "
              f"yellow/1k {sk.yellow_per_1k:.2f}")

    print("\nDetection delay (steps after the onset) against fault magnitude")
    print(f"{'magnitude':15s} {'every':>5s} {'caught':>9s} {'median':>7s} {'p90':>6s}")
    for row in delay_table(vs):
        med = "-" if row["median_delay"] is None else f"{row['median_delay']:.0f}"
        p90 = "-" if row["p90_delay"] is None else str(row["p90_delay"])
        print(f"{row['magnitude']:15s} {row['log_every']:>5d} {row['caught']:>4d}/{row['runs']:<4d} {med:>7s} {p90:>6s}")
    out["sim"] = report.to_dict()


def _share(text: str) -> float:
    """A share of a run's steps, 0 to under 1 (argparse type)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share of the run's steps, 0 to under 1")
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", default="rlhf")
    ap.add_argument("--seeds", type=int, default=2, help="held-out seeds per fault and logging interval")
    ap.add_argument("--healthy-seeds", type=int, default=2, help="held-out healthy runs per algorithm and interval")
    ap.add_argument("--every", default="1,5,10")
    ap.add_argument("--seed-from", type=int, default=HELDOUT_SEEDS_FROM,
                    help="first seed (seeds a previous tuning looked at are no longer held out: "
                         "pick a fresh base to measure)")
    ap.add_argument("--faults", help="comma-separated fault ids (default: every fault)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reward-scale", type=float, default=1.0,
                    help="simulated runs: the reward as another reward model gives it, scale * r + offset")
    ap.add_argument("--reward-offset", type=float, default=0.0)
    ap.add_argument("--metric-scale", action="append", default=[], metavar="PREFIX=FACTOR",
                    help="simulated runs: metrics whose name starts with PREFIX multiplied by "
                         "FACTOR, as a run of another size logs them (entropy/=3, grad_norm/=10, "
                         "response/length=4: its per-sample lengths too); repeatable")
    ap.add_argument("--metric-noise", action="append", default=[], metavar="PREFIX=SD",
                    help="simulated runs: metrics whose name starts with PREFIX scattered by a "
                         "relative SD per logged step, as a noisier run logs them "
                         "(entropy/mean=0.2); repeatable")
    ap.add_argument("--noise-profile", choices=sorted(NOISE_PROFILES), default=None,
                    help="simulated runs: every metric family scattered as much from point to "
                         "point as public runs scatter (rlwatch.backtest.REAL_NOISE: the simulator "
                         "is about ten times smoother); added to --metric-noise")
    ap.add_argument("--step-scale", type=float, default=1, metavar="K",
                    help="simulated runs: step numbers x K, as a run that counts K times smaller "
                         "steps (micro-batches, samples) logs the same training; onsets and "
                         "windows x K; K = 0.5: a run twice as fast (every other step kept, its "
                         "number halved)")
    ap.add_argument("--resume", type=_share, default=0.0, metavar="F",
                    help="simulated runs: first watched after the share F of their steps (a run "
                         "rlwatch never saw before, its warm-up mid-training); faults that began "
                         "before are unscored")
    ap.add_argument("--relaunch", type=_share, default=0.0, metavar="F",
                    help="simulated runs: relaunched after the share F of their steps (a new "
                         "incarnation from there on, as a run preempted and resumed from a "
                         "checkpoint of its last step), watched before and after")
    ap.add_argument("--real-variant", action="append", default=[], metavar="NAME=NUMBER",
                    help="also score the real logs re-logged as another run of their family "
                         "would log them: every=K (every K-th step kept), every_shifted=K (the "
                         "same from the second logged step), steps=K (step numbers "
                         "x K), reward_scale=K, reward_offset=B, resume=F (first watched after "
                         "the share F of the run); repeatable")
    ap.add_argument("--real-only", action="store_true")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--tune", action="store_true", help="also score a pack tuned on the other sources")
    ap.add_argument("--json", help="write every verdict and score as JSON to this file")
    args = ap.parse_args()
    if not args.step_scale > 0:
        ap.error(f"--step-scale {args.step_scale:g}: step numbers are scaled by a number over 0")
    for spec in args.real_variant:
        try:
            parse_variant(spec)
        except ValueError as e:
            ap.error(str(e))
    from rules.loader import load_pack

    pack = load_pack(args.rules)
    out: dict = {}
    if not args.sim_only and not (REAL_LOGS / "labels.json").exists():
        msg = f"no real logs at {REAL_LOGS} (labels.json missing): they are not scored"
        if args.real_only:
            sys.exit(f"backtest: {msg}")
        print(f"== Real logs: {msg}", file=sys.stderr)
    elif not args.sim_only:
        real_section(pack, args.tune, out)
        if args.real_variant:
            variant_section(pack, args.real_variant, out)
    if not args.real_only:
        sim_section(pack, args, out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()

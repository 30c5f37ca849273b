"""Command-line glue for ``rlwatch backtest DIR`` (rlwatch/backtest.py) and ``rlwatch rules tune
DIR`` (rlwatch/tune.py): parsers, text tables, errors as one line. rlwatch/cli.py registers the
parsers (``add_backtest_parser``, ``add_tune_parser``) and dispatches ``rules tune`` here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlwatch.backtest import Verdict, load_labels, parse_variant, score, score_real, score_variant, table
from rlwatch.tune import _labels_or_all, compare, leave_one_source_out, overrides_yaml, tuned_packs

__all__ = ["add_backtest_parser", "add_tune_parser", "cli_backtest", "cli_tune"]


# -- rlwatch backtest DIR -------------------------------------------------------------------------


# -- command line -------------------------------------------------------------------------------

def add_backtest_parser(sub) -> None:
    """``rlwatch backtest DIR``: registered on the CLI's subparsers."""
    b = sub.add_parser(
        "backtest", help="score a rule pack on labelled recorded runs (DIR/labels.json)",
        description="Replay every labelled run of DIR (labels.json beside the logs: {file: {label, "
                    "onset, preset?, max_delay?, source?}}) and judge it by its own rule(s): caught at "
                    "the required severity within its window, nothing orange or above and no brake "
                    "before the onset, healthy runs quiet. Prints a table and a one-line score.")
    b.add_argument("dir")
    b.add_argument("--rules", help="built-in pack name or rule file(s), comma-separated (default rlhf)")
    b.add_argument("--sources", help="JSON file {run file: source}, for scores per source "
                                     "(a labels.json entry's own 'source' is used otherwise)")
    b.add_argument("--tune", action="store_true",
                   help="also score each source with parameters learnt (rules tune) on the other "
                        "sources' healthy runs")
    b.add_argument("--variant", action="append", default=[], metavar="NAME=K",
                   help="also score the runs re-logged as another run of their family would log "
                        "them: every=K (every K-th step kept), steps=K (step numbers x K), "
                        "reward_scale=K, reward_offset=B (another reward model); repeatable. "
                        "Reported beside the score; the exit status is the files' own")
    b.add_argument("--json", action="store_true", help="one JSON document: score, per-source scores, verdicts")
    b.set_defaults(fn=cli_backtest)


def cli_backtest(args) -> int:
    directory = Path(args.dir)
    if not directory.is_dir():
        raise SystemExit(f"rlwatch backtest: {directory} is not a directory")
    for spec in args.variant:
        try:
            parse_variant(spec)
        except ValueError as exc:
            raise SystemExit(f"rlwatch backtest: --variant {exc}") from None
    sources = None
    if args.sources:
        try:
            sources = json.loads(Path(args.sources).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"rlwatch backtest: --sources {args.sources}: {exc}") from None
    try:
        labels = load_labels(directory, sources)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"rlwatch backtest: {exc}") from None
    missing = [lab.run for lab in labels if not (directory / lab.run).exists()]
    if missing:
        raise SystemExit(f"rlwatch backtest: labelled but not in {directory}: {', '.join(missing)}")
    from rules.loader import RuleFileError, load_pack, merge_packs

    try:
        names = [n.strip() for n in (args.rules or "rlhf").split(",") if n.strip()] or ["rlhf"]
        packs = [load_pack(n) for n in names]
    except RuleFileError as exc:
        raise SystemExit(f"rlwatch backtest: {exc}") from None
    pack = packs[0] if len(packs) == 1 else merge_packs(*packs)
    report = score_real(directory, pack, labels=labels)
    loso = None
    if args.tune:
        loso = leave_one_source_out(directory, pack, labels=labels)
    variants = {spec: score_variant(directory, labels, spec, pack) for spec in args.variant}
    if args.json:
        doc = report.to_dict()
        if loso is not None:
            doc["leave_one_source_out"] = loso
        if variants:
            doc["variants"] = {spec: r.to_dict() for spec, r in variants.items()}
        print(json.dumps(doc, default=str))
        return _status(report)
    print(table(report.verdicts))
    for v in report.verdicts:
        if v.passed is False:
            print(f"  {v.run}: {'; '.join(v.problems)}")
    if len(report.by_source) > 1 or loso:
        print(f"\n{'source':50s} {'files':>5s} {'pass':>9s}" + (f" {'tuned (learnt on the others)':>30s}" if loso else ""))
        tuned = {row["source"]: row for row in (loso or [])}
        for name, s in report.by_source.items():
            line = f"{name[:50]:50s} {s.scored + s.unscored:5d} {s.passed:>4d}/{s.scored:<4d}"
            if name in tuned:
                line += f" {tuned[name]['tuned_passed']:>4d}/{tuned[name]['scored']:<4d} {tuned[name]['note']}"
            print(line)
    print(f"\nscore: {report.score.line('files')}")
    for spec, r in variants.items():
        print(f"re-logged {spec}: {r.score.line('files')}")
        for v in r.verdicts:
            if v.passed is False:
                print(f"  {v.run}: {'; '.join(v.problems)}")
    blind = [v.run for v in report.verdicts if v.extra.get("watched") == 0]
    if blind:
        print(f"rlwatch backtest: WARNING: no rule had its inputs on {', '.join(blind)}: "
              "their silence means nothing (the pack has no rule for their metrics, or the preset is wrong)", file=sys.stderr)
    return _status(report)


def _status(report) -> int:
    """1 when a scored file failed (so that a team's CI can gate a pack change on it), else 0."""
    return 1 if any(v.passed is False for v in report.verdicts) else 0


# -- rlwatch rules tune DIR ----------------------------------------------------------------------


# -- command line -------------------------------------------------------------------------------

def add_tune_parser(rsub) -> None:
    """``rlwatch rules tune DIR``: registered on the ``rules`` subparsers (the ``rules`` command
    dispatches ``tune`` to :func:`cli_tune`)."""
    tu = rsub.add_parser(
        "tune", help="learn parameters from the healthy past runs in DIR; write an overrides file",
        description="Learn per-metric parameters (KL level, noise scale, floors, spikes) from the "
                    "healthy runs of DIR (labels.json marks them; without it every run is taken as "
                    "healthy), write them as an overrides file, and report what the tuned pack "
                    "catches on the faulty runs of DIR compared with the default pack.")
    tu.add_argument("dir")
    tu.add_argument("--rules", help="the pack to tune (default rlhf)")
    tu.add_argument("--preset", help="tune for the runs of this preset (default: the most common)")
    tu.add_argument("--out", help="write the overrides file here (default: print it)")
    tu.add_argument("--runs", help="glob on run ids the overrides apply to (default *)")
    tu.add_argument("--json", action="store_true")


def cli_tune(args) -> int:
    """``rlwatch rules tune DIR [--rules PACK] [--preset NAME] [--out FILE] [--runs GLOB] [--json]``."""
    from rlwatch.backtest import as_pack

    directory = Path(args.dir)
    if not directory.is_dir():
        raise SystemExit(f"rlwatch rules tune: {directory} is not a directory")
    pack = as_pack(args.rules or "rlhf")
    labels = _labels_or_all(directory, None)
    results = tuned_packs(directory, pack, labels)
    if not results:
        raise SystemExit(f"rlwatch rules tune: no healthy run in {directory} "
                         "(labels.json marks them \"healthy\"; without it every run is taken as healthy)")
    name = args.preset if args.preset else max(results, key=lambda k: len(results[k].profile.runs))
    if name not in results:
        raise SystemExit(f"rlwatch rules tune: no healthy {args.preset} run in {directory} "
                         f"(found: {', '.join(str(k) for k in results)})")
    res = results[name]
    others = [k for k in results if k != name]
    text = overrides_yaml(res, args.runs or "*")
    faulty = [lab for lab in labels if lab.label != "healthy"
              and (lab.preset or None) in (name, None)]
    comp = compare(directory, pack, {name: res}, [lab for lab in labels
                                                  if lab.preset in (name, None)]) if labels else []
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        print(json.dumps({"tuning": res.to_dict(), "overrides": text, "out": args.out,
                          "other_presets": others, "runs": [c.to_dict() for c in comp]}, default=str))
        return 0
    print(f"learnt from {len(res.profile.runs)} healthy run(s) of preset {name or '(none)'}"
          + (f"; runs of other presets ({', '.join(str(o) for o in others)}) were left out: "
             f"--preset to tune those" if others else ""))
    for c in res.changes:
        print(f"  {c['what']:32s} {str(c['default']):>10s} -> {c['learnt']:<10g} {c['why']}")
    if not res.changes:
        print("  nothing the pack declares could be learnt from these runs")
    for u in res.unused:
        print(f"  (learnt, no parameter yet) {u['what']} = {u['learnt']:g}: {u['why']}")
    if not args.out:
        print("\n" + text)
    else:
        print(f"wrote {args.out} (use: --rules {args.rules or 'rlhf'},{args.out})")
    if comp:
        print(f"\n{'run':44s} {'label':28s} {'default pack':28s} {'tuned pack':28s} change")
        for c in comp:
            print(f"{c.run[:44]:44s} {c.label[:28]:28s} {_brief(c.default):28s} {_brief(c.tuned):28s} {c.change}")
        sd, st = score(c.default for c in comp), score(c.tuned for c in comp)
        print(f"default: {sd.line('runs')}\ntuned:   {st.line('runs')}")
        if faulty and all(c.label == "healthy" for c in comp):
            print("(no faulty run of this preset in the directory)", file=sys.stderr)
        print("(the healthy runs are the ones it learnt from: `rlwatch backtest --tune` scores each "
              "source with parameters learnt on the others)")
    return 0


def _brief(v: Verdict) -> str:
    if v.kind == "quiet":
        return "quiet" if v.passed else f"alarms ({v.false_alarms[0]})" if v.false_alarms else "braked"
    if v.kind == "unscored":
        return "unscored"
    if v.caught is None:
        return f"missed ({v.reached or 'silent'})"
    return f"{v.caught.rule} {v.caught.severity} {v.delay:+d}" + (" +alarms" if v.false_alarms else "")

"""The labelled real logs in ``shared/real-logs``: which source repository each file comes from
(the README's table), for leave-one-source-out scoring. Test and bench code only: product code
never names these files or repositories."""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import REAL_LOGS


def sources(directory: Path = REAL_LOGS) -> dict[str, str]:
    """file name -> source repository (``owner/name``), from the README's table rows
    ``| file | owner/name / path @ commit | ...``."""
    out: dict[str, str] = {}
    readme = Path(directory) / "README.md"
    for line in readme.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].endswith(".jsonl"):
            continue
        out[cells[0]] = cells[1].split(" / ")[0].strip()
    return out


def readme_labels(directory: Path = REAL_LOGS) -> dict[str, tuple[str, int | None]]:
    """file name -> (label, onset) as the README's table gives them: the label cell's first word
    (``healthy (noisy truncation)`` -> ``healthy``, ``truncation (→ stagnation)`` ->
    ``truncation``) and the onset cell's leading number (``-`` -> None)."""
    out: dict[str, tuple[str, int | None]] = {}
    readme = Path(directory) / "README.md"
    for line in readme.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 6 or not cells[0].endswith(".jsonl"):
            continue
        label = cells[4].split()[0] if cells[4] else ""
        digits = ""
        for ch in cells[5]:
            if not ch.isdigit():
                break
            digits += ch
        out[cells[0]] = (label, int(digits) if digits else None)
    return out


def labels(directory: Path = REAL_LOGS):
    """The labels of ``directory/labels.json`` with each source, where an entry says only a bare
    ``"other"``, the README's label and onset for that file instead (labels.json keeps "other" for
    files whose catalog id did not exist when they were labelled; the README names it)."""
    from dataclasses import replace

    from rlwatch.backtest import load_labels

    readme = readme_labels(directory)
    out = []
    for lab in load_labels(directory, sources(directory)):
        if lab.label == "other" and lab.run in readme:
            label, onset = readme[lab.run]
            lab = replace(lab, label=label, onset=onset if label != "healthy" else None)
        out.append(lab)
    return out

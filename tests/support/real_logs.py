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

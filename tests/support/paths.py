"""Where the shared specification and real logs are: ``shared/`` beside the repository (as
for developers and in CI, where a copy of it lies beside the clone)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
REAL_LOGS = SHARED / "real-logs"
FAILURE_MODES = SHARED / "spec" / "failure-modes.md"

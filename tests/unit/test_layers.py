"""The house: the contract at the bottom, entry points on top, every import pointing down.

Reads every project module's imports (the module level and inside functions alike) and fails on
an upward edge between packages, on a cycle between modules, on a training-side SDK that pulls
in the monitor, and on a pure-core module that imports an edge (Kafka, Redis, Slack, HTTP, a
clock).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "rules", "streams", "alerts", "producers", "web", "rlwatch")

#: What each package may import (besides itself). Bottom to top.
ALLOWED = {
    "contract": set(),
    "rules": {"contract"},
    "alerts": {"contract"},
    "producers": {"contract"},
    "streams": {"contract", "rules", "alerts"},     # alerts: only the Faust edge (streams/app.py)
    "web": {"contract", "rules", "streams", "alerts"},
    "rlwatch": {"contract", "rules", "streams", "alerts", "producers", "web"},
}

#: The pure core: inputs and the time are arguments; no I/O library, no clock.
PURE = ("contract/", "rules/", "streams/stats/", "streams/signals.py", "streams/run.py",
        "streams/ranks.py", "streams/read_marks.py",
        "streams/processor.py", "alerts/routing.py", "alerts/matchers.py", "alerts/actions.py",
        "alerts/render.py", "alerts/routes_file.py", "alerts/intervals.py", "alerts/grouping.py",
        "alerts/inhibition.py", "alerts/retry.py", "alerts/operator.py")
EDGE_LIBRARIES = {"kafka", "aiokafka", "faust", "redis", "slack_sdk", "aiohttp", "httpx",
                  "requests", "urllib", "socket", "time", "asyncio", "threading"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if "frontend" in rel.parts or "node_modules" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """Absolute names this module imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)   # `from pkg import module`
    return names


def _project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        targets = set()
        for name in _imports(mod, path):
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                targets.add(name)
        edges[mod] = targets
    return edges


EDGES = _project_edges()


def test_the_layers_are_found():
    assert {"contract.events", "rules.engine", "streams.processor", "alerts.dispatch",
            "producers.monitor", "rlwatch.cli"} <= set(MODULES)


def test_no_package_imports_one_above_it():
    upward = []
    for mod, targets in EDGES.items():
        pkg = mod.split(".")[0]
        for t in targets:
            other = t.split(".")[0]
            if other != pkg and other not in ALLOWED[pkg]:
                upward.append(f"{mod} -> {t}")
    assert not upward, "imports that run up the layers:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    # Tarjan's strongly connected components over the module graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in EDGES.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(EDGES):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other in a loop:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_training_side_sdk_imports_only_the_contract():
    sdk = [m for m in MODULES if m.startswith("producers")]
    bad = [f"{m} -> {t}" for m in sdk for t in EDGES[m]
           if t.split(".")[0] not in ("producers", "contract")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items()
                                          if str(p.relative_to(ROOT)).startswith(PURE)))
def test_the_pure_core_imports_no_edge(module):
    used = {n.split(".")[0] for n in _imports(module, MODULES[module])}
    assert not used & EDGE_LIBRARIES, f"{module} imports {sorted(used & EDGE_LIBRARIES)}"

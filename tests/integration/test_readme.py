"""The README's two quick-start commands, exactly as written, on a clean clone of this repository.

1. The first command for real: install into the clone's ``.venv``, activate it, run the demo
   (its faulty run is paused). Then what the README shows next, in the same shell: ``rlwatch``
   status, silence and incidents on the real Redis, the worker and dashboard modules importable,
   and the SDK publishing to the real Kafka.
2. The second command starts and resolves: ``scripts/test.sh`` installs the test extras, starts
   the services and hands over to pytest (asked only to collect one file, so the suite does not
   run itself).

The clone is made afresh each time (``git clone`` of this repository's HEAD, into
.local/readme/rlwatch). Its ``.venv`` alone is kept from the previous test run, so that the suite
does not download the dependencies each time; the first run, or any change to pyproject.toml,
installs for real. ``RLWATCH_README_FRESH=1`` starts without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid

import pytest

from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration
HERE = ROOT / ".local" / "readme"


def quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", readme, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def fresh_clone(keep_venv: bool):
    """A new ``git clone`` of this repository at a fixed path, with the previous ``.venv`` kept
    (a virtualenv cannot move: its scripts name their own path)."""
    clone, tmp = HERE / "rlwatch", HERE / "clone-tmp"
    clone.mkdir(parents=True, exist_ok=True)
    for child in clone.iterdir():
        if child.name == ".venv" and keep_venv:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp)], check=True, timeout=120)
    for child in tmp.iterdir():
        shutil.move(str(child), str(clone / child.name))
    tmp.rmdir()
    return clone


def clean_shell_env() -> dict[str, str]:
    """The environment of a new shell: no virtualenv active, no rlwatch settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLWATCH_", "VIRTUAL_ENV", "PYTHON", "PYTEST"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "activate")))
    return env


def shell(cmd: str, cwd, env, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_readme_quick_start_on_a_clean_clone(services):
    install_and_demo, test_suite = quick_start()
    assert install_and_demo.startswith("scripts/install.sh && . .venv/bin/activate && rlwatch demo")
    assert test_suite == "scripts/test.sh"

    clone = fresh_clone(keep_venv=not os.environ.get("RLWATCH_README_FRESH"))
    env = clean_shell_env()

    # 1. as written, then what the README shows next, in the same shell
    sid = uuid.uuid4().hex[:6]
    after = " && ".join([
        "rlwatch --version",
        "rlwatch status --json > /dev/null",
        "rlwatch silence list",
        "rlwatch incidents list",
        "python -c 'import streams.app, web.server, alerts.control'",
        # the SDK publishes to the real broker (kafka-python is installed with it)
        "python -c \"from producers import Monitor; m = Monitor('readme-" + sid + "', topic='readme." + sid +
        "', redis=False, heartbeat_seconds=0); m.log(0, {'kl/mean': 0.01}); "
        "assert m.flush(30) and m.dropped == 0; m.close(5); print('published')\"",
    ])
    r = shell(f"{install_and_demo} && {after}", clone, env, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert "worker ppo-kl-blowup is PAUSED" in r.stdout          # the demo's brake
    assert "\nrlwatch 0." in r.stdout and "published" in r.stdout
    # the install built the native core (Rust, cargo is on this kind of machine): a fleet needs it
    assert "(native core)" in r.stdout, out[-4000:]

    # 2. the test command resolves and starts; pytest is asked only to collect one file
    r = shell(f"{test_suite} --collect-only tests/unit/test_cli.py", clone, env, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "tests/unit/test_cli.py::test_version" in out, out[-2000:]          # pytest listed the tests

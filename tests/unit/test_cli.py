"""The command line a new user meets: one clear line and a non-zero exit for every mistake of
issue 13 that needs no broker (the ones that need Redis or Kafka are in
tests/integration/test_cli_services.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlwatch.cli import main

ROOT = Path(__file__).resolve().parents[2]


def rlwatch(*args: str, env_extra: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RLWATCH_REDIS"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_clear_line(r: subprocess.CompletedProcess) -> str:
    """The process failed with exit 1 and said why in one line, without a traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def fails(argv: list[str], monkeypatch=None, env: dict | None = None) -> str:
    """``rlwatch argv`` in process: it stops with SystemExit and a one-line message (what the
    user sees on stderr, with exit status 1)."""
    if monkeypatch is not None:
        monkeypatch.delenv("RLWATCH_REDIS", raising=False)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    msg = exc.value.code
    assert isinstance(msg, str) and "\n" not in msg.strip(), msg
    return msg


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("rlwatch 0.")


def test_a_redis_address_without_its_scheme_is_one_clear_line_without_a_traceback():
    line = one_clear_line(rlwatch("status", "--redis", "localhost:6379"))
    assert line == ("rlwatch status: --redis must be a URL such as redis://localhost:6379/0 (got "
                    "'localhost:6379'; rediss:// for TLS, redis://:PASSWORD@HOST:PORT/DB with a password)")


def test_an_adjust_with_a_bad_factor_is_refused_before_anything_is_sent(monkeypatch):
    """(Redis on port 1 is unreachable: the message would say so had it been tried first.)"""
    for argv, says in [(["beta=abc"], "rlwatch adjust: beta=abc: the value must be a number (e.g. beta=1.5)"),
                       (["beta=1.5", "beta=2"], "rlwatch adjust: beta is given twice"),
                       (["kl"], "rlwatch adjust: 'kl' is not name=number (e.g. beta=1.5)")]:
        assert fails(["adjust", "some-run", *argv, "--redis", "redis://127.0.0.1:1/0"], monkeypatch) == says


@pytest.mark.parametrize("argv", [["status"], ["pause", "some-run"], ["silence", "list"],
                                  ["adjust", "some-run", "beta=2"], ["rollback", "some-run"],
                                  ["incidents", "list"], ["worker"], ["web"]])
def test_every_command_checks_the_redis_address(argv, monkeypatch):
    msg = fails([*argv, "--redis", "localhost:6379"], monkeypatch)
    assert msg.startswith(f"rlwatch {argv[0]}: --redis must be a URL such as redis://localhost:6379/0")
    msg = fails(argv, monkeypatch, {"RLWATCH_REDIS": "10.0.0.5:6379"})
    assert msg.startswith(f"rlwatch {argv[0]}: RLWATCH_REDIS must be a URL")


def test_worker_with_a_missing_or_bad_rule_file_stops_at_once(tmp_path, monkeypatch):
    assert "nope.yaml: no such rule file" in fails(["worker", "--rules", str(tmp_path / "nope.yaml")],
                                                   monkeypatch)
    bad = tmp_path / "bad.yaml"
    bad.write_text("pack: mine\nrules:\n  - id: x\n    tiers:\n      - severity: purple\n"
                   "        when: {metric: kl/mean, above: 1}\n")
    with pytest.raises(SystemExit) as exc:
        main(["worker", "--rules", f"rlhf,{bad}"])
    assert f"{bad}:5:" in exc.value.code and "severity" in exc.value.code


def test_worker_with_redis_down_stops_with_one_line(monkeypatch):
    msg = fails(["worker", "--redis", "redis://127.0.0.1:1/0"], monkeypatch)
    assert msg.startswith("rlwatch worker: cannot reach Redis at redis://127.0.0.1:1/0")
    assert "scripts/services.sh start" in msg


@pytest.mark.parametrize("missing,argv,extra,module", [("faust", ["worker"], "worker", "streams.app"),
                                                       ("aiohttp", ["web"], "web", "web.server"),
                                                       ("redis", ["status"], "worker", "alerts.control")])
def test_a_missing_extra_is_named_with_how_to_install_it(missing, argv, extra, module, monkeypatch, capsys):
    monkeypatch.delenv("RLWATCH_REDIS", raising=False)
    monkeypatch.setitem(sys.modules, missing, None)       # as if it were not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    assert main(argv) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line
    assert f"the Python package {missing!r} is not installed" in line
    assert f"pip install 'rlwatch[{extra}]'" in line and "scripts/install.sh" in line


def test_a_silence_duration_needs_a_unit(monkeypatch):
    msg = fails(["silence", "add", "run=x", "--duration", "2"], monkeypatch)
    assert msg.startswith("rlwatch silence: --duration 2 has no unit: say 30m, 2h or 1d")


def test_replay_of_an_empty_or_garbage_file_fails(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["replay", str(empty)]) == 1
    assert "nothing was replayed: the file(s) hold no events" in capsys.readouterr().err
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n{also not\n")
    assert main(["replay", str(garbage)]) == 1
    assert "nothing was replayed: every line was skipped" in capsys.readouterr().err


def test_rules_list_takes_the_comma_lists_worker_and_replay_take(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text("pack: mine\nrules:\n  - id: my_rule\n    title: My rule\n    tiers:\n"
                    "      - severity: red\n        when: {metric: kl/mean, above: 1}\n")
    assert main(["rules", "list", "--rules", f"rlhf,{mine}"]) == 0
    cap = capsys.readouterr()
    ids = [line.split()[0] for line in cap.out.splitlines() if line.strip()]
    assert "my_rule" in ids and "kl_above_target" in ids
    assert "in pack 'rlhf+mine'" in cap.err


def test_status_json_says_nothing_on_stdout_when_redis_is_unreachable(monkeypatch, capsys):
    # the one line goes to stderr; stdout holds nothing that a JSON reader would trip on
    assert "cannot reach Redis" in fails(["status", "--json", "--redis", "redis://127.0.0.1:1/0"], monkeypatch)
    assert capsys.readouterr().out == ""


def test_the_readme_names_only_commands_that_exist():
    """Every `rlwatch ...` subcommand the README shows is one the parser knows."""
    import re

    from rlwatch.cli import build_parser

    known = set(build_parser()._subparsers._group_actions[0].choices)
    readme = (ROOT / "README.md").read_text()
    used = set(re.findall(r"(?:^|`|\| |&& )rlwatch ([a-z]+)", readme, re.M))
    assert {"demo", "worker", "status", "pause", "web", "silence", "incidents"} <= used
    assert used <= known, used - known


def test_replay_of_a_tensorboard_file_without_google_crc32c_is_one_clear_line(tmp_path, monkeypatch, capsys):
    import producers.recorded.tensorboard as tb

    path = tmp_path / "events.out.tfevents.1700000000.host.1.0"
    path.write_bytes(b"\x00" * 64)
    monkeypatch.setattr(tb, "_crc_value", None)        # as if google-crc32c were not installed
    monkeypatch.setattr(tb, "_crc_extend", None)
    assert main(["replay", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlwatch replay:") and "google-crc32c" in err and "Traceback" not in err


@pytest.mark.parametrize("value, message", [
    ("0.5", "rlwatch worker: RLWATCH_FETCH_MB must be between 1 and 64 (MB a fetch takes of each "
            "partition at most), got 0.5"),
    ("100", "rlwatch worker: RLWATCH_FETCH_MB must be between 1 and 64 (MB a fetch takes of each "
            "partition at most), got 100"),
    ("lots", "rlwatch: RLWATCH_FETCH_MB must be a number, got 'lots'")])
def test_a_worker_fetch_size_out_of_range_or_not_a_number_is_one_clear_line(value, message, monkeypatch):
    assert fails(["worker"], monkeypatch, {"RLWATCH_FETCH_MB": value}) == message


@pytest.mark.parametrize("name, value", [("RLWATCH_BRAKE_RESEND_SECONDS", "0"),
                                         ("RLWATCH_BRAKE_RESEND_MAX_SECONDS", "-5"),
                                         ("RLWATCH_BRAKE_RESEND_SECONDS", "nan")])
def test_a_brake_re_send_wait_that_is_not_positive_is_one_clear_line(name, value, monkeypatch):
    assert fails(["worker"], monkeypatch, {name: value}) == (
        f"rlwatch worker: {name} must be a positive number of seconds (the waits between re-sends "
        f"of an unacknowledged brake), got {float(value):g}")


def test_the_worker_fetches_what_rlwatch_fetch_mb_says_of_each_partition(monkeypatch):
    from contract.settings import Settings
    from streams.app import build_app

    assert Settings().fetch_mb == 16.0
    monkeypatch.setenv("RLWATCH_FETCH_MB", "2.5")
    settings = Settings.from_env(redis="redis://127.0.0.1:1/0")
    assert settings.fetch_mb == 2.5
    app = build_app(settings)
    assert app.conf.consumer_max_fetch_size == int(2.5 * (1 << 20))  # (aiokafka's max_partition_fetch_bytes)

"""The core's benchmark still runs (benchmarks are not timed in tests, but they must not rot):
a tiny fleet through every reader, slice by slice, with the figures it promises printed."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit._core import needs_native

ROOT = Path(__file__).resolve().parents[2]


def bench(name: str, *args: str) -> str:
    """What ``bench/<name>`` prints with ``args``; it must exit 0."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / name), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_fleet_benchmark_prints_every_reader_and_both_ratios():
    text = bench("bench_fleet_replay.py", "--runs", "2", "--steps", "60", "--repeats", "1",
                 "--slices", "5")
    for reader in ("json.loads loop", "reference detector", "rlwatch core", "rlwatch core by run"):
        assert re.search(rf"^{re.escape(reader)}\s+[\d,]+$", text, re.M), text
    assert re.search(r"rlwatch / json.loads floor:\s+\d+\.\d\d", text), text
    assert re.search(r"rlwatch / reference detector:\s+\d+\.\d\d", text), text
    # a run at a time: the same alerts as in the file's order
    by_run = re.search(r"rlwatch by run / in order:\s+\d+\.\d\d \(blocks of \d+ events; "
                       r"alerts: (\d+) and (\d+)\)", text)
    assert by_run and by_run.group(1) == by_run.group(2), text
    native = re.search(r"alerts: native (\d+), pure (\d+)", text)
    if native:     # the native and the pure core raise the same alerts on the same file
        assert native.group(1) == native.group(2)


@needs_native      # (routine rank steps are the native core's)
def test_the_fleet_benchmark_by_kind_counts_every_event_once_and_shares_the_whole_pass():
    text = bench("bench_fleet_replay.py", "--runs", "2", "--steps", "60", "--repeats", "1",
                 "--slices", "5", "--by-kind")
    events = int(re.search(r"^fleet: .*: (\d+) events", text, re.M).group(1))
    rows = re.findall(r"^(.+?)\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)%$", text, re.M)
    kinds = {k.strip(): int(n) for k, n, _, _ in rows}
    assert sum(kinds.values()) == events, text
    assert kinds.get("routine rank step", 0) > 0 and kinds.get("rank-0 step", 0) > 0, text
    assert abs(sum(float(share) for *_, share in rows) - 100) < 0.5, text


def test_the_alert_json_benchmark_checks_both_ways_and_prints_their_ratios():
    text = bench("bench_alert_json.py", "--runs", "4", "--steps", "200", "--repeats", "1")
    n = re.search(r"^(\d+) alerts of 4 runs, (\d+) with a snapshot", text, re.M)
    assert n and int(n.group(1)) > 0 and int(n.group(2)) > 0, text
    for way in ("model_dump + strict_json (before)", "model_dump_json (now)",
                "json.dumps (before)", "pydantic_core.to_json (now)"):
        assert re.search(rf"{re.escape(way)}\s+\d+\.\d\s+\d+\.\d$", text, re.M), text
    assert re.search(r"^alert: before / now\s+\d+\.\dx", text, re.M), text
    assert re.search(r"^incident: before / now\s+\d+\.\dx", text, re.M), text


def test_the_snapshot_benchmark_prints_the_cost_per_alert_and_both_ways_to_read_a_kept_step():
    text = bench("bench_snapshot.py", "--runs", "5", "--steps", "200", "--repeats", "1",
                 "--alerts", "10")
    assert re.search(r"^snapshot \+ alert JSON, built when each alert fires, CPU ms per alert: steps read "
                     r"once while among the last \d+ read: \d+\.\d{3}; each snapshot reading its steps "
                     r"again: \d+\.\d{3}$", text, re.M), text
    for rows in ("numbers only", "non-finite spellings"):     # the fifth run sends "NaN"
        assert re.search(rf"^  {rows}\s+\d+\.\d\s+\d+\.\d\s+\d+\.\d\d", text, re.M), text


def test_the_kafka_benchmark_reads_each_threads_idle_share_from_a_py_spy_record(tmp_path):
    """``bench_worker_kafka.py --spy F --spy-idle``: the share of each thread's samples in
    which it had nothing to do (the events lane idle is throughput lost)."""
    record = tmp_path / "spy.txt"
    loop = "thread (1): MainThread;BaseEventLoop.run_forever (asyncio/base_events.py:607)"
    record.write_text(
        f"{loop};BaseEventLoop._run_once (asyncio/base_events.py:1922);take (streams/app.py:1) 3\n"
        f"{loop};BaseEventLoop._run_once (asyncio/base_events.py:1922);"
        "EpollSelector.select (selectors.py:468) 1\n"
        "thread (2): Thread-1;Thread.run (threading.py:982);Event.wait (threading.py:629) 6\n"
        "thread (2): Thread-1;Thread.run (threading.py:982);getall (aiokafka/fetcher.py:1) 2\n")
    out = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'bench'); "
         "from bench_worker_kafka import idle_report; print(idle_report(sys.argv[1]))", str(record)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {m.group(3): (int(m.group(1)), float(m.group(2)))
            for m in re.finditer(r"^\s+(\d+)\s+([\d.]+) % idle\s+thread \(\d\): (\S+)$", out.stdout, re.M)}
    assert rows == {"Thread-1": (8, 75.0), "MainThread": (4, 25.0)}, out.stdout


def test_the_kafka_benchmark_core_time_gives_each_piece_per_event_and_what_is_left(tmp_path):
    """``bench_worker_kafka.py --core-time F``: each timed piece of the worker in µs per event
    taken (the count the timed worker kept) and as a share of the worker's wall time per
    event, their sum, and what is left outside them; then each thread's CPU time per event (a
    thread that used none is left out)."""
    record = tmp_path / "core.json"
    record.write_text('{"the native reader": [0.2, 1500], "RunState.rank_steps": [0.3, 1250], '
                      '"Processor.process": [1.0, 1250], "(events)": 10000, '
                      '"(threads)": {"events": 8000, "cpu": {"MainThread": [0.8, 0.1], '
                      '"Thread-1": [0.2, 0.2], "rlwatch-brake": [0.0, 0.0]}}}')
    out = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'bench'); "
         "from bench_worker_kafka import core_time_report; "
         "print(core_time_report(sys.argv[1], 5000.0))", str(record)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # 10,000 events at 5,000 a second: 200 µs of the worker's wall time each
    assert "10000 events; the worker's wall time 200.0 µs per event at 5,000 events/s" in out.stdout
    rows = {m.group(1).strip(): (m.group(2), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^  (.{28}) +(\d*) +([\d.]+) +([\d.]+)%$", out.stdout, re.M)}
    assert rows == {"the native reader": ("1500", 20.0, 10.0),
                    "RunState.rank_steps": ("1250", 30.0, 15.0),
                    "Processor.process": ("1250", 100.0, 50.0),
                    "the pieces": ("", 150.0, 75.0),
                    "outside them": ("", 50.0, 25.0)}, out.stdout
    # each thread's CPU time over the events taken after the first record, per event
    assert "the last 8000 events" in out.stdout
    threads = {m.group(1).strip(): tuple(float(x) for x in m.group(2, 3, 4, 5))
               for m in re.finditer(r"^  (.{28}) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)%$",
                                    out.stdout, re.M)}
    assert threads == {"MainThread": (100.0, 12.5, 112.5, 56.2),
                       "Thread-1": (25.0, 25.0, 50.0, 25.0),
                       "all threads": (125.0, 37.5, 162.5, 81.2)}, out.stdout


def python(code: str) -> str:
    """What ``python -c code`` prints, run from the repository with ``bench/`` importable; it
    must exit 0."""
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'bench')\n" + code],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_piece_the_kafka_benchmark_times_is_what_the_worker_calls():
    """The pieces ``--core-time`` wraps exist under the names the worker calls them by (a
    rename would otherwise stop the timed worker at start)."""
    out = python("import importlib\n"
                 "from bench_worker_kafka import TIMED_PIECES\n"
                 "for module, owner, name, label, counts in TIMED_PIECES:\n"
                 "    m = importlib.import_module(module)\n"
                 "    print(label, callable(getattr(getattr(m, owner) if owner else m, name)))")
    found = dict(line.rsplit(" ", 1) for line in out.splitlines())
    assert found and set(found.values()) == {"True"}, out
    assert "the native reader" in found and "Processor.process" in found
    assert "RunState.rank_steps" in found


def test_the_kafka_benchmark_times_the_worker_by_its_lane_batches():
    """The worker runs with LANE_PROGRESS: each batch its events lane takes prints a mark (what
    it acknowledged, its clock, its CPU; the alerts lane's batches print none), and the rate is
    read from those marks: from the end of the first batch to the end of the last, the first
    batch's events not counted."""
    out = python("import os\n"
                 "os.environ['RLWATCH_EVENTS_TOPIC'] = 'events'\n"
                 "from bench_worker_kafka import LANE_PROGRESS\n"
                 "exec(LANE_PROGRESS)\n"
                 "import asyncio\n"
                 "from streams.batch_lane import BatchApp\n"
                 "app = BatchApp('lane-marks', broker='kafka://127.0.0.1:1', store='memory://')\n"
                 "@app.batch_lane(app.topic('events'))\n"
                 "async def handler(batch):\n"
                 "    batch.acked = len(batch)\n"
                 "@app.batch_lane(app.topic('alerts'))\n"
                 "async def alerts(batch):\n"
                 "    pass\n"
                 "class Batch(list):\n"
                 "    acked = 0\n"
                 "lane = app.batch_lanes['events']\n"
                 "for size in (3, 5, 7):\n"
                 "    asyncio.run(lane(Batch(range(size))))\n"
                 "    asyncio.run(app.batch_lanes['alerts'](Batch(range(2))))   # no mark\n")
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_worker_kafka import LANE_MARK, lane_progress
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines] == [[LANE_MARK, "3"], [LANE_MARK, "5"], [LANE_MARK, "7"]]
    secs, events, cpu = lane_progress(["some log line", *lines])
    assert events == 12 and secs >= 0 and cpu >= 0
    assert lane_progress(lines[:1]) is None      # one batch: no rate from the marks
    secs, events, cpu = lane_progress([f"{LANE_MARK} 10 100.0 1.0", f"{LANE_MARK} 20 102.0 2.5",
                                       f"{LANE_MARK} 30 104.0 4.0"])
    assert (secs, events, cpu) == (4.0, 50, 3.0)


def test_the_events_lane_benchmark_takes_every_event_of_the_fleet_and_prints_its_rate(tmp_path):
    text = bench("bench_events_lane.py", "--runs", "2", "--steps", "30", "--rounds", "1",
                 "--batch", "100")
    events = int(re.search(r"^fleet: 2 runs x 30 steps: (\d+) events", text, re.M).group(1))
    row = re.search(r"^round 1: this tree\s+([\d,]+) events/s\s+([\d,]+) per CPU second\s+(\{.*\})$",
                    text, re.M)
    assert row, text
    counters = ast.literal_eval(row.group(3))      # the worker's counters, as printed
    assert counters["events"] == events and counters["dlq"] == 0, text
    assert re.search(r"^  this tree\s+[\d,]+ events/s$", text, re.M), text
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_events_lane.py"), "--tree",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "is not an rlwatch tree" in out.stderr


def test_the_events_lane_child_takes_the_fleet_again_as_other_runs_for_an_instruction_count(tmp_path):
    """``bench_instructions.py --lane`` counts one pass of the lane as the difference of a
    child taking the fleet once and one taking it twice: the second time as other runs (the
    same work on fresh run states, so the same alerts again), with the lane's turns every so
    many records rather than by the clock."""
    import json
    import pickle

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_events_lane import fleet
    finally:
        sys.path.remove(str(ROOT / "bench"))
    path = tmp_path / "fleet.pkl"
    lines = fleet(4, 100)      # (the fourth run has a fault by step 100: alerts)
    path.write_bytes(pickle.dumps(lines))
    got = {}
    for passes in (1, 2):
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_events_lane.py"),
                              "--child", str(path), "--batch", "50", "--passes", str(passes),
                              "--turn-every", "7"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        got[passes] = json.loads(out.stdout.strip().splitlines()[-1])
    one, two = got[1], got[2]
    assert one["events"] == len(lines) and two["events"] == 2 * len(lines)
    assert one["counters"]["events"] == one["events"] and two["counters"]["events"] == two["events"]
    assert two["counters"]["dlq"] == 0
    assert one["counters"]["alerts"] > 0 and two["counters"]["alerts"] == 2 * one["counters"]["alerts"]


def test_the_second_generator_writes_the_same_runs_for_a_seed_and_the_backtest_reads_them(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        text = bench("shapes.py", str(out), "--seeds", "1", "--seed-from", "203",
                     "--only", "saturate,f_entropy_collapse,dpo_plain,f_ppo_no_eos")
        assert text.strip() == f"12 runs in {out}", text
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:      # stable across processes (no hash randomisation)
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    out = subprocess.run([sys.executable, "-m", "rlwatch", "backtest", str(a)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    # every file is scored, each with its framework's preset (TRL GRPO, DPO and PPO names); the
    # entropy collapses (KL untouched) are alarmed, and the saturating runs are quiet (the pack
    # before this generator's mends: no entropy collapse caught, every saturating run alarmed
    # and paused)
    assert re.search(r"^score: 12/12 files pass;.* faults caught 6/6,.* 0 wrong brakes",
                     out.stdout, re.M), out.stdout
    assert "unscored" not in out.stdout, out.stdout


def test_the_second_generator_refuses_an_unknown_shape(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "shapes.py"), str(tmp_path),
                          "--only", "sigmoid,no_such_shape"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "unknown shape(s) no_such_shape" in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())


def test_the_backtest_says_when_it_finds_no_real_logs(tmp_path, monkeypatch, capsys):
    # a clone without ../shared beside it: --real-only fails with the path it looked at,
    # instead of printing nothing and exiting 0
    spec = importlib.util.spec_from_file_location("backtest_cli", ROOT / "bench" / "backtest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "REAL_LOGS", tmp_path / "real-logs")
    monkeypatch.setattr(sys, "argv", ["backtest.py", "--real-only"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert "no real logs at" in str(e.value) and str(tmp_path) in str(e.value)

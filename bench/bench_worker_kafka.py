"""`rlwatch worker` through real Kafka, beside a bare aiokafka consume-and-parse loop.

Writes the fleet of ``bench_fleet_replay.py`` (interleaved 8-rank PPO/GRPO runs, run ids made
unique to this bench, timestamps moved to now) to a fresh events topic on the local broker
(``scripts/services.sh start``), then times, over that same topic on the same broker:

* a bare consumer: aiokafka in a fresh consumer group, from the beginning, ``json.loads`` of
  every message and nothing else (the floor of any Python consumer of the topic);
* a trivial Faust agent (``json.loads`` of each message, the worker's Faust settings): the
  ceiling of any worker built on Faust agents; and the same through the worker's batch lane
  (``streams.batch_lane``), the ceiling of the worker as built (``--no-faust-floor`` skips both);
* with ``--per-message``, ``rlwatch worker`` without its batch lane (``RLWATCH_BATCH_LANE=0``:
  every event through the agent's stream, the worker before the lane); with ``--no-core``, the
  worker with the core (``Processor.process``) a no-op (what everything around the core costs);
  with ``--skip ranks`` / ``--skip rank0``, the worker with only the steps of ranks other than 0
  / of rank 0 skipping the core (what each costs, the alerts they raise included); with
  ``--skip alerts``, the worker with the core on every event and its alerts dropped (what
  publishing, braking and notifying cost); with ``--core-time FILE``, the worker with each
  piece of its events lane's ``take()`` timed (and the snapshots, alert JSON and state
  encoding), each piece's µs per event printed beside the worker's wall time per event (what
  is left is outside the timed pieces); with ``--worker-env NAME=VALUE``, the worker with that
  variable set;
* ``rlwatch worker`` as a user runs it (a subprocess with its own application id and topics
  through ``RLWATCH_*``), from the beginning, with Redis for the fleet store and the brakes;
  the one addition is a line printed per batch its events lane takes (``LANE_PROGRESS``).

Rates are steady-state rates over the same events: the bare loop's from the end of its first
batch to its last message; the worker's (every variant that runs the batch lane) from the end
of its lane's first batch to the end of its last, by the lines it prints. Start-up and the
rebalance are left out. The worker's rate between its first and last offset commits while busy
is printed beside it: it used to be the figure, but Faust's first commit comes 2.8 s into the
work (124,000 events of the default fleet), so it timed only the later part of the fleet, whose
runs alert more and cost more per event, against the bare loop's whole topic (the worker's
per-batch times: 15-17 µs per event in its first batches, 26-29 µs in the middle ones). The
Faust floor agents and the per-message worker, which have no lane to print, are timed by their
commits (the commit that covers the last event left out: it comes up to 2.8 s after the work
ended). Use a fleet that keeps the worker busy for several batches (the default 48 runs x 800
steps; a run too quick to time at the size asked reads nan).
Each in events per wall second and per CPU second of the process (all its threads; the bare
loop's own process), and as ratios to the bare loop. The machine's other processes (the broker
among them) run as they do: the wall rates swing with its load, the CPU rates less; compare
the figures of one run.

With ``--rounds N`` all of it is measured N times in turns (each round its own consumer groups,
the bare loop first; the worker as it is after the other workers in even rounds, before them in
odd ones) and the medians are printed, and the worker's rate over each other worker's, round by
round: on a shared host the bare loop's rate (a few seconds of reading) swings by up to 35 %
between rounds, and the machine's speed drifts within a round.

    python bench/bench_worker_kafka.py [--runs 48] [--steps 800] [--rounds 1] [--per-message] [--no-core]

Topics and consumer groups it created are deleted at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _stack import committed_offsets  # noqa: E402
from bench_fleet_replay import fleet_lines  # noqa: E402

PARTITIONS = 4   # as streams.app.PARTITIONS: the worker's table is co-partitioned with events


def services_up(kafka: str, redis_url: str) -> None:
    import socket

    def open_(host, port):
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((host, port)) == 0

    host, port = kafka.rsplit(":", 1)
    if not open_(host, int(port)) or not open_("127.0.0.1", 6379):
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "start"], check=True, timeout=300)


def fleet(runs: int, steps: int, sid: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every event: run ids unique to this bench, the last event at now."""
    lines = fleet_lines(runs, steps)
    events = [json.loads(x) for x in lines]
    shift = time.time() - max(e["ts"] for e in events)
    out = []
    for e in events:
        e["run_id"] = f"bench-{sid}-{e['run_id']}"
        e["ts"] = round(e["ts"] + shift, 3)
        out.append((e["run_id"].encode(), json.dumps(e, separators=(",", ":")).encode()))
    return out


def create_topics(kafka: str, topics: list[str]) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka, client_id="rlwatch-bench")
    try:
        admin.create_topics([NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in topics])
    finally:
        admin.close()


def cleanup(kafka: str, topics: list[str], groups: list[str]) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka, client_id="rlwatch-bench")
    try:
        existing = set(admin.list_topics())
        gone = [t for t in topics if t in existing]
        # the worker's own internal topics (changelog, repartition) carry its app id
        gone += [t for t in existing if any(t.startswith(g + "-") for g in groups)]
        if gone:
            admin.delete_topics(gone)
        delete_groups(admin, groups)
    finally:
        admin.close()


async def produce(kafka: str, topic: str, events: list[tuple[bytes, bytes]]) -> float:
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=kafka, linger_ms=20, max_batch_size=512 * 1024,
                            acks=1)
    await prod.start()
    try:
        t = time.perf_counter()
        futs = [await prod.send(topic, value=v, key=k) for k, v in events]
        await prod.flush()
        for f in futs:
            await f
        return time.perf_counter() - t
    finally:
        await prod.stop()


async def bare_consume(kafka: str, topic: str, group: str, n: int) -> tuple[float, int, float]:
    """(seconds, messages, CPU seconds of this process) from the first batch's arrival to the
    last message parsed: the messages of the first batch are not counted (its wait includes the
    group's start-up)."""
    from aiokafka import AIOKafkaConsumer

    cons = AIOKafkaConsumer(topic, bootstrap_servers=kafka, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False)
    await cons.start()
    try:
        seen = 0
        first_at, first_n, first_cpu = None, 0, 0.0
        loads = json.loads
        while seen < n:
            batches = await cons.getmany(timeout_ms=1000, max_records=10_000)
            for records in batches.values():
                for msg in records:
                    loads(msg.value)
                seen += len(records)
            if first_at is None and seen:
                first_at, first_n, first_cpu = time.perf_counter(), seen, time.process_time()
        elapsed, cpu = time.perf_counter() - first_at, time.process_time() - first_cpu
        await cons.commit()
        return elapsed, seen - first_n, cpu
    finally:
        await cons.stop()


def committed(admin, group: str, topic: str) -> int:
    """Offsets the group committed on ``topic``, summed over partitions (0 before any)."""
    offsets = committed_offsets(admin, group)
    return sum(o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset >= 0)


def delete_groups(admin, groups: list[str]) -> None:
    if hasattr(admin, "delete_groups"):               # kafka-python 3: errors per group
        for _ in range(30):     # a stopped static member holds its group until its session ends
            left = [g for g, err in admin.delete_groups(groups).items() if "NonEmpty" in str(err)]
            if not left:
                return
            groups = left
            time.sleep(1.0)
        return
    try:
        admin.delete_consumer_groups(groups)
    except Exception:  # noqa: BLE001 - a group that never committed does not exist
        pass


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The most memory a process has held resident so far (Linux ``VmHWM``), in MB; NaN where
    it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def print_ratios(rows: list[tuple[str, float, float]]) -> None:
    """Each reader's rates as ratios to the bare consumer's (the first row) of the same round."""
    bare, bare_per_cpu = rows[0][1], rows[0][2]
    print(f"{'ratio to the bare consumer:':54s} {'wall':>6s} {'CPU':>6s}")
    for label, rate, per_cpu in rows[1:]:
        print(f"  {label:52s} {rate / bare:6.3f} {per_cpu / bare_per_cpu:6.3f}")


def print_medians(rounds: list[list[tuple[str, float, float]]]) -> None:
    """Per reader, the median over the rounds of its rate and of its ratios to the bare consumer
    of its own round, with the lowest and highest ratio beside them."""
    print(f"over {len(rounds)} rounds (median; lowest-highest ratio):")
    print(f"  {'':42s} {'events/s':>9s} {'wall':>6s} {'CPU':>6s} {'wall range':>13s}")
    for k, (label, _, _) in enumerate(rounds[0]):
        rates = [rows[k][1] for rows in rounds]
        walls = [rows[k][1] / rows[0][1] for rows in rounds]
        cpus = [rows[k][2] / rows[0][2] for rows in rounds]
        print(f"  {label:42s} {statistics.median(rates):9,.0f} {statistics.median(walls):6.3f} "
              f"{statistics.median(cpus):6.3f} {min(walls):6.3f}-{max(walls):.3f}")
    main = len(rounds[0]) - 1       # the worker as it is: its rate over each other worker's,
    if len(rounds) > 1:             # round by round (both measured minutes apart at most)
        for k, (label, _, _) in enumerate(rounds[0][1:main], start=1):
            paired = [rows[main][1] / rows[k][1] for rows in rounds]
            faster = sum(x > 1 for x in paired)
            print(f"  rlwatch worker / {label}: median {statistics.median(paired):.3f} per round "
                  f"({min(paired):.3f}-{max(paired):.3f}), faster in {faster} of {len(paired)} rounds")


def core_time_report(path: str, rate: float) -> str:
    """What ``--core-time`` found (the JSON the timed worker wrote at ``path``), per event the
    worker took: each timed piece (``TIMED_PIECES``) in µs and as a share of the worker's wall
    time per event at ``rate`` (its events per second while busy), and what is left outside
    the pieces (the lane's own loop and take()'s, the rest of the alerts' path, the brakes and
    notifications, timers, commits, the consumer thread's fetching and unpacking, the waits
    for the GIL that fall outside the pieces).

    A piece's time holds the waits for the GIL that begin in it: the consumer thread gets the
    GIL at the events lane's next function entry or loop jump, so a small piece called per
    event shows more than it costs in process (FleetWriter.note read 1.4 µs here, 0.25 in
    process). Compare the large pieces, and the sum with the wall time.

    Then each thread's CPU time per event (user and system) over the events taken after the
    first record: the events lane's (MainThread), Faust's consumer thread's (fetching and
    unpacking the records) and the brake thread's; their sum next to the wall time shows how
    much of it the threads' work fills (they share the GIL: their Python work adds up)."""
    with open(path) as f:
        spent = json.load(f)
    threads = spent.pop(THREADS, None)
    events = spent.pop(EVENTS, 0)
    if not events:
        return "core timed: no event was taken"
    wall = 1e6 / rate if rate == rate and rate > 0 else math.nan
    lines = [f"the timed worker, piece by piece, per event taken ({events} events; the worker's "
             f"wall time {wall:.1f} µs per event at {rate:,.0f} events/s):",
             f"  {'piece':28s} {'calls':>9s} {'µs/event':>9s} {'of wall':>8s}"]
    total = 0.0
    for label, (secs, calls) in spent.items():
        per = 1e6 * secs / events
        total += per
        lines.append(f"  {label:28s} {calls:9d} {per:9.2f} {per / wall:8.1%}")
    lines.append(f"  {'the pieces':28s} {'':9s} {total:9.2f} {total / wall:8.1%}")
    lines.append(f"  {'outside them':28s} {'':9s} {wall - total:9.2f} {(wall - total) / wall:8.1%}")
    if threads and threads.get("events"):
        n = threads["events"]
        lines += [f"CPU of the timed worker's threads per event taken (the last {n} events; user + "
                  "system; of wall: the share of the worker's wall time per event):",
                  f"  {'thread':28s} {'user':>9s} {'system':>9s} {'µs/event':>9s} {'of wall':>8s}"]
        rows = sorted(threads["cpu"].items(), key=lambda kv: -sum(kv[1]))
        for name, (user, system) in rows + [("all threads", [sum(c[0] for _, c in rows),
                                                            sum(c[1] for _, c in rows)])]:
            per = 1e6 * (user + system) / n
            if per >= 0.005 or name == "all threads":
                lines.append(f"  {name[:28]:28s} {1e6 * user / n:9.2f} {1e6 * system / n:9.2f} "
                             f"{per:9.2f} {per / wall:8.1%}")
    return "\n".join(lines)


def spy_report(path: str, top: int = 25) -> str:
    """The top functions of a py-spy record (raw, collapsed stacks), by samples on the CPU
    in the function itself and in it or below."""
    from collections import Counter

    own: Counter = Counter()
    below: Counter = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1]] += n
            for fr in set(frames):
                below[fr] += n
    out = [f"py-spy: {total} samples of the worker (active threads only)", "  own %  function"]
    out += [f"  {100 * c / total:5.1f}  {fr[:150]}" for fr, c in own.most_common(top)]
    out += ["  incl % function"]
    out += [f"  {100 * c / total:5.1f}  {fr[:150]}" for fr, c in below.most_common(top)]
    return "\n".join(out)


#: the innermost frames of a thread with nothing to do (its event loop waiting for I/O, or a
#: thread waiting on a lock or an event)
IDLE_FRAMES = ("EpollSelector.select", "select", "Condition.wait", "Event.wait", "Thread.join",
               "_wait_for_tstate_lock")


def idle_report(path: str) -> str:
    """Per thread of a py-spy record taken with ``--idle --threads``: its samples and the
    share in which it had nothing to do. The events lane's thread (MainThread) idle while
    events wait in Kafka is throughput lost: it waited for the consumer thread's fetch (13 %
    before the fetch loop asked for the next batch ahead, 3 % after) or for Kafka's
    acknowledgement of alerts."""
    from collections import Counter

    samples: Counter = Counter()
    idle: Counter = Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            thread = frames[0]
            samples[thread] += int(count)
            if frames[-1].split(" (")[0] in IDLE_FRAMES:
                idle[thread] += int(count)
    out = ["py-spy --idle: samples and idle share per thread"]
    out += [f"  {n:7d}  {100 * idle[t] / n:5.1f} % idle  {t[:100]}" for t, n in samples.most_common()]
    return "\n".join(out)


def faust_floor_agent() -> None:
    """The least a Faust application can do per event: an agent over the events topic that
    parses each message with json.loads, with the worker's Faust settings (partitions, raw
    serializers, memory store). Its rate is the ceiling of any worker built on Faust agents."""
    import faust

    lane = os.environ.get("BENCH_FAUST_LANE") == "1"
    kwargs = dict(broker=f"kafka://{os.environ['BENCH_KAFKA']}", store="memory://", web_enabled=False,
                  topic_partitions=PARTITIONS, key_serializer="raw", value_serializer="raw")
    if lane:        # the worker's batch lane (streams.batch_lane) instead of the agent's stream
        from streams.batch_lane import BatchApp
        app = BatchApp(os.environ["BENCH_FAUST_APP"], **kwargs)
    else:
        app = faust.App(os.environ["BENCH_FAUST_APP"], **kwargs)
    topic = app.topic(os.environ["BENCH_FAUST_TOPIC"], key_type=bytes, value_type=bytes)

    @app.agent(topic)
    async def parse(stream):
        async for _key, raw in stream.items():
            json.loads(raw)

    if lane:
        @app.batch_lane(topic)
        async def parse_batch(batch):
            loads = json.loads
            for record in batch:
                loads(record.value)
            batch.ack(len(batch))

    sys.argv = ["rlwatch-bench-faust", "worker", "-l", "warn", "--without-web"]
    app.main()


# `rlwatch worker` with the core's Processor.process replaced by a no-op: everything else (the
# parse, Faust, the batch lane, table, fleet view, timers) as it is; the rate a worker would
# reach with an infinitely fast core. BENCH_SKIP=ranks / rank0: only the steps of ranks other
# than 0 / of rank 0 skip the core (what those cost, with the alerts they raise); BENCH_SKIP=alerts:
# the core runs on every event but the alerts it returns are dropped (what publishing them costs).
# The pieces of that cost, each left out on its own with the rest as it is: BENCH_SKIP=brakes, the
# brake thread's work (each brake reported done at once, nothing sent to Redis); notify, the
# notification lane (Dispatcher.notify_all and notify return at once: no incident, outbox or
# sends); snapshot, the snapshot attached to each alert (the alerts go out without one); flush,
# the write of the run's state to the table once its alerts are in Kafka (the state waits for
# the next commit).
SKIPPED = {"ranks": "no core for ranks 1+", "rank0": "no core for rank 0",
           "alerts": "alerts dropped", "brakes": "no brake thread work",
           "notify": "no notification lane work", "snapshot": "alerts without snapshots",
           "flush": "no state write per alert"}

# --core-time: the worker as it is with each piece of the events lane's take() timed, and the
# heavier steps of an alert's way out and of the state writes. Each is a module-level name the
# worker calls, wrapped: a Python frame and two clock reads more per call, so the timed worker
# runs slower than the worker as it is. Written as JSON {piece: [seconds, calls]} to
# BENCH_CORE_TIME every 20,000 events and at exit. The events taken are counted as "the native
# reader"'s calls (it is offered every event take() takes) and the records RunState.rank_steps
# took (the run's routine rank steps that come next, taken at once): the last field says which.
TIMED_PIECES = [("streams.app", "", "read_routine", "the native reader", "call"),
                ("streams.run", "RunState", "rank_step", "RunState.rank_step", ""),
                ("streams.run", "RunState", "rank_steps", "RunState.rank_steps", "taken"),
                ("streams.run", "RunState", "after_rank_steps", "RunState.after_rank_steps", ""),
                ("streams.app", "", "read_event", "read_event", ""),
                ("streams.processor", "Processor", "process", "Processor.process", ""),
                ("streams.app", "RunStates", "get", "RunStates.get", ""),
                ("streams.snapshot", "SnapshotRecorder", "observe", "SnapshotRecorder.observe", ""),
                ("streams.fleet_store", "FleetWriter", "note", "FleetWriter.note", ""),
                # and, outside take(), the heavier steps of an alert's way out
                ("streams.app", "", "attach_snapshot", "attach_snapshot", ""),
                ("contract.alert", "Alert", "to_json", "Alert.to_json", ""),
                ("streams.app", "", "encode_state", "encode_state (state writes)", "")]
#: the timed worker's count of the events taken (see TIMED_PIECES)
EVENTS = "(events)"
CORE_TIMED = "rlwatch worker, core timed"
#: the timed worker's record of its threads' CPU: {"events": events taken, "cpu": {thread:
#: [user, system] seconds}}, both from its first record (at 20,000 events: start-up left out)
THREADS = "(threads)"

#: each batch its events lane took, as the worker prints it (see LANE_PROGRESS): records
#: acknowledged, the worker's wall clock and its CPU seconds (all threads) when the batch ended
LANE_MARK = "BENCH-LANE"

# The worker's progress as its events lane makes it: one line per batch the lane took, printed
# when the handler returns (a print per batch of thousands of events; nothing else changes).
# The alerts lane prints none: a batch of alerts read back after the last batch of events
# stretched the window over which the events were counted.
# Rates come from these lines when there are any: its first committed offsets come only after
# Faust's first commit, 2.8 s into the work (more than a third of the default fleet), so a rate
# between commits measured the later, costlier part of the fleet (its runs alert more) against
# the bare loop's whole topic. With the lines, both are measured from the end of their first
# batch to their last event. The commits' figure is printed beside it.
LANE_PROGRESS = """
import os, sys, time
import streams.batch_lane as _lane
_register = _lane.BatchApp.batch_lane
def _batch_lane(self, topic):
    register = _register(self, topic)
    if os.environ.get("RLWATCH_EVENTS_TOPIC", "rlwatch.events") not in topic.topics:
        return register     # (the alerts lane: its batches hold no events)
    def wrap(handler):
        async def progress(batch):
            try:
                await handler(batch)
            finally:
                print('""" + LANE_MARK + """', batch.acked, repr(time.time()), repr(time.process_time()),
                      file=sys.__stdout__, flush=True)    # (Faust's worker redirects sys.stdout)
        return register(progress)
    return wrap
_lane.BatchApp.batch_lane = _batch_lane
"""

#: the command line's entry point, run by ``python -c`` after LANE_PROGRESS (and a variant's patches)
RUN_CLI = """
from rlwatch.cli import main
sys.argv[0] = "rlwatch"
sys.exit(main())
"""

NO_CORE_WORKER = LANE_PROGRESS + """
import os, sys
TIMED_PIECES = """ + repr(TIMED_PIECES) + """
THREADS = """ + repr(THREADS) + """
EVENTS = """ + repr(EVENTS) + """
import streams.processor
skip = os.environ.get("BENCH_SKIP", "all")
if skip == "brakes":
    import alerts.brake
    alerts.brake.BrakeThread.submit = lambda self, alert, on_done=None: on_done and on_done()
elif skip == "notify":
    import alerts.dispatch
    from alerts.dispatch import Delivery
    async def notify(self, alert, out=None, **kwargs):
        return out or Delivery(alert)
    async def notify_all(self, alerts):     # what the worker's notification lane calls
        return [Delivery(a) for a in alerts]
    alerts.dispatch.Dispatcher.notify = notify
    alerts.dispatch.Dispatcher.notify_all = notify_all
elif skip == "snapshot":
    import streams.app
    streams.app.attach_snapshot = lambda alert, recorder, state: alert
elif skip == "flush":
    import streams.app
    streams.app.RunStates.flush_run = lambda self, run_id: None
elif skip == "time":    # the worker as it is, each of TIMED_PIECES timed
    import atexit, importlib, json, threading, time
    spent, pc, path = {}, time.perf_counter, os.environ["BENCH_CORE_TIME"]
    def thread_cpu():   # {thread: [user, system] CPU seconds} (Linux /proc; else nothing)
        names, tick, got = {t.native_id: t.name for t in threading.enumerate()}, os.sysconf("SC_CLK_TCK"), {}
        for tid in (os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ()):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue    # (a thread that ended meanwhile)
            cpu = got.setdefault(names.get(int(tid), f"thread {tid}"), [0.0, 0.0])
            cpu[0] += int(fields[11]) / tick
            cpu[1] += int(fields[12]) / tick
        return got
    base, cpu = [], {}   # (events, thread CPU) at the first dump: start-up left out
    taken = [0, 20_000]  # events taken, and the count at which to dump next
    def dump():
        events = taken[0]
        cpu.update(thread_cpu())    # (a thread stopped before the exit keeps its last figures)
        if not base:
            base.append((events, dict(cpu)))
        (events0, cpu0), threads = base[0], {}
        for name, (user, system) in cpu.items():
            user0, system0 = cpu0.get(name, (0.0, 0.0))
            threads[name] = [user - user0, system - system0]
        with open(path + ".new", "w") as f:
            json.dump({**spent, EVENTS: events, THREADS: {"events": events - events0, "cpu": threads}}, f)
        os.replace(path + ".new", path)
    def timed(owner, name, label, counts):
        f, got = getattr(owner, name), spent.setdefault(label, [0.0, 0])
        def piece(*a, **k):
            t, out = pc(), None
            try:
                out = f(*a, **k)
                return out
            finally:
                got[0] += pc() - t
                got[1] += 1
                if counts:
                    taken[0] += 1 if counts == "call" else out[1] if out is not None else 0
                    if taken[0] >= taken[1]:
                        taken[1] += 20_000
                        dump()
        setattr(owner, name, piece)
    for module, owner, name, label, counts in TIMED_PIECES:
        module = importlib.import_module(module)
        timed(getattr(module, owner) if owner else module, name, label, counts)
    atexit.register(dump)
else:
    import streams.run
    process = streams.processor.Processor.process
    def skipping(self, state, event, now):
        if skip == "alerts":
            process(self, state, event, now)
            return []
        if skip == "all" or (event.kind == "step" and (event.rank != 0) == (skip == "ranks")):
            return []
        return process(self, state, event, now)
    streams.processor.Processor.process = skipping
    # the routine steps of ranks other than 0 are taken by RunState.rank_step, or several at
    # once by rank_steps: skipping the core for them, each is read by the native reader and
    # taken by a rank_step that does nothing; dropping alerts, those of the rules they leave
    # due are dropped
    RunState = streams.run.RunState
    rank_step, after = RunState.rank_step, RunState.after_rank_steps
    if skip in ("all", "ranks"):
        RunState.rank_steps = lambda self, records, order, pos, *a: (pos, 0, [], None)
        RunState.rank_step = lambda self, event, now: []
    elif skip == "alerts":
        RunState.rank_step = lambda self, event, now: None if rank_step(self, event, now) is None else []
        RunState.after_rank_steps = lambda self, *a: after(self, *a) and []
""" + RUN_CLI


def run_consumer(kind: str, kafka: str, redis_url: str, sid: str, topics: dict[str, str], n: int,
                 timeout: float, loglevel: str, spy: str | None = None,
                 extra_env: dict[str, str] | None = None,
                 spy_args: tuple[str, ...] = ()) -> tuple[float, int, float, list[str], str]:
    """Run ``rlwatch worker`` (``kind`` "worker") or the Faust floor agent ("faust") over the
    events topic: (seconds, events, CPU seconds), its output, and how they were taken. A worker
    whose events lane printed its batches (LANE_PROGRESS) is timed by them (:func:`lane_progress`);
    any other process between the first and the last change of its consumer group's committed
    offsets (events = the offsets committed in between)."""
    from kafka.admin import KafkaAdminClient

    env = dict(os.environ)
    env.update({
        "RLWATCH_KAFKA": kafka, "RLWATCH_REDIS": redis_url, "RLWATCH_APP_ID": topics["app"],
        "RLWATCH_EVENTS_TOPIC": topics["events"], "RLWATCH_ALERTS_TOPIC": topics["alerts"],
        "RLWATCH_DLQ_TOPIC": topics["dlq"], "RLWATCH_WORKER_ID": f"bench-{sid}",
        "BENCH_FAUST_APP": topics["faust"], "BENCH_FAUST_TOPIC": topics["events"], "BENCH_KAFKA": kafka,
        "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(extra_env or {})
    group = topics["app"] if kind in ("worker", "no-core") else env["BENCH_FAUST_APP"]
    cmd = ([sys.executable, "-c", LANE_PROGRESS + RUN_CLI, "worker", "--loglevel", loglevel] if kind == "worker"
           else [sys.executable, "-c", NO_CORE_WORKER, "worker", "--loglevel", loglevel] if kind == "no-core"
           else [sys.executable, str(Path(__file__).resolve()), "--faust-floor-agent"])
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as cwd:   # Faust's data directory goes there
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)

        def pump():
            for line in proc.stdout:
                lines.append(line.rstrip())
        threading.Thread(target=pump, daemon=True).start()
        admin = KafkaAdminClient(bootstrap_servers=kafka, client_id="rlwatch-bench")
        marks: list[tuple[float, int]] = []
        spying = None
        if spy:   # a sampled profile of the worker while it works (py-spy; main() checks it is on PATH)
            spying = subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--format", "raw",
                                       "--rate", "200", "--output", spy, "--nonblocking",
                                       *spy_args],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + timeout
            last = 0
            while time.time() < deadline:
                if proc.poll() is not None:
                    raise SystemExit(f"the {kind} process exited:\n" + "\n".join(lines[-40:]))
                now_off = committed(admin, group, topics["events"])
                if now_off != last:
                    marks.append((time.perf_counter(), now_off, cpu_seconds(proc.pid)))
                    last = now_off
                if now_off >= n:
                    break
                time.sleep(0.1)
            else:
                raise SystemExit(f"the {kind} process committed {last} of {n} events in {timeout:.0f} s:\n"
                                 + "\n".join(lines[-40:]))
        finally:
            admin.close()
            if spying is not None:
                spying.send_signal(2)     # py-spy writes its file on SIGINT
                try:
                    spying.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    spying.kill()
            peak = peak_rss_mb(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # the last commit comes up to a commit interval after the last event was processed, idle
    # time a fast process would be charged with: the rate is taken between commits made while
    # the process was busy (those before the one that covered every event), when there are two
    busy = [m for m in marks if m[1] < n]
    if len(busy) < 2:
        busy = marks
    by_commits = None       # (seconds, events, CPU seconds) between those commits
    if len(busy) >= 2:
        (t0, o0, c0), (t1, o1, c1) = busy[0], busy[-1]
        by_commits = (t1 - t0, o1 - o0, c1 - c0)
    memory = f"; peak RSS {peak:.0f} MB"
    lane = lane_progress(lines)
    if lane is not None:
        if by_commits is None:
            return (*lane, lines, LANED + memory)
        secs, events, _ = by_commits
        return (*lane, lines, f"{LANED}; {events / secs:,.0f} events/s between its commits "
                              f"while busy ({events} events, {secs:.2f} s){memory}")
    if by_commits is None:    # too quick to time at this fleet size: its row reads nan
        print(f"  ({kind}: committed everything at once, no rate; use more --runs or --steps)")
        return math.nan, n, math.nan, lines, BUSY + memory
    if busy is marks:
        print(f"  ({kind}: fewer than two commits while busy: the rate includes the wait for the "
              "last commit; use more --runs or --steps)")
    return (*by_commits, lines, BUSY + memory)


def lane_progress(lines: list[str]) -> tuple[float, int, float] | None:
    """(seconds, events, CPU seconds) from the end of the worker's first lane batch to the end
    of its last, from its LANE_MARK lines (the first batch's events not counted, as the bare
    loop's are not); None with fewer than two batches."""
    marks = []
    for line in lines:
        if line.startswith(LANE_MARK + " "):
            _, acked, wall, cpu = line.split(" ")
            marks.append((int(acked), float(wall), float(cpu)))
    if len(marks) < 2:
        return None
    return (marks[-1][1] - marks[0][1], sum(m[0] for m in marks[1:]), marks[-1][2] - marks[0][2])


BUSY = "between its first and last offset commits while busy"
LANED = "from the end of its lane's first batch to the end of its last"


def one_round(args, r: int, sid: str, topics: dict[str, str], bare_group: str, n: int,
              made_topics: set[str], made_groups: set[str]) -> tuple[list[tuple[str, float, float]], list[str]]:
    """Round ``r``: the bare loop, then each reader asked for, each with consumer groups and
    output topics of its own (added to ``made_topics`` / ``made_groups``; the first round keeps
    the names of a single-round run; the events topic is the same for all). Its rows (label,
    events per second, events per CPU second) and the output of its last worker."""
    last_round = r == args.rounds - 1
    t = topics if r == 0 else dict(topics, app=f"{topics['app']}-r{r}", alerts=f"{topics['alerts']}.r{r}",
                                   dlq=f"{topics['dlq']}.r{r}", faust=f"{topics['faust']}-r{r}")
    if r:
        create_topics(args.kafka, [t["alerts"], t["dlq"]])
        made_topics.update({t["alerts"], t["dlq"]})
        made_groups.update({t["app"], t["faust"], t["faust"] + "-lane"})
    group = bare_group if r == 0 else f"{bare_group}-r{r}"
    made_groups.add(group)
    rows: list[tuple[str, float, float]] = []

    def show(label: str, secs: float, count: int, cpu: float, how: str = BUSY) -> None:
        rows.append((label, count / secs, count / cpu if cpu > 0 else float("nan")))
        print(f"{label + ':':36s} {count / secs:9,.0f} events/s, {rows[-1][2]:9,.0f} per CPU second "
              f"({count} events in {secs:.2f} s {how})", flush=True)

    def run(kind: str, tops: dict[str, str], spy: str | None = None, env: dict | None = None):
        return run_consumer(kind, args.kafka, args.redis, sid, tops, n, args.timeout, args.loglevel, spy,
                            env, ("--gil",) if args.spy_gil else ("--idle", "--threads") if args.spy_idle
                            else ())

    bare_s, bare_n, bare_cpu = asyncio.run(bare_consume(args.kafka, topics["events"], group, n))
    show("bare aiokafka + json.loads", bare_s, bare_n, bare_cpu, "from its first batch")
    if not args.no_faust_floor:
        got = run("faust", t)
        show("Faust agent + json.loads", *got[:3], got[4])
        got = run("faust", t, env={"BENCH_FAUST_APP": t["faust"] + "-lane", "BENCH_FAUST_LANE": "1"})
        show("Faust batch lane + json.loads", *got[:3], got[4])
    # (kind, label, environment, tag of its group and topics)
    variants = [("worker", f"rlwatch worker, {e}", dict(v.split("=", 1) for v in e.split()), f"v{i}")
                for i, e in enumerate(args.worker_env)]
    if args.per_message:        # the worker before the batch lane: every event through Faust's
        variants.insert(0, ("worker", "rlwatch worker, per-message agent", {"RLWATCH_BATCH_LANE": "0"}, "vp"))
    no_core = [("no-core", f"core a no-op, {e}", dict([e.split("=", 1)]), f"nc{i}")
               for i, e in enumerate(args.no_core_env)]
    for what in args.skip:
        no_core.insert(0, ("no-core", f"rlwatch worker, {SKIPPED[what]}",
                           {"BENCH_SKIP": what}, f"sk{what}"))
    if args.no_core:
        no_core.append(("no-core", "rlwatch worker, core a no-op", {}, f"nc{len(no_core)}"))
    if args.core_time:
        no_core.insert(0, ("no-core", CORE_TIMED,      # (--spy records the last one: the no-op's)
                           {"BENCH_SKIP": "time", "BENCH_CORE_TIME": args.core_time}, "ct"))
    got: dict = {}

    def other(j: int, kind: str, label: str, extra: dict, tag: str) -> None:
        v = dict(t, app=f"{t['app']}-{tag}", alerts=f"{t['alerts']}.{tag}", dlq=f"{t['dlq']}.{tag}")
        made_topics.update({v["alerts"], v["dlq"]})
        made_groups.add(v["app"])
        last_no_core = kind == "no-core" and j == len(variants) + len(no_core) - 1
        spy = args.spy + ".no-core" if args.spy and last_round and last_no_core else None
        got[label] = run(kind, v, spy, {**extra, "RLWATCH_WORKER_ID": f"bench-{sid}-r{r}-{tag}"})

    def worker() -> None:
        got["rlwatch worker"] = run("worker", t, args.spy if last_round else None,
                                    {"RLWATCH_WORKER_ID": f"bench-{sid}-r{r}"} if r else None)

    # the worker as it is runs last in even rounds and first in odd ones: on a host whose
    # speed drifts, neither side of a comparison is always the one measured later
    jobs = [lambda j=j, job=job: other(j, *job) for j, job in enumerate(variants + no_core)]
    for job in ([worker, *jobs] if r % 2 else [*jobs, worker]):
        job()
    for _, label, _, _ in variants + no_core:
        show(label, *got[label][:3], got[label][4])
    show("rlwatch worker", *got["rlwatch worker"][:3], got["rlwatch worker"][4])
    return rows, got["rlwatch worker"][3]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--kafka", default=os.environ.get("RLWATCH_TEST_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--redis", default=os.environ.get("RLWATCH_TEST_REDIS", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds the worker may take")
    ap.add_argument("--loglevel", default="warn", choices=("crit", "error", "warn", "info", "debug"))
    ap.add_argument("--keep", action="store_true", help="keep the topics (to look at them)")
    ap.add_argument("--spy", metavar="FILE", help="record the worker with py-spy into FILE and "
                    "print its top functions")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure everything this many times, in turns (the bare loop first in each "
                    "round), and print the medians: on a shared host the bare loop's few seconds "
                    "of reading swing by up to 35 %% between rounds")
    ap.add_argument("--spy-gil", action="store_true",
                    help="with --spy: only the samples of the thread holding the GIL (py-spy --gil), "
                    "which leaves out the threads waiting for it")
    ap.add_argument("--spy-idle", action="store_true",
                    help="with --spy: the threads' idle samples too (py-spy --idle --threads), and "
                    "each thread's idle share: the events lane's (MainThread) is throughput lost")
    ap.add_argument("--no-faust-floor", action="store_true",
                    help="skip the trivial Faust agent (the ceiling of any Faust worker)")
    ap.add_argument("--per-message", action="store_true",
                    help="also run the worker without its batch lane (RLWATCH_BATCH_LANE=0), every "
                    "event through a Faust agent's stream: the worker before the lane, same run")
    ap.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                    help="also run the worker with this environment variable set (repeatable; one "
                    "run per option; several variables of one run separated by spaces: "
                    "'PYTHONPATH=<tree> NAME=VALUE'), before the worker as it is, to compare in one run")
    ap.add_argument("--no-core", action="store_true",
                    help="also run the worker with the core (Processor.process) replaced by a no-op: "
                    "what the edges around the core cost, the ceiling of a faster core (with "
                    "--spy, recorded too, into FILE.no-core)")
    ap.add_argument("--skip", action="append", default=[], choices=sorted(SKIPPED),
                    help="also run the worker with the steps of ranks other than 0 (ranks) or of "
                    "rank 0 (rank0) skipping the core, alerts and all: what they cost; or (alerts) "
                    "with the core on every event and the alerts it raises dropped: what "
                    "publishing them costs; or one piece of that left out: the brake thread's "
                    "work (brakes), the notification lane's (notify), the snapshots (snapshot) "
                    "(repeatable)")
    ap.add_argument("--no-core-env", action="append", default=[], metavar="NAME=VALUE",
                    help="with --no-core, also run the no-op-core worker with this environment "
                    "variable set (repeatable), e.g. PYTHONPATH=<a copy of an older tree>")
    ap.add_argument("--core-time", metavar="FILE",
                    help="also run the worker with each piece of its events lane's take() timed "
                    "(the native reader, rank_step, rank_steps, read_event, Processor.process, the run "
                    "states, the snapshot recorder, the fleet view), and the snapshots, alert "
                    "JSON and state encoding (the wrapping slows it down), "
                    "into FILE (JSON), and print each piece's µs per event and share of the "
                    "worker's wall time, and what is left outside them, and each thread's CPU "
                    "time per event (the last round's)")
    ap.add_argument("--faust-floor-agent", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.spy_gil and args.spy_idle:
        ap.error("--spy-gil and --spy-idle ask for opposite samples: choose one")
    if args.spy and shutil.which("py-spy") is None:
        ap.error("--spy needs py-spy on PATH (pip install py-spy)")
    if args.faust_floor_agent:
        return faust_floor_agent()

    services_up(args.kafka, args.redis)
    sid = uuid.uuid4().hex[:8]
    topics = {"app": f"rlwatch-bench-{sid}", "events": f"rlwatch.bench.events.{sid}",
              "alerts": f"rlwatch.bench.alerts.{sid}", "dlq": f"rlwatch.bench.dlq.{sid}",
              "faust": f"rlwatch-bench-faust-{sid}"}
    bare_group = f"rlwatch-bench-bare-{sid}"
    events = fleet(args.runs, args.steps, sid)
    n = len(events)
    create_topics(args.kafka, [topics["events"], topics["alerts"], topics["dlq"]])
    extra_topics: set[str] = set()
    extra_groups: set[str] = set()
    try:
        secs = asyncio.run(produce(args.kafka, topics["events"], events))
        print(f"fleet: {args.runs} runs x {args.steps} steps x 8 ranks: {n} events, "
              f"{sum(len(v) for _, v in events) / n:.0f} bytes on average; produced in {secs:.1f} s")
        rounds: list[list[tuple[str, float, float]]] = []
        out: list[str] = []
        for r in range(args.rounds):
            if args.rounds > 1:
                print(f"round {r + 1} of {args.rounds}:", flush=True)
            rows, out = one_round(args, r, sid, topics, bare_group, n, extra_topics, extra_groups)
            rounds.append(rows)
            print_ratios(rows)
        if len(rounds) > 1:
            print_medians(rounds)
        errors = [x for x in out if "Traceback" in x or " ERROR " in x or "rejected an event" in x]
        if errors:
            print(f"worker output had {len(errors)} error lines, first: {errors[0][:200]}")
        if args.core_time and os.path.exists(args.core_time):
            rate = next(r for label, r, _ in rounds[-1] if label == CORE_TIMED)
            print(core_time_report(args.core_time, rate))
        if args.spy and os.path.exists(args.spy + ".no-core"):
            print("the worker with the core a no-op:")
            print(spy_report(args.spy + ".no-core"))
        if args.spy and os.path.exists(args.spy):
            print("the worker:")
            print(spy_report(args.spy))
            if args.spy_idle:
                print(idle_report(args.spy))
    finally:
        if not args.keep:
            cleanup(args.kafka, [topics["events"], topics["alerts"], topics["dlq"], *extra_topics],
                    [topics["app"], topics["faust"], topics["faust"] + "-lane", bare_group, *extra_groups])


if __name__ == "__main__":
    main()

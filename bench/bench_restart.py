"""A worker killed with SIGKILL and started again: how long until it processes again
(``python bench/bench_restart.py``).

A `rlwatch worker` (subprocess, its own topics and application id) on the local Kafka and Redis
(scripts/services.sh) processes a run. It is killed (SIGKILL: no goodbye to the group), and a new
one is started at once, as a supervisor would. Right after the kill, a probe run (the SDK's
``Monitor`` with its control listener) logs a KL blow-up; the figure is from the restart to the
probe's pause, i.e. the new worker reading the probe's events, raising the red alert and pulling
the brake (the brake itself takes a few ms, see bench_brake.py). Also: restart to Faust's
"Ready" (import, connect, join the group, recover the table).

Three settings side by side: this worker as shipped (static membership: the restarted process
takes the dead one's group instance id and its partitions at once; 10 s session), without
static membership (``RLWATCH_WORKER_ID=none``: the group waits for the dead member's 10 s
session), and the old settings (no static membership, Faust's 60 s session). Target: < 10 s.

With ``--load-runs N`` the worker has a fleet to take back: ``N`` healthy runs x 8 ranks log
``--load-rate`` step events per second in total from another process, from ``--settle`` seconds
before the first kill to the end, so the restarted worker restores their states (the changelog)
and catches up with their events while the probe goes red.

With ``--stop`` it times a scale-down instead: a second worker joins, then is stopped (SIGTERM)
for good; the figure is from the stop to the pause of a probe in every partition, i.e. the
remaining worker taking the stopped one's partitions, side by side with ``--tree DIR`` (another
checkout, e.g. a ``git worktree`` with its ``streams/_native*.so`` copied in).

    python bench/bench_restart.py [--trials 3] [--skip-old] [--load-runs 0] [--load-rate 5000]
    python bench/bench_restart.py --stop [--trials 3] [--tree OLD_TREE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stack import KAFKA, REDIS, Load, Worker, bench_env, pct, services_up  # noqa: E402

from producers import Monitor  # noqa: E402

SECRET = "bench-" + uuid.uuid4().hex[:8]


def trial(env: dict, first: Worker) -> tuple[float, float, float, Worker]:
    """(restart -> Ready, restart -> probe paused, kill -> probe paused) in seconds, and the
    restarted worker."""
    topic = env["RLWATCH_EVENTS_TOPIC"]
    probe = Monitor(f"bench-restart-{uuid.uuid4().hex[:8]}", kafka=KAFKA, redis=REDIS, topic=topic,
                    control_secret=SECRET, heartbeat_seconds=0)
    try:
        probe.control.wait_ready(10)
        killed = first.kill()
        restarted = time.time()
        second = Worker(env).start(wait=None)
        for step in range(8):
            probe.log(step, {"kl/mean": 0.02 if step < 3 else 0.15, "reward/mean": 0.5 + 0.01 * step})
        probe.flush(10)
        ready = second.wait_for("Ready", 180) - restarted
        deadline = time.time() + 180
        while probe.state != "paused" and time.time() < deadline:
            time.sleep(0.01)
        paused = time.time()
        if probe.state != "paused":
            raise RuntimeError("the probe was never paused")
        return ready, paused - restarted, paused - killed, second
    finally:
        probe.control.close()
        probe.close(2)


def setting(name: str, trials: int, load: tuple[int, float, float] = (0, 0.0, 0.0),
            **extra) -> tuple[str, list[tuple[float, float, float]]]:
    """``load``: (runs, events per second, seconds of load before the first kill)."""
    sid = uuid.uuid4().hex[:8]
    env = bench_env(sid, RLWATCH_CONTROL_SECRET=SECRET, RLWATCH_ACK_TIMEOUT=600, **extra)
    worker = Worker(env).start()
    time.sleep(3)
    out = []
    fleet = None
    if load[0]:
        fleet = Load(env["RLWATCH_EVENTS_TOPIC"], load[0], 8, load[1]).start()
        time.sleep(load[2])
    try:
        for i in range(trials):
            ready, to_pause, from_kill, worker = trial(env, worker)
            print(f"  {name}: trial {i + 1}: Ready {ready:.1f}s, processing (probe paused) {to_pause:.1f}s "
                  f"after the restart", flush=True)
            out.append((ready, to_pause, from_kill))
            time.sleep(3)
    finally:
        if fleet is not None:
            print(f"  {name}: the load sent {fleet.rate:,.0f} events/s", flush=True)
            fleet.stop()
        worker.stop()
    return name, out


def handover(env: dict, stay: Worker, root: Path | None) -> float:
    """A second worker joins ``stay``, then is stopped (SIGTERM) for good: seconds from the stop
    to the pause of a probe in every partition (each logs a KL blow-up right after the stop)."""
    from streams.app import PARTITIONS, partition_of
    go = Worker(env, root=root).start()
    time.sleep(3)                                  # the group has settled with both
    ids: dict[int, str] = {}
    while len(ids) < PARTITIONS:
        run_id = f"bench-handover-{uuid.uuid4().hex[:8]}"
        ids.setdefault(partition_of(run_id, PARTITIONS), run_id)
    probes = [Monitor(run_id, kafka=KAFKA, redis=REDIS, topic=env["RLWATCH_EVENTS_TOPIC"],
                      control_secret=SECRET, heartbeat_seconds=0) for run_id in ids.values()]
    try:
        for probe in probes:
            probe.control.wait_ready(10)
        stopped = time.time()
        go.proc.terminate()
        for step in range(8):
            for probe in probes:
                probe.log(step, {"kl/mean": 0.02 if step < 3 else 0.15, "reward/mean": 0.5})
        for probe in probes:
            probe.flush(10)
        deadline = time.time() + 120
        while any(p.state != "paused" for p in probes) and time.time() < deadline:
            time.sleep(0.01)
        if any(p.state != "paused" for p in probes):
            raise RuntimeError("a probe was never paused")
        return time.time() - stopped
    finally:
        go.stop()
        for probe in probes:
            probe.control.close()
            probe.close(2)


def handovers(trees: list[Path | None], trials: int) -> None:
    """``--stop``: :func:`handover` for this tree and each ``--tree``, in turns."""
    names = ["this tree"] + [str(t) for t in trees[1:]]
    got: dict[str, list[float]] = {n: [] for n in names}
    stays = []
    for name, root in zip(names, trees):
        env = bench_env(uuid.uuid4().hex[:8], RLWATCH_CONTROL_SECRET=SECRET, RLWATCH_ACK_TIMEOUT=600)
        stays.append((name, root, env, Worker(env, root=root).start()))
    try:
        for i in range(trials):
            for name, root, env, stay in stays:
                got[name].append(handover(env, stay, root))
                print(f"  {name}: trial {i + 1}: every probe paused {got[name][-1]:.1f}s after the stop",
                      flush=True)
    finally:
        for *_, stay in stays:
            stay.stop()
    base = pct(got[names[0]], 50)
    print("\na second worker stopped (SIGTERM) for good: stop -> a probe paused in every partition"
          " (seconds, median / worst)")
    for name in names:
        med = pct(got[name], 50)
        print(f"{name:42s} {len(got[name]):2d} {med:6.1f} / {max(got[name]):5.1f}   x{med / base:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--skip-old", action="store_true", help="leave out the 60 s session setting")
    ap.add_argument("--load-runs", type=int, default=0, help="healthy runs (x 8 ranks) logging meanwhile")
    ap.add_argument("--load-rate", type=float, default=5000.0, help="their step events per second")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds of load before the first kill")
    ap.add_argument("--stop", action="store_true",
                    help="instead: a second worker stopped for good, beside each --tree")
    ap.add_argument("--tree", action="append", default=[], type=Path, metavar="DIR",
                    help="with --stop: another checkout's worker, side by side")
    args = ap.parse_args()
    services_up()
    if args.stop:
        return handovers([None, *args.tree], args.trials)
    load = (args.load_runs, args.load_rate, args.settle)
    if args.load_runs:
        print(f"load: {args.load_runs:,} runs x 8 ranks, {args.load_rate:,.0f} events/s", flush=True)
    rows = [setting("static membership, 10 s session", args.trials, load),
            setting("no static membership, 10 s session", max(1, args.trials - 1), load,
                    RLWATCH_WORKER_ID="none")]
    if not args.skip_old:
        rows.append(setting("old: no static membership, 60 s session", 1, load, RLWATCH_WORKER_ID="none",
                            RLWATCH_SESSION_TIMEOUT=60))
    print("\nworker killed (SIGKILL) and restarted at once (seconds, median / worst of the trials)")
    print(f"{'setting':42s} {'n':>2s} {'-> Ready':>14s} {'-> processing':>16s}")
    for name, xs in rows:
        ready = [x[0] for x in xs]
        proc = [x[1] for x in xs]
        print(f"{name:42s} {len(xs):2d} {pct(ready, 50):6.1f} / {max(ready):5.1f} {pct(proc, 50):7.1f} / {max(proc):5.1f}")
    print("target: restart -> processing < 10 s")


if __name__ == "__main__":
    main()

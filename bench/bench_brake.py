"""Publish -> pause observed by the training loop, through the real stack
(``python bench/bench_brake.py``).

A `rlwatch worker` (a subprocess, its own topics and application id) on Apache Kafka and Redis
(scripts/services.sh), Slack (webhook and bot) and a webhook played by a local recorder. Each
sample is one training run of the SDK (``Monitor`` with its control listener, in this process)
that steps every 20 ms, healthy for a few steps, then logs a KL blow-up every step; the latency
is from the ``Monitor.log`` call of the step the red alert fired on (the pause command names it)
to the moment the SDK holds the run paused (a watcher polls every millisecond; the training loop
itself blocks at its next ``step_boundary()``, at most one step later). Runs go red
``--parallel`` at a time.

Four settings, printed side by side: idle; while Slack hangs (both Slack endpoints read each
request and never answer); under a load of ``--rate`` healthy step events per second (a
separate process, ``--runs`` runs x 8 ranks); and under load while Slack hangs. Target: p99
under 1 s, unchanged by the hang.

    python bench/bench_brake.py [--samples 100] [--parallel 10] [--rate 10000] [--runs 1250]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stack import KAFKA, REDIS, Load, Worker, bench_env, group_lag, pct, services_up  # noqa: E402

from producers import Monitor  # noqa: E402
from tests.support.http_recorder import start_recorder  # noqa: E402

SECRET = "bench-" + uuid.uuid4().hex[:8]


class Run:
    """One training run stepping every ``step_seconds``: healthy until its producer is connected
    and its control listener ready (a run in steady state), a few more steps, then red until
    paused. A watcher polls the SDK's state every millisecond: the latency is from the
    ``Monitor.log`` call of the step the red alert fired on (the pause command names it) to the
    moment the SDK holds the run paused; the loop blocks at its next ``step_boundary()``, at
    most one step later."""

    def __init__(self, run_id: str, topic: str, healthy: int = 4, step_seconds: float = 0.02):
        self.mon = Monitor(run_id, kafka=KAFKA, redis=REDIS, topic=topic, control_secret=SECRET,
                           heartbeat_seconds=0, buffer_size=1000)
        self.healthy, self.step_seconds = healthy, step_seconds
        self.published: dict[int, float] = {}
        self.latency: float | None = None
        self.warm = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._train, daemon=True)
        self.watcher = threading.Thread(target=self._watch, daemon=True)

    def _log(self, step: int, kl: float) -> None:
        self.published[step] = time.perf_counter()
        self.mon.log(step, {"kl/mean": kl, "reward/mean": 0.5 + 0.01 * step, "entropy/mean": 2.0})

    def _train(self) -> None:
        self._log(0, 0.02)
        self.mon.flush(30)                 # the producer is connected now
        self.mon.control.wait_ready(10)
        self.warm.set()
        self.go.wait(60)
        self.watcher.start()
        for step in range(1, 100_000):
            if self.done.is_set():
                return
            self.mon.step_boundary()
            self._log(step, 0.02 if step <= self.healthy else 0.15)
            time.sleep(self.step_seconds)

    def _watch(self) -> None:
        c = self.mon.control
        while not self.done.is_set():
            if c.state == "paused":
                seen = time.perf_counter()
                cmd = c.state_command
                if cmd is not None and cmd.step in self.published:
                    self.latency = seen - self.published[cmd.step]
                self.done.set()
                return
            time.sleep(0.001)

    def close(self) -> None:
        self.done.set()
        self.mon.control.close()
        self.mon.close(2)


def measure(topic: str, samples: int, parallel: int, label: str, deadline: float = 60.0) -> list[float]:
    out: list[float] = []
    lost = 0
    while len(out) + lost < samples:
        runs = [Run(f"bench-brake-{label}-{uuid.uuid4().hex[:8]}", topic) for _ in range(parallel)]
        for r in runs:
            r.thread.start()
        for r in runs:
            r.warm.wait(60)
        for r in runs:
            r.go.set()
        end = time.time() + deadline
        for r in runs:
            r.done.wait(max(0.1, end - time.time()))
        for r in runs:
            if r.latency is None:
                lost += 1
            else:
                out.append(r.latency)
            r.close()
    if lost:
        print(f"  {label}: {lost} run(s) not paused within {deadline:.0f}s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=10)
    ap.add_argument("--rate", type=float, default=10_000.0, help="load: step events per second")
    ap.add_argument("--runs", type=int, default=1250, help="load: runs (x 8 ranks)")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds of load before measuring")
    args = ap.parse_args()
    services_up()
    rec, server = start_recorder()
    sid = uuid.uuid4().hex[:8]
    env = bench_env(sid, RLWATCH_SLACK_WEBHOOK=f"{rec.url}/slack/webhook", RLWATCH_SLACK_TOKEN="bench-bot",
                    RLWATCH_SLACK_CHANNEL="#bench", RLWATCH_SLACK_API_URL=f"{rec.url}/api/",
                    RLWATCH_WEBHOOK_URL=f"{rec.url}/hook", RLWATCH_CONTROL_SECRET=SECRET,
                    RLWATCH_ACK_TIMEOUT=600)
    topic = env["RLWATCH_EVENTS_TOPIC"]
    worker = Worker(env).start()
    results: dict[str, tuple[list[float], str]] = {}
    load = None
    try:
        measure(topic, args.parallel, args.parallel, "warmup")
        results["idle"] = (measure(topic, args.samples, args.parallel, "idle"), "")
        rec.hang = ("/slack/", "/api/")
        results["idle, Slack hanging"] = (measure(topic, args.samples, args.parallel, "hang"),
                                          f"{len(rec.hung)} Slack requests held")
        rec.release()
        rec.released.clear()
        load = Load(topic, args.runs, 8, args.rate).start()
        time.sleep(args.settle)
        lat = measure(topic, args.samples, args.parallel, "load")
        results[f"load {args.rate:,.0f}/s"] = (lat, f"sent {load.rate:,.0f} ev/s, lag {group_lag(env['RLWATCH_APP_ID'], topic)}")
        rec.hung.clear()
        rec.hang = ("/slack/", "/api/")
        lat = measure(topic, args.samples, args.parallel, "loadhang")
        results[f"load {args.rate:,.0f}/s, Slack hanging"] = (
            lat, f"sent {load.rate:,.0f} ev/s, lag {group_lag(env['RLWATCH_APP_ID'], topic)}, "
                 f"{len(rec.hung)} Slack requests held")
    finally:
        if load is not None:
            load.stop()
        rec.release()
        worker.stop()
        server.shutdown()
    print("\npublish -> pause held by the SDK (ms; the loop blocks at its next step boundary)")
    print(f"{'setting':34s} {'n':>4s} {'p50':>8s} {'p99':>8s} {'max':>8s}  notes")
    for name, (xs, note) in results.items():
        ms = [x * 1000 for x in xs]
        print(f"{name:34s} {len(ms):4d} {pct(ms, 50):8.1f} {pct(ms, 99):8.1f} {max(ms, default=float('nan')):8.1f}  {note}")
    print("target: p99 < 1000 ms, unchanged by the hang")


if __name__ == "__main__":
    main()

"""``rlwatch demo``: the whole loop in one process, with nothing installed.

Two simulated PPO workers train in their own threads through the real SDK (``Monitor``): one
healthy, one whose KL blows up. Their events go through the same processor and rule pack as
``rlwatch worker``; alerts go to the console; pause, stop and adjust commands go back through an
in-process control channel with the same semantics as Redis, and the faulty worker really
blocks at its next step. Then an operator (the demo) raises beta and resumes it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from alerts.actions import Enforcement
from alerts.control import MemoryControl
from alerts.dispatch import Dispatcher
from alerts.notifiers import ConsoleNotifier
from alerts.render import paint
from producers.control import CommandInbox
from producers.monitor import Monitor, TrainingStopped
from producers.sim import SimConfig, Simulator
from contract.alert import Alert
from contract.commands import Command
from contract.events import read_event
from rules.loader import load_pack
from streams.fleet_store import FleetWriter, MemoryFleetStore, summary_of
from streams.processor import Pipeline

__all__ = ["DemoResult", "Observer", "run_demo"]

MAX_LAG = 3   # steps a simulated worker may run ahead of the monitor


class QueueTransport:
    """The SDK's transport in process: serialised events onto a queue (instead of Kafka)."""

    def __init__(self, q: queue.Queue):
        self.q = q

    def send(self, items):
        for _, value in items:
            self.q.put(value)

    def close(self, timeout):
        return None


@dataclass
class Worker:
    run_id: str
    sim: Simulator
    monitor: Monitor
    inbox: CommandInbox
    steps: int
    delay: float
    step: int = 0
    state: str = "running"
    paused_at: int | None = None
    stopped: bool = False
    adjustments: list[dict] = field(default_factory=list)
    rollbacks: list[dict] = field(default_factory=list)
    restart_at: int | None = None   # the step to train next, set by a rollback
    seen_by_monitor: int = -1   # the last step of this run the monitor has processed

    def train(self) -> None:
        try:
            step = 0
            while step < self.steps:
                self.monitor.step_boundary()
                if self.restart_at is not None:     # rolled back: the steps after it again
                    step, self.restart_at = self.restart_at, None
                self.step = step
                ts = time.time()
                for ev in self.sim.step(step, ts):
                    if ev.get("rank", 0) != 0:
                        continue
                    if ev["kind"] == "step":
                        self.monitor.log(step, ev["metrics"], dists=ev.get("dists"),
                                         groups=ev.get("groups"), hashes=ev.get("hashes"))
                    elif ev["kind"] == "samples":
                        self.monitor.log_samples(step, ev["samples"])
                    elif ev["kind"] == "checkpoint":
                        self.monitor.log_checkpoint(step, ev["path"])
                time.sleep(self.delay)
                # a demo on a busy machine must not outrun its own monitor: keep the lag to a
                # few steps, as a real monitor keeps up with a real training step
                deadline = time.monotonic() + 5.0
                while self.seen_by_monitor < step - MAX_LAG and time.monotonic() < deadline:
                    time.sleep(0.001)
                step += 1
        except TrainingStopped:
            self.stopped = True
        finally:
            self.monitor.flush(5.0)

    def on_adjust(self, params: dict, cmd: Command) -> None:
        self.sim.apply_adjust({k: float(v) for k, v in params.items()})
        self.adjustments.append(params)

    def on_rollback(self, params: dict, cmd: Command) -> None:
        """The simulated run restored as of its checkpoint at ``to_step``; it trains the steps
        after it again (the Monitor tags them with a new generation)."""
        to_step = int(params["to_step"])
        self.sim.rollback(to_step)
        self.restart_at = to_step + 1
        self.rollbacks.append(params)


@dataclass
class DemoResult:
    alerts: list[Alert]
    commands: list[Command]
    paused_runs: dict[str, int]
    final_steps: dict[str, int]
    audit: dict[str, list[dict]]


class Observer:
    """What a live view (the web dashboard) is told about the demo's runs. All no-ops here.
    ``observe_event`` gets the core's summary of the run right after the event."""

    def observe_event(self, event, summary: dict | None = None) -> None: ...
    def observe_alert(self, alert: Alert) -> None: ...
    def observe_command(self, command: Command, state: str) -> None: ...


def run_demo(steps: int = 400, onset: int = 120, delay: float = 0.02, pause_hold: float = 2.0,
             out=None, as_json: bool = False, colour: bool | None = None,
             observer: Observer | None = None, control: MemoryControl | None = None,
             auto_resume: bool = True, store=None) -> DemoResult:
    """``observer`` (the dashboard's chart history) and ``store`` (the fleet store its rows come
    from) are fed the way ``rlwatch worker`` feeds them."""
    out = out or sys.stdout
    use_colour = (out.isatty() if hasattr(out, "isatty") else False) if colour is None else colour
    pack = load_pack("rlhf")
    pipeline = Pipeline(pack)
    fleet_writer = None
    if observer is not None or store is not None:
        fleet_writer = FleetWriter(store if store is not None else MemoryFleetStore(),
                                   summary_of, local=observer,
                                   writer="demo")
    observer = observer or Observer()
    control = control or MemoryControl()
    events: queue.Queue = queue.Queue()
    clock = time.time

    def say(line: str, colour_name: str = "dim") -> None:
        if not as_json:
            print(paint(line, colour_name, use_colour), file=out, flush=True)

    # Automatic adjusts are advisory here, so the fault runs its course to the brake; the
    # operator adjusts by hand after the pause (the worker applies it through on_adjust).
    dispatcher = Dispatcher([ConsoleNotifier(out, json_lines=as_json, colour=use_colour,
                                             diagnosis_lines=4)], control, clock=clock,
                            enforcement=Enforcement.parse("adjust"))
    workers: dict[str, Worker] = {}
    specs = [("ppo-healthy", "healthy", 11), ("ppo-kl-blowup", "kl_above_target", 7)]
    for run_id, fault, seed in specs:
        sim = Simulator(SimConfig(run_id=run_id, algo="ppo", fault=fault, onset=onset, seed=seed,
                                  samples_every=10, checkpoint_every=50))
        inbox = CommandInbox(run_id)
        inbox.on_ack = control.record_ack
        control.subscribe(run_id, inbox.deliver_command)
        control.subscribe(run_id, lambda cmd, i=inbox: observer.observe_command(cmd, i.state))
        w = Worker(run_id, sim, None, inbox, steps, delay)  # type: ignore[arg-type]
        w.monitor = Monitor(run_id, transport=QueueTransport(events), inbox=inbox, redis=False,
                            heartbeat_seconds=0, on_adjust=w.on_adjust, on_rollback=w.on_rollback,
                            tags={"algo": "ppo"})
        workers[run_id] = w

    say(f"rlwatch demo: {len(workers)} simulated PPO runs, {len(pack.rules)} rules "
        f"(pack '{pack.pack}'), KL fault injected into ppo-kl-blowup at step {onset}", "info")
    threads = [threading.Thread(target=w.train, name=w.run_id, daemon=True) for w in workers.values()]
    for t in threads:
        t.start()

    all_alerts: list[Alert] = []
    commands: list[Command] = []
    paused: dict[str, int] = {}
    resumed: set[str] = set()
    last_progress = 0.0
    last_flush = 0.0

    async def loop() -> None:
        nonlocal last_progress, last_flush
        while True:
            try:
                raw = events.get(timeout=0.05)
            except queue.Empty:
                raw = None
            if raw is not None:
                event = read_event(raw, clock())
                w = workers.get(event.run_id)
                if w is not None and event.kind == "step":
                    w.seen_by_monitor = max(w.seen_by_monitor, event.step)
                alerts = pipeline.feed(event, clock())
                if fleet_writer is not None:
                    fleet_writer.note(pipeline.state(event.run_id), event, urgent=bool(alerts))
                for alert in alerts:
                    all_alerts.append(alert)
                    observer.observe_alert(alert)
                    delivery = await dispatcher.handle(alert)
                    commands.extend(delivery.commands)
            now = clock()
            if fleet_writer is not None and (fleet_writer.due() or now - last_flush > 0.25):
                last_flush = now
                await fleet_writer.flush()
            for w in workers.values():
                st = w.inbox.state
                if st == "paused" and w.run_id not in paused:
                    paused[w.run_id] = w.step
                    w.paused_at = now
                    say(f"  >> worker {w.run_id} is PAUSED at step {w.step}: its training loop is "
                        "blocked in step_boundary() until resume", "control")
                if (auto_resume and st == "paused" and w.paused_at and now - w.paused_at >= pause_hold
                        and w.run_id not in resumed):
                    resumed.add(w.run_id)
                    say(f"  >> operator: still at step {w.step} after {pause_hold:.1f}s. "
                        f"Raise beta x2 and resume {w.run_id}", "control")
                    for action, params in (("adjust", {"beta": 2.0}), ("resume", {})):
                        cmd = Command(run_id=w.run_id, action=action, params=params, ts=now,
                                      reason="operator: beta x2 after the KL alert", issuer="demo-operator")
                        await control.apply(cmd)
                        commands.append(cmd)
            if not as_json and now - last_progress > 1.0:
                last_progress = now
                parts = [f"{w.run_id} step {w.step} [{w.inbox.state}]" for w in workers.values()]
                say("  " + " | ".join(parts))
            if raw is None and not any(t.is_alive() for t in threads):
                if fleet_writer is not None:
                    await fleet_writer.flush()
                break

    asyncio.run(loop())
    for w in workers.values():
        w.monitor.close(2.0)

    final = {w.run_id: w.step for w in workers.values()}
    audit = {r: list(control.audit.get(r, [])) for r in workers}
    if not as_json:
        say("")
        say("summary", "info")
        for w in workers.values():
            n = [a for a in all_alerts if a.run_id == w.run_id and a.state == "firing"]
            worst = max((a.severity for a in n), key=["info", "yellow", "orange", "red", "black"].index,
                        default="none")
            acks = sum(1 for e in audit[w.run_id] if e.get("type") == "ack")
            say(f"  {w.run_id:15s} last step {w.step:4d}  state {w.inbox.state:8s} alerts {len(n):2d} "
                f"(worst {worst})  commands acknowledged {acks}"
                + (f"  paused at step {paused[w.run_id]}" if w.run_id in paused else ""), "info")
    else:
        print(json.dumps({"summary": {"final_steps": final, "paused": paused}}), file=out)
    return DemoResult(all_alerts, commands, paused, final, audit)

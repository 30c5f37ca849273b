"""``Monitor``: the three lines users put in their training loop (contract.md, section 5b).

    from producers import Monitor

    with Monitor(run_id="ppo-8b-a") as mon:
        for step in range(num_steps):
            mon.step_boundary()            # applies pause / stop / adjust / rollback
            ...                            # the training step
            mon.log(step, {"kl/mean": kl, "reward/mean": r})

``log`` only appends to a bounded buffer; a background thread publishes to Kafka. Nothing
from monitoring reaches the training loop except :class:`TrainingStopped`, raised by
``step_boundary`` when the run was told to stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Mapping

from producers.control import CommandInbox, ControlListener, TrainingStopped
from producers.sender import BackgroundSender, KafkaTransport, Transport
from contract.settings import redis_url_problem
from contract.commands import Command

__all__ = ["Monitor", "TrainingStopped"]

log = logging.getLogger("rlwatch.producers")


def _env_rank() -> tuple[int, int | None]:
    for rk, wk in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                   ("SLURM_PROCID", "SLURM_NTASKS")):
        if rk in os.environ:
            try:
                return int(os.environ[rk]), int(os.environ[wk]) if wk in os.environ else None
            except ValueError:
                pass
    return 0, None


class Monitor:
    """Publishes a run's events and obeys its control commands.

    Settings come from arguments, else the environment: ``RLWATCH_KAFKA`` (bootstrap servers,
    default ``localhost:9092``), ``RLWATCH_REDIS`` (default ``redis://localhost:6379/0``),
    ``RLWATCH_CONTROL_SECRET`` (HMAC key commands must be signed with), ``RANK``/``WORLD_SIZE``,
    ``RLWATCH_INCARNATION`` (the id of this start of the program; default: a fresh random one).
    Pass ``kafka=False`` or ``redis=False`` to switch a side off, or a ``transport`` and an
    ``inbox`` of your own (the embedded demo runs both in process).
    """

    def __init__(self, run_id: str, *, kafka: str | bool | None = None, redis: str | bool | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 tags: Mapping[str, str] | None = None, targets: Mapping[str, float] | None = None,
                 topic: str | None = None, transport: Transport | None = None, inbox: CommandInbox | None = None,
                 buffer_size: int = 10_000,
                 heartbeat_seconds: float = 10.0, control_secret: str | None = None,
                 on_adjust: Callable[[dict[str, Any], Command], None] | None = None,
                 on_rollback: Callable[[dict[str, Any], Command], None] | None = None,
                 on_snapshot: Callable[[Command], None] | None = None,
                 pause_timeout: float | None = None,
                 clock: Callable[[], float] = time.time, incarnation: str | None = None):
        if not run_id or any(c.isspace() for c in run_id):
            raise ValueError(f"run_id must be a non-empty string without spaces, got {run_id!r}")
        env_rank, env_world = _env_rank()
        self.run_id = run_id
        # a fresh id per start of the program: the monitor watches a relaunched run afresh
        self.incarnation = incarnation or os.environ.get("RLWATCH_INCARNATION") or uuid.uuid4().hex[:16]
        self.rank = env_rank if rank is None else rank
        self.world_size = world_size if world_size is not None else env_world
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        for k, v in (targets or {}).items():
            self.tags[f"target.{k}"] = str(float(v))
        self.clock = clock
        self.on_adjust, self.on_rollback, self.on_snapshot = on_adjust, on_rollback, on_snapshot
        self.pause_timeout = pause_timeout
        self.last_step = 0
        self.applied: list[Command] = []
        self._key = run_id.encode()
        self._closed = False

        if transport is None and kafka is not False:
            from contract.settings import Settings

            settings = Settings.from_env()
            bootstrap = kafka if isinstance(kafka, str) else settings.kafka
            # SASL/SSL settings (RLWATCH_KAFKA_SECURITY_PROTOCOL, ...) pass through
            transport = KafkaTransport(bootstrap, topic or settings.events_topic,
                                       **settings.kafka_python_kwargs())
        self.sender = BackgroundSender(transport, capacity=buffer_size, clock=clock) if transport else None

        self.control: CommandInbox | None = inbox
        if inbox is None and redis is not False:
            url = redis if isinstance(redis, str) else os.environ.get("RLWATCH_REDIS", "redis://localhost:6379/0")
            problem = redis_url_problem(url, "redis" if isinstance(redis, str) else "RLWATCH_REDIS")
            if problem:     # a configuration mistake, said at once, not a "transient" outage later
                raise ValueError(f"rlwatch Monitor: {problem}")
            secret = control_secret or os.environ.get("RLWATCH_CONTROL_SECRET") or None
            self.control = ControlListener(url, run_id, self.rank, secret=secret, clock=clock,
                                           world_size=self.world_size)
        elif inbox is not None and inbox.world_size is None:
            inbox.world_size = self.world_size

        self._hb_stop = threading.Event()
        self._hb = None
        if self.sender is not None and heartbeat_seconds > 0:
            self._hb = threading.Thread(target=self._heartbeat, args=(heartbeat_seconds,),
                                        name="rlwatch-heartbeat", daemon=True)
            self._hb.start()

    # -- publishing -----------------------------------------------------------------------------
    def _envelope(self, kind: str, step: int) -> dict:
        ev = {"schema": 1, "kind": kind, "run_id": self.run_id, "rank": self.rank, "step": step,
              "ts": self.clock(), "incarnation": self.incarnation}
        if self.world_size is not None:
            ev["world_size"] = self.world_size
        if self.tags:
            ev["tags"] = self.tags
        return ev

    def log(self, step: int, metrics: Mapping[str, float], *, dists: Mapping[str, list] | None = None,
            groups: Mapping[str, Mapping[str, float]] | None = None,
            hashes: Mapping[str, str] | None = None, batch_ids: list[str] | None = None) -> None:
        """Queue the metrics of one optimisation step. Returns in microseconds."""
        if self.sender is None:
            return
        ev = self._envelope("step", step)
        ev["metrics"] = dict(metrics)
        if dists:
            ev["dists"] = {k: list(v) for k, v in dists.items()}
        if groups:
            ev["groups"] = {k: dict(v) for k, v in groups.items()}
        if hashes:
            ev["hashes"] = dict(hashes)
        if batch_ids:
            ev["batch_ids"] = list(batch_ids)
        self.last_step = step
        self.sender.put(self._key, ev)

    def log_samples(self, step: int, samples: list[Mapping[str, Any]]) -> None:
        if self.sender is None:
            return
        ev = self._envelope("samples", step)
        ev["samples"] = [dict(s) for s in samples]
        self.sender.put(self._key, ev)

    def log_checkpoint(self, step: int, path: str) -> None:
        if self.sender is None:
            return
        ev = self._envelope("checkpoint", step)
        ev["path"] = str(path)
        self.sender.put(self._key, ev)

    def _heartbeat(self, every: float) -> None:
        while not self._hb_stop.wait(every):
            self.sender.put(self._key, self._envelope("heartbeat", self.last_step))

    # -- control --------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """running, paused or stopped, as this worker last heard from the control channel."""
        return self.control.state if self.control else "running"

    def step_boundary(self) -> None:
        """Apply pending commands. Blocks while paused; raises TrainingStopped when stopped."""
        c = self.control
        if c is None or not c.changed:
            return
        c.changed = False
        self._apply_one_shots(c)
        acked = until = None
        while c.state == "paused":   # a loop: a new pause may land right after a resume
            cmd = c.state_command
            if cmd is not acked:
                log.warning("rlwatch: run %s paused at step %s (%s); waiting for resume",
                            self.run_id, self.last_step, cmd.reason if cmd else "")
                c.ack(cmd, "applied", f"paused at step {self.last_step}")
                acked = cmd
                if self.pause_timeout is not None:
                    until = time.monotonic() + self.pause_timeout
            # woken by a resume or a stop, and by an adjust, a rollback or a snapshot, which are
            # applied while paused (the operator's rollback loads before the resume)
            if not c.wait_news(None if until is None else max(0.0, until - time.monotonic())):
                c.ack(cmd, "timeout", f"pause timed out after {self.pause_timeout}s; continuing")
                log.warning("rlwatch: pause timed out after %ss; continuing", self.pause_timeout)
                return
            if c.closed:          # the monitor is closing: let the training thread go
                return
            c.changed = False
            self._apply_one_shots(c)
            if c.state == "running":
                c.ack(c.state_command, "applied", f"resumed at step {self.last_step}")
                log.warning("rlwatch: run %s resumed", self.run_id)
        if c.state == "stopped":
            c.ack(c.state_command, "applied", f"stopped at step {self.last_step}")
            raise TrainingStopped(c.state_command)

    def _apply_one_shots(self, c) -> None:
        for cmd in c.take_one_shots():
            self._apply_one_shot(cmd)

    def _apply_one_shot(self, cmd: Command) -> None:
        handler = {"adjust": self.on_adjust, "rollback": self.on_rollback,
                   "snapshot": self.on_snapshot}.get(cmd.action)
        if handler is None:     # (a snapshot without on_snapshot was said "applied" before)
            self.control.ack(cmd, "ignored", f"no on_{cmd.action} callback")
            return
        try:
            if cmd.action == "snapshot":
                handler(cmd)
            else:
                handler(dict(cmd.params), cmd)
        except TrainingStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing user callback is reported, not raised
            log.warning("rlwatch: %s callback failed: %s", cmd.action, exc)
            self.control.ack(cmd, "failed", str(exc))
            return
        self.applied.append(cmd)
        if cmd.action == "rollback":
            # the steps after the checkpoint will be trained again: a new generation tells the
            # monitor that they are not duplicates, and (the heartbeat's step, until the next
            # step is logged) where the run went back to: its checkpoints after it are forgotten
            self.tags["generation"] = str(int(self.tags.get("generation", "0")) + 1)
            to_step = cmd.params.get("to_step")
            if isinstance(to_step, int) and not isinstance(to_step, bool) and 0 <= to_step < self.last_step:
                self.last_step = to_step
        self.control.ack(cmd, "applied")

    # -- lifetime -------------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events dropped because the buffer was full (the broker slow or down)."""
        return self.sender.dropped_total if self.sender else 0

    def flush(self, timeout: float = 10.0) -> bool:
        return self.sender.flush(timeout) if self.sender else True

    def close(self, timeout: float = 10.0) -> bool:
        """Flush within ``timeout`` and stop the background threads. Never raises."""
        if self._closed:
            return True
        self._closed = True
        self._hb_stop.set()
        ok = True
        try:
            if self.sender is not None:
                # the last event says the script closed its monitor: the fleet shows it finished
                self.sender.put(self._key, {**self._envelope("heartbeat", self.last_step), "final": True})
                ok = self.sender.close(timeout)
                if not ok:
                    log.warning("rlwatch: %d events not delivered at close", self.sender.pending())
            if self.control is not None:
                self.control.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("rlwatch: error while closing the monitor: %s", exc)
            ok = False
        return ok

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The fleet view every worker shares: one small record per run, kept in Redis. An edge module.

Each worker processes the runs of its own partitions; an operator wants every run in one place.
So each worker writes, for every run it processes, a **record** into Redis under its
application's namespace (``rlwatch:<app_id>:fleet``), and every dashboard (``rlwatch worker
--web``, ``rlwatch web``) and ``rlwatch status`` reads all of them. The records outlive the
worker that wrote them (a restarted worker continues them), and expire with the run's TTL.

A record is the core's run summary (``RunState.summary()``: last step, incarnation, targets, KL
lines, open alerts, the smoothed values the rules read) plus what only a fleet view needs:

* ``spark``: a few dozen ``[step, value]`` points of KL and reward over the whole run, one per
  logged step of rank 0 (the writer keeps them between writes, so a short run or a burst of
  events processed at once draws every step), thinned as the run grows (every other point
  dropped when full, the stride doubled);
* ``rate``: two ``[ts, step]`` points for steps per second;
* ``closed``: set when the training script closed its monitor cleanly (the SDK's last event is
  a heartbeat with ``"final": true``), cleared when the run (or a relaunch of it) speaks again;
* ``writer``, ``updated``: which worker wrote it, and when.

:func:`run_status` says what the fleet shows for a run: ``live``, ``silent`` (no event for
longer than the liveness rule waits), or ``finished`` (closed cleanly, or silent for longer than
``finished_after`` seconds).

Keys (``ns`` = ``rlwatch:<app_id>:fleet``):

* ``<ns>:run:<run_id>``: the record (JSON), with the run TTL;
* ``<ns>:index``: a sorted set of run ids, scored by the time their record was written (so a
  reader fetches only what changed since its last look).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from contract.events import record_json

__all__ = ["FINISHED_AFTER", "FLUSH_SHARE", "MAX_FLUSH_GAP", "SILENT_AFTER", "FleetStore",
           "FleetWriter", "MemoryFleetStore", "finite_number", "fleet_namespace", "make_record",
           "run_status", "summary_of"]

RECORD_VERSION = 1
#: a run silent this long is shown as finished (unless it closed cleanly earlier)
FINISHED_AFTER = 3600.0
#: a run silent this long is shown as silent (the built-in liveness rule waits as long)
SILENT_AFTER = 300.0
SPARK_POINTS = 48
SPARK_METRICS = ("kl/mean", "reward/mean")
RATE_WINDOW = 30.0
MAX_CACHED = 5000     # records a writer keeps to continue sparklines without reading them back
#: the fleet view's writes take at most about this share of the worker's time: a flush that took
#: ``t`` seconds is followed by the next one no sooner than ``t / FLUSH_SHARE`` seconds later
FLUSH_SHARE = 0.05
#: the longest a changed run's record waits for its write, however long the flushes take
MAX_FLUSH_GAP = 15.0
#: records built between two turns of the event loop: built all at once, the records of 1,250
#: runs held the worker's loop, and with it the events and the brakes they raise (such a flush
#: took up to a second, its write to Redis included)
FLUSH_SLICE = 100


def fleet_namespace(app_id: str) -> str:
    return f"rlwatch:{app_id}:fleet"


def finite_number(x: Any) -> float | None:
    """``x`` as a finite float, or None (missing, not a number, NaN or infinite)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# -- the run summary ------------------------------------------------------------------------------
def summary_of(state) -> dict:
    """The core's summary of a run (``RunState.summary()``): the numbers the rules use."""
    return state.summary()


def kl_lines_of(rules, targets: dict, params: dict) -> dict[str, float]:
    """Thresholds of ``kl_above_target`` on ``kl/mean`` per tier, resolved as the engine does
    (for a pack's defaults; a run's own lines come with its summary)."""
    from rules.compile import kl_lines

    return {k: round(v, 9) for k, v in kl_lines(rules, targets, params).items()}


# -- records ---------------------------------------------------------------------------------------
def _spark_add(spark: dict | None, points: list) -> dict:
    """Append ``points`` (``(step, {metric: value})``, ascending); when full, keep every other
    point and double the stride."""
    spark = {"stride": 1, "points": {}} if not spark else {"stride": spark.get("stride", 1),
                                                           "points": dict(spark.get("points", {}))}
    for step, values in points:
        for m in SPARK_METRICS:
            v = finite_number(values.get(m))
            if v is None:
                continue
            pts = list(spark["points"].get(m, []))
            if pts and step <= pts[-1][0]:
                if step < pts[-1][0]:       # the run went back (rollback, relaunch): start over
                    pts = [p for p in pts if p[0] < step]
                else:
                    pts = pts[:-1]
            if pts and step - pts[-1][0] < spark["stride"]:
                continue
            pts.append([step, float(f"{v:.5g}")])
            spark["points"][m] = pts
        while any(len(p) > SPARK_POINTS for p in spark["points"].values()):
            spark["stride"] *= 2
            spark["points"] = {m: p[::2] if len(p) > SPARK_POINTS else p for m, p in spark["points"].items()}
    return spark


def make_record(summary: dict, prev: dict | None, now: float, *, writer: str = "",
                closed: dict | None | bool = False, points: list | None = None) -> dict:
    """The record of a run: its summary plus the fleet's display fields (see the module doc).

    ``closed``: a dict when the run closed its monitor now, False to keep what ``prev`` said
    (until an event newer than the close arrives). ``points``: the sparkline's points of the
    steps since the last record (``(step, {metric: value})``); without them, one point from the
    summary (the smoothed value the rules read, else the last logged one)."""
    prev = prev or {}
    same = (prev.get("summary", {}).get("incarnation") == summary.get("incarnation"))
    spark = prev.get("spark") if same else None
    if points is None and summary.get("last_step") is not None:
        smoothed, latest = summary.get("smoothed") or {}, summary.get("latest") or {}
        points = [(summary["last_step"], {m: smoothed.get(m, latest.get(m)) for m in SPARK_METRICS})]
    spark = _spark_add(spark, points or [])
    step, ts = summary.get("last_step"), finite_number(summary.get("last_event_ts"))
    rate = [p for p in (prev.get("rate") or []) if same] if step is not None else []
    if step is not None and ts is not None:
        if not rate or (rate[-1][1] is not None and step < rate[-1][1]):
            rate = [[ts, step]]
        elif ts - rate[0][0] > RATE_WINDOW and len(rate) >= 2:
            rate = [rate[-1], [ts, step]]
        elif len(rate) == 1 or ts != rate[-1][0]:
            rate = [rate[0], [ts, step]]
    closed_now = prev.get("closed") if closed is False else closed
    if closed is False and closed_now and ts is not None and ts > (finite_number(closed_now.get("ts")) or 0):
        closed_now = None            # the run (or a relaunch of it) spoke after it closed
    return {"v": RECORD_VERSION, "run_id": summary["run_id"], "summary": summary, "spark": spark,
            "rate": rate, "closed": closed_now, "writer": writer, "updated": now}


def steps_per_second(record: dict, now: float) -> float:
    rate = record.get("rate") or []
    if len(rate) < 2:
        return 0.0
    (t0, s0), (t1, s1) = rate[0], rate[-1]
    if now - t1 > RATE_WINDOW or t1 <= t0:     # nothing recent: the run is not moving
        return 0.0
    return max(0.0, (s1 - s0) / (t1 - t0))


def run_status(record: dict, now: float, *, silent_after: float = SILENT_AFTER,
               finished_after: float = FINISHED_AFTER) -> str:
    """``live``, ``silent`` or ``finished`` (see the module doc)."""
    if record.get("closed"):
        return "finished"
    ts = finite_number(record.get("summary", {}).get("last_event_ts"))
    if ts is None:
        ts = finite_number(record.get("updated"))
    if ts is None:
        return "live"
    age = now - ts
    if age > finished_after:
        return "finished"
    if age > silent_after:
        return "silent"
    return "live"


def writer_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# -- stores ----------------------------------------------------------------------------------------
class MemoryFleetStore:
    """The store in process (the embedded demo, tests). Same methods as :class:`FleetStore`;
    safe to share between threads (the demo writes from its loop, the dashboard reads from its own)."""

    def __init__(self):
        self.records: dict[str, dict] = {}
        self._lock = threading.Lock()

    async def put(self, records: Iterable[dict]) -> None:
        copies = [json.loads(json.dumps(r)) for r in records]
        with self._lock:
            for r in copies:
                self.records[r["run_id"]] = r

    async def get(self, run_id: str) -> dict | None:
        with self._lock:
            return self.records.get(run_id)

    async def get_many(self, run_ids: Iterable[str]) -> dict[str, dict]:
        with self._lock:
            return {r: self.records[r] for r in run_ids if r in self.records}

    async def changed_since(self, since: float) -> list[dict]:
        with self._lock:
            return [r for r in self.records.values() if r["updated"] > since]

    async def all(self) -> list[dict]:
        with self._lock:
            return list(self.records.values())

    async def run_ids(self) -> list[str]:
        with self._lock:
            return sorted(self.records)

    async def delete(self, run_id: str) -> None:
        with self._lock:
            self.records.pop(run_id, None)

    async def close(self) -> None:
        return None


class FleetStore:
    """The records in Redis (``redis.asyncio``), namespaced by application id."""

    def __init__(self, redis, app_id: str = "rlwatch", ttl_seconds: float = 72 * 3600):
        self.redis = redis
        self.app_id = app_id
        self.ns = fleet_namespace(app_id)
        self.index = f"{self.ns}:index"
        self.ttl = max(1, int(ttl_seconds))

    @classmethod
    def from_url(cls, url: str, app_id: str = "rlwatch", ttl_seconds: float = 72 * 3600) -> FleetStore:
        import redis.asyncio as aioredis

        return cls(aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3),
                   app_id, ttl_seconds)

    def key(self, run_id: str) -> str:
        return f"{self.ns}:run:{run_id}"

    async def put(self, records: Iterable[dict]) -> None:
        records = list(records)
        if not records:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for r in records:
                pipe.set(self.key(r["run_id"]), record_json(r), ex=self.ttl)
            # the index in one command (a fleet writes a thousand records a second)
            pipe.zadd(self.index, {r["run_id"]: r["updated"] for r in records})
            await pipe.execute()

    async def get(self, run_id: str) -> dict | None:
        raw = await self.redis.get(self.key(run_id))
        return json.loads(raw) if raw else None

    async def get_many(self, run_ids: Iterable[str]) -> dict[str, dict]:
        ids = list(run_ids)
        out: dict[str, dict] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            for run_id, raw in zip(chunk, await self.redis.mget([self.key(r) for r in chunk])):
                if raw:
                    out[run_id] = json.loads(raw)
        return out

    async def changed_since(self, since: float) -> list[dict]:
        """Records written after ``since`` (the writer's clock); expired ones leave the index."""
        ids = [m.decode() for m in await self.redis.zrangebyscore(self.index, f"({since}", "+inf")]
        got = await self.get_many(ids)
        gone = [r for r in ids if r not in got]
        if gone:
            await self.redis.zrem(self.index, *gone)
        return list(got.values())

    async def all(self) -> list[dict]:
        return await self.changed_since(float("-inf"))

    async def run_ids(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.zrange(self.index, 0, -1))

    async def delete(self, run_id: str) -> None:
        await self.redis.delete(self.key(run_id))
        await self.redis.zrem(self.index, run_id)

    async def close(self) -> None:
        await self.redis.aclose()


# -- the worker's side -----------------------------------------------------------------------------
class FleetWriter:
    """Called by the worker after each event (``note``); writes changed runs' records once a
    second (``flush``), and sooner when a note was urgent (the demo's, when an alert changed).
    Never raises into the pipeline: a Redis failure is logged once per outage and the records
    are written when it is back.

    A worker of thousands of runs writes thousands of records per flush: :meth:`ready` says
    whether a periodic flush is due, which it is after an urgent note, or once the last flush
    started at least ``1 / FLUSH_SHARE`` (20) times as long ago as it took (at most
    ``MAX_FLUSH_GAP`` seconds). A few dozen runs take a millisecond or two and are written
    every second; a thousand take about a tenth of a second and wait two, so the writes stay
    about a twentieth of the worker's time, and the dashboard's records are that much older.

    ``local``: an optional observer of the same process (the dashboard's chart history) that is
    given each event with the summary the core holds after it (``observe_event(event, summary)``).
    """

    def __init__(self, store, summarise: Callable[[Any], dict], *, local=None,
                 clock: Callable[[], float] = time.time, writer: str | None = None, log=None,
                 timer: Callable[[], float] = time.monotonic):
        self.store = store
        self.timer = timer
        self.next_at = 0.0        # the timer's reading before which a flush waits (see ready)
        self.summarise = summarise
        self.local = local
        self.clock = clock
        self.writer = writer or writer_id()
        self.log = log
        self.states: dict[str, Any] = {}
        self.dirty: set[str] = set()
        self.urgent = False
        self.closed: dict[str, dict | None] = {}
        self.records: dict[str, dict] = {}
        self.points: dict[str, list] = {}     # sparkline points of rank 0's steps since the last write
        self.rank0: set[str] = set()          # runs whose rank 0 logs steps
        self.failing = False
        self.errors = 0

    def note(self, state, event=None, *, urgent: bool = False) -> None:
        """The run's state after ``event`` was processed. Called for every event: it only
        marks the run changed and keeps rank 0's sparkline values; the record is built when
        written."""
        run_id = state.run_id
        self.states[run_id] = state
        self.dirty.add(run_id)
        if urgent:
            self.urgent = True
        if event is None:
            return
        kind = getattr(event, "kind", None)
        rank = None
        if kind == "step":
            rank = getattr(event, "rank", 0)
            if not rank:
                metrics = getattr(event, "metrics", None)
                if metrics:
                    values = {}
                    for m in SPARK_METRICS:
                        v = metrics.get(m)
                        if v is not None or m in metrics:
                            values[m] = v
                    if values:
                        pts = self.points.get(run_id)
                        if pts is None:
                            pts = self.points[run_id] = []
                        pts.append((event.step, values))
                        if len(pts) > 4 * SPARK_POINTS:  # many steps between two writes: thin
                            pts[:] = pts[::2]
        elif kind == "heartbeat" and getattr(event, "final", False) is True:
            self.closed[run_id] = {"ts": event.ts, "step": event.step,
                                   "reason": "the training script closed its monitor"}
            self.urgent = True
        if self.local is not None:
            try:
                # the summary (built per call) with rank 0's steps and the other kinds; the other
                # ranks' steps of a run that has a rank 0 (most of a fleet's events) draw nothing
                # that needs it
                if rank == 0:
                    self.rank0.add(run_id)
                skip = bool(rank) and run_id in self.rank0
                self.local.observe_event(event, None if skip else self.summarise(state))
            except Exception:  # noqa: BLE001 - the dashboard must never break the pipeline
                self.errors += 1

    def forget(self, run_id: str) -> None:
        self.states.pop(run_id, None)
        self.points.pop(run_id, None)
        self.rank0.discard(run_id)
        self.dirty.discard(run_id)
        self.records.pop(run_id, None)
        self.closed.pop(run_id, None)

    def due(self) -> bool:
        return bool(self.dirty) and self.urgent

    def ready(self) -> bool:
        """Whether a periodic flush should write now: runs changed, and a note was urgent or
        the last flush is long enough ago for what it cost (see the class doc)."""
        return bool(self.dirty) and (self.urgent or self.timer() >= self.next_at)

    async def flush(self) -> int:
        """Write the records of the runs that changed. Returns how many were written."""
        if not self.dirty:
            return 0
        started = self.timer()
        try:
            return await self._flush()
        finally:
            self.next_at = started + min(MAX_FLUSH_GAP, (self.timer() - started) / FLUSH_SHARE)

    async def _flush(self) -> int:
        now = self.clock()
        ids = list(self.dirty)
        self.dirty.clear()
        self.urgent = False
        try:
            missing = [r for r in ids if r not in self.records]
            if missing:   # continue what another worker (or this one before a restart) wrote
                self.records.update(await self.store.get_many(missing))
            out, used = [], {}
            for i, run_id in enumerate(ids):
                if i and i % FLUSH_SLICE == 0:
                    await asyncio.sleep(0)      # the events lane gets a turn between slices
                st = self.states.get(run_id)
                if st is None:
                    continue
                used[run_id] = closed = self.closed.get(run_id, False)
                out.append(make_record(self.summarise(st), self.records.get(run_id), now,
                                       writer=self.writer, closed=closed, points=self.points.pop(run_id, None)))
            await self.store.put(out)
            for rec in out:
                run_id = rec["run_id"]
                self.records[run_id] = rec
                if run_id not in self.dirty:        # no newer event while writing
                    self.states.pop(run_id, None)   # a state is held only until it is written
                if self.closed.get(run_id, False) is used[run_id]:
                    self.closed.pop(run_id, None)
            if len(self.records) > MAX_CACHED:     # forget the records of runs gone quiet here
                for run_id in sorted(self.records, key=lambda r: self.records[r]["updated"])[:MAX_CACHED // 2]:
                    if run_id not in self.dirty:
                        del self.records[run_id]
                        self.rank0.discard(run_id)
        except Exception as exc:  # noqa: BLE001 - Redis down: say it once, try again next time
            self.dirty.update(r for r in ids if r in self.states)
            self.errors += 1
            if not self.failing and self.log is not None:
                self.log.error("rlwatch: cannot write the fleet view to Redis (%s); will retry", exc)
            self.failing = True
            return 0
        if self.failing and self.log is not None:
            self.log.warning("rlwatch: writing the fleet view to Redis again")
        self.failing = False
        return len(out)

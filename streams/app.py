"""The stream processor on Kafka: a Faust app (``rlwatch worker``).

Reads as a declaration: topics, the run-state table, two lanes and some timers. The lanes
only move data and call the pure core (:class:`streams.processor.Processor`) and the delivery
edge (:class:`alerts.dispatch.Dispatcher`).

* ``rlwatch.events`` (key = run_id) -> validate -> malformed events go to ``rlwatch.dlq`` with
  the reason -> the run's state from the ``rlwatch-runs`` table -> alerts to ``rlwatch.alerts``.
  The events come a fetched batch at a time (:mod:`streams.batch_lane`: Faust's consumer hands
  the batch to ``process_batch``, past Faust's per-message agent path, which alone costs about
  13 times the CPU of a bare consumer); the events processed are acknowledged before each
  await (only then can Faust commit), and Faust commits only acknowledged offsets.
  ``RLWATCH_BATCH_LANE=0`` turns the lane off (every event through the agent's stream, as
  before).
* a firing alert's brake is pulled at once from the events agent, on the brake's own thread
  (:class:`alerts.brake.BrakeThread`: its own event loop and Redis client, so a pause waits for
  no turn behind events or notifications), and again from the alerts topic, which is what makes
  it durable:
* ``rlwatch.alerts`` -> the **brake** (commands to the control channel, retried until Redis
  takes them; on its own thread, nothing else in its way) and the **notification** (the outbox
  in Redis; sending happens in background lanes, one per receiver, so a hanging Slack holds back
  nobody), each idempotent; an alert is acknowledged only once both acted, so a worker killed at
  any point leaves it to be read again by its successor (:mod:`streams.alerts_lane`; the alerts
  come a fetched batch at a time too).
* every ``delivery_tick_seconds``: repeats, unacknowledged brakes (re-sent, escalated), retries.
* every ``tick_seconds``: liveness rules (``run_stalled``) for the runs this worker owns.

Restarts are quick: each worker process has a stable group instance id (Kafka static membership,
:func:`worker_instance_id`), so a worker restarted after a crash takes its partitions back at
once instead of waiting for the dead member's session to time out; the session timeout itself
is short (``RLWATCH_SESSION_TIMEOUT``, 10 s). A worker that stops leaves the group all the same
(:mod:`streams.group_leave`), so its runs go to the other workers at once. While the broker is down, its clients' logs are
reduced to one line when the trouble starts and one when it ends (:mod:`streams.broker_log`).

Run states live in a Faust table (changelog-backed), so a restarted worker resumes where the
last one stopped; its values are MessagePack (:mod:`streams.state_codec`, which also reads the
JSON of older workers). The decoded states are cached in memory and the changed ones written back
to the table right before each offset commit (every 2.8 s, Faust's commit interval) and on
every alert, which keeps the changelog small; Faust flushes the producer before it commits,
so a committed event's state is in the changelog first. Events re-read after a restart (those
not committed yet) are recognised by their step and not counted twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import tempfile
import time
from collections import Counter, OrderedDict, deque
from functools import partial
from itertools import islice

import faust
from aiokafka.partitioner import murmur2

from alerts.delivery import delivery_key
from alerts.factory import build_brake_thread, build_dispatcher
from contract.alert import Alert
from contract.events import EventError, read_event
from contract.settings import Settings
from rules.loader import load_pack
from streams.alerts_lane import AlertsLane
from streams.batch_lane import BatchApp, Turns
from streams.broker_log import BrokerLogGate
from streams.fleet_store import FleetStore, FleetWriter, summary_of
from streams.heap import Heap
from streams.liveness import liveness_pass
from streams.processor import Processor, read_routine
from streams.read_marks import ReadMarks
from streams.run import RunState, sane_ts
from streams.snapshot import SnapshotRecorder, attach_snapshot
from streams.state_codec import StateDecodeError, decode_state, encode_state

__all__ = ["CHANGELOG_CONFIG", "build_app", "changelog_topic", "ensure_topics", "partition_of",
           "worker_instance_id"]

log = logging.getLogger("rlwatch.worker")

FLUSH_SECONDS = 1.0       # the fleet view's flush to Redis
HEAP_SECONDS = 60.0       # how often the worker asks whether a thaw of the frozen heap is due
_DEAD, _ALERTS = "dead", "alerts"
MAX_STATE_BYTES = 900_000   # an encoded state's limit, under Kafka's default 1 MB message limit
PARTITIONS = 4   # the events topic and the run table are co-partitioned by run_id
MAX_DECODED_RUNS = 2000   # run states kept decoded in memory; the others wait in the table
#: how long the events lane may hold the GIL while another thread waits for it (Python's
#: default is 5 ms). Faust's consumer thread fetches and unpacks the next batch, and the brake
#: thread sends the commands; each waits for the GIL at every wake-up while the lane works. A
#: fetch is many socket reads, so with 5 ms a wait each the next batch came late. Measured
#: through Kafka (bench_worker_kafka, 48 runs x 800 steps) against the worker with 5 ms, two
#: runs of 5 rounds: 1.13 and 1.03 times the throughput at the median, faster in 8 rounds of 10
#: (1 ms: faster in 6 of 8; 20 ms: slower)
GIL_SWITCH_SECONDS = 0.0005
RUN_TABLE = "rlwatch-runs"
#: the run table's changelog (compacted): segments rolled at 64 MB or ten minutes and cleaned
#: soon after, so that a restarted worker reads about one state per run instead of every state
#: written since the last roll of a 1 GB segment (Kafka's default): a 48-run worker writes
#: one in about 20 minutes, a 1,000-run one in a few, and measured on this broker, 1 GB more
#: of changelog took a restart from 3.6 to 7.3 s to Faust's "Ready"
CHANGELOG_CONFIG = {"segment.bytes": str(64 << 20), "segment.ms": str(10 * 60 * 1000),
                    "min.cleanable.dirty.ratio": "0.2"}


def changelog_topic(settings: Settings) -> str:
    """The name Faust gives the run table's changelog topic."""
    return f"{settings.app_id}-{RUN_TABLE}-changelog"


def worker_instance_id(settings: Settings) -> str | None:
    """This worker's Kafka group instance id (static membership), or None to do without.

    ``RLWATCH_WORKER_ID`` names it; unset, it is ``<host>-<slot>``, the slot being the first of
    this host's lock files (one per application and slot) that no running worker holds. A worker
    killed by any means releases its lock, so its successor on the same host takes the same id
    and, with it, the dead worker's place in the group at once.
    """
    wanted = (settings.worker_id or "").strip()
    if wanted.lower() == "none":
        return None
    if wanted:
        return wanted
    import fcntl

    host = socket.gethostname() or "host"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in settings.app_id)
    for slot in range(256):
        path = os.path.join(tempfile.gettempdir(), f"rlwatch-worker-{safe}-{slot}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.warning("rlwatch: no lock file for a worker id (%s); static membership off "
                        "(set RLWATCH_WORKER_ID to turn it on)", exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held_locks.append(fd)        # held (open) for the life of the process
        return f"{host}-{slot}"
    return None


_held_locks: list[int] = []


def _crash_point(name: str) -> None:
    """For the crash drills of the tests only: with ``RLWATCH_CRASH_AT=<name>`` the worker kills
    itself (SIGKILL, nothing flushed) the first time it gets here; ``RLWATCH_CRASH_ONCE`` names a
    file that marks it done, so the restarted worker goes on."""
    if os.environ.get("RLWATCH_CRASH_AT") != name:
        return
    marker = os.environ.get("RLWATCH_CRASH_ONCE")
    if marker:
        if os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(name)
    log.error("rlwatch: crash drill: killing this worker at %s", name)
    os.kill(os.getpid(), signal.SIGKILL)


def broker_credentials(settings: Settings):
    """The ``broker_credentials`` of the Faust app (SASL and/or SSL), or None."""
    ctx = settings.kafka_ssl_context()
    if settings.kafka_sasl_mechanism:
        mech = settings.kafka_sasl_mechanism.upper()
        if mech == "GSSAPI":
            return faust.GSSAPICredentials(kerberos_service_name=settings.kafka_sasl_username or "kafka",
                                           ssl_context=ctx)
        return faust.SASLCredentials(username=settings.kafka_sasl_username,
                                     password=settings.kafka_sasl_password,
                                     mechanism=mech, ssl_context=ctx)
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None


def ensure_topics(settings: Settings, timeout: float = 30.0) -> None:
    """Create the events, alerts and dead-letter topics if they are missing, and give an
    existing run-table changelog the settings of :data:`CHANGELOG_CONFIG` (an older worker
    created it with Kafka's defaults; Faust creates a missing one with them).

    Faust only subscribes to topics that exist when it starts; creating them first means a
    worker started before any training run still sees the first events.
    """
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=settings.kafka.split(","), client_id="rlwatch-admin",
                             request_timeout_ms=int(timeout * 1000), **settings.kafka_python_kwargs())
    try:
        existing = set(admin.list_topics())
        wanted = [settings.events_topic, settings.alerts_topic, settings.dlq_topic]
        new = [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1)
               for t in wanted if t not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
        name = changelog_topic(settings)
        if name in existing:
            try:   # incremental: the topic's other settings stay as they are
                got = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name,
                                                          configs=dict(CHANGELOG_CONFIG))])
                result = str(got.get("topic", {}).get(name, "no answer"))
            except Exception as exc:  # noqa: BLE001 - the worker runs as well without them
                result = f"{type(exc).__name__}: {exc}"
            if result != "OK":
                log.warning("rlwatch: could not set %s on %s (%s); a restarted worker may read "
                            "more of it", ", ".join(CHANGELOG_CONFIG), name, result)
    finally:
        admin.close()


#: the most a busy events lane waits at each of its turns (every ``LANE_TURN_SECONDS``) for
#: the notifications behind it (:meth:`streams.alerts_lane.AlertsLane.catch_up`): at most a
#: sixth of its time, while any are waiting
NOTIFY_TURN_SECONDS = 0.002
#: fast-path brakes remembered for the alerts lane (see ``fast_brake``)
FAST_BRAKES = 1024


def _retrieved(task: asyncio.Task) -> None:
    """Take a finished task's outcome, so that a failure it logged itself is not reported
    again by asyncio as never retrieved."""
    if not task.cancelled():
        task.exception()


def partition_of(run_id: str | bytes, partitions: int) -> int:
    """The partition of the events topic (and of the run table) that holds ``run_id``'s
    events: Kafka's default partitioner (murmur2 of the key, as the SDK's producer and the
    table's writes use)."""
    key = run_id.encode() if isinstance(run_id, str) else run_id
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def forget_foreign_states(table, owned) -> int:
    """Drop from the worker's in-memory table the states of runs ``owned(key)`` says this worker
    no longer owns, without writing to the changelog (the states there are the new owner's).
    Faust's in-memory store drops only the keys it read from the changelog: the keys this worker
    wrote itself stayed after a rebalance took their partition away, each run's state held for
    good (a fleet's worth, in time) and walked by the liveness timer. The number dropped."""
    store = table.data
    data = getattr(store, "data", None)            # faust.stores.memory.Store: a plain dict
    if not isinstance(data, dict):
        return 0
    gone = [k for k in data if not owned(k)]
    partitions = getattr(store, "_key_partition", {})
    for k in gone:
        data.pop(k, None)
        partitions.pop(k, None)
    return len(gone)


class RunStates:
    """Decoded run states in front of the Faust table (the table is the source of truth).

    Writing the whole state per event would cost more than processing it, so changed runs are
    written back before each offset commit, a run at once when the alerts its events raised
    are in Kafka, before a rebalance takes partitions away and when the worker shuts down.
    While a run's alerts are on their way (``held``), its state is not written: a state that
    says they were raised must never reach the changelog before them. The table uses the producer's key
    partitioner (the same murmur2 hashing as the events topic), which allows those writes
    from outside an agent.
    """

    def __init__(self, table, processor: Processor, limit: int = MAX_DECODED_RUNS):
        self.table, self.processor, self.limit = table, processor, limit
        self.cache: OrderedDict[str, RunState] = OrderedDict()
        self.dirty: set[str] = set()
        self.held: Counter[str] = Counter()   # runs whose alerts are on their way (how many sends)
        # states the liveness timer restored (not decoded) whose alerts are on their way: the
        # events lane takes the very copy that raised them, should the run speak meanwhile
        self.lent: dict[str, RunState] = {}

    def get(self, run_id: str) -> RunState:
        st = self.cache.get(run_id)
        if st is None:
            st = self.lent.pop(run_id, None)
            if st is None:
                raw = self.table.get(run_id.encode())
                st = self._restore(run_id, raw) if raw else None
                if st is None:
                    st = self.processor.new_state(run_id)
            self._keep(run_id, st)
        else:
            self.cache.move_to_end(run_id)
        return st

    def peek(self, run_id: str) -> tuple[RunState | None, bool]:
        """The run's state without making it a recently used one: (the decoded state, True),
        or (a state restored from the table and not kept, False), or (None, False) when the
        worker has neither. For passes over every run (the liveness timer): restoring runs
        that are not decoded must not push the runs that are out of the cache."""
        st = self.cache.get(run_id)
        if st is not None:
            return st, True
        raw = self.table.get(run_id.encode())
        if not raw:
            return None, False
        st = self._restore(run_id, raw)
        if st is None:     # unreadable (logged): the run starts afresh, decoded as get() does
            st = self.processor.new_state(run_id)     # it (so logged once, not on every pass)
            self._keep(run_id, st)
            return st, True
        return st, False

    def _keep(self, run_id: str, st: RunState) -> None:
        """``st`` decoded from now on, the least recently seen runs left in the table only."""
        self.cache[run_id] = st
        if len(self.cache) > self.limit:
            self._evict()

    def lend(self, run_id: str, st: RunState) -> None:
        """A state from :meth:`peek` that was not decoded is awaited on (its alerts are on their
        way): :meth:`get` takes this copy, not an older one from the table, until
        :meth:`put_back`."""
        self.lent[run_id] = st

    def put_back(self, run_id: str, st: RunState, changed: bool) -> None:
        """Done with a state from :meth:`peek` (and with its alerts: they are in Kafka): written
        to the table at once when it changed, as :meth:`flush_run`; one that was not decoded
        (nor taken by :meth:`get` meanwhile) is let go."""
        if self.lent.get(run_id) is st:
            del self.lent[run_id]
        if self.cache.get(run_id) is st:
            if changed:
                self.dirty.add(run_id)
                self.flush_run(run_id)
            return
        if changed:
            self._write(run_id, st)
        st.release()

    def _restore(self, run_id: str, raw) -> RunState | None:
        """The run's state from its stored value (MessagePack, or JSON from an older worker);
        None for a value that cannot be read or restored, which is logged (the run starts
        afresh: one bad value must not stop the worker)."""
        try:
            return self.processor.load_state(decode_state(raw))
        except StateDecodeError as exc:
            log.error("rlwatch: the stored state of run %s is unreadable (%d bytes, %s): "
                      "the run starts afresh", run_id, len(raw), exc)
        except Exception as exc:  # noqa: BLE001 - a state this version cannot restore
            log.error("rlwatch: the stored state of run %s could not be restored (%s: %s): "
                      "the run starts afresh", run_id, type(exc).__name__, exc)
        return None


    def touch(self, run_id: str) -> None:
        self.dirty.add(run_id)

    def flush(self) -> int:
        """Write every changed run's state to the table."""
        n = 0
        for run_id in list(self.dirty - self.held.keys()):
            st = self.cache.get(run_id)
            if st is not None and self._write(run_id, st):
                n += 1
        self.dirty &= self.held.keys()
        return n

    def hold(self, run_ids) -> None:
        """Keep these runs' states from the table until :meth:`release`: their alerts are on
        their way to Kafka (the events lane and the liveness timer may both hold a run)."""
        self.held.update(run_ids)

    def release(self, run_ids) -> None:
        self.held.subtract(run_ids)
        for run_id in run_ids:
            if self.held[run_id] <= 0:
                del self.held[run_id]

    def _evict(self) -> None:
        """Keep the least recently seen runs in the table only (written first if changed); a
        held run stays (its state may not be written yet), as does the run just kept."""
        while len(self.cache) > self.limit:
            older = islice(self.cache, len(self.cache) - 1)
            old = next((r for r in older if r not in self.held), None)
            if old is None:
                return
            st = self.cache[old]
            if old in self.dirty:
                self._write(old, st)
                self.dirty.discard(old)
            del self.cache[old]
            st.release()      # it and its rules: freed now, frozen heap or not (streams.heap)

    def flush_run(self, run_id: str) -> None:
        """Write one run's state to the table now (its alerts are in Kafka), unless it is held
        still (a later send of its alerts, or the liveness timer's, has yet to land)."""
        if run_id in self.held:     # alerts it raised since are still on their way: the
            return                  # release of the last of them writes it
        st = self.cache.get(run_id)
        if st is not None and run_id in self.dirty:
            self._write(run_id, st)
            self.dirty.discard(run_id)

    def _write(self, run_id: str, st: RunState) -> bool:
        value = encode_state(st.to_state(packed=True))
        if len(value) > MAX_STATE_BYTES:
            log.error("rlwatch: state of run %s is %d bytes, over %d: kept in memory "
                      "only (a restart loses it)", run_id, len(value), MAX_STATE_BYTES)
            return False
        self.table[run_id.encode()] = value
        return True

    def drop(self, run_id: str) -> None:
        """Forget a run for good (it expired): its statistics go with it."""
        st = self.cache.pop(run_id, None)
        if st is not None:
            st.release()
        self.dirty.discard(run_id)
        key = run_id.encode()
        if key in self.table:
            del self.table[key]

    def forget(self) -> None:
        """After a rebalance the table may hold newer states than the cache: drop the cache."""
        for st in self.cache.values():
            st.release()
        self.cache.clear()
        self.dirty.clear()
        self.lent.clear()


def build_app(settings: Settings, observer=None, pack=None) -> faust.App:
    credentials = broker_credentials(settings)   # SASL and/or SSL, or None
    app = BatchApp(
        settings.app_id,
        batch_lanes=os.environ.get("RLWATCH_BATCH_LANE", "1") != "0",
        broker=[f"kafka://{h}" for h in settings.kafka.split(",")],
        broker_credentials=credentials,
        store="memory://",
        web_enabled=False,
        topic_partitions=PARTITIONS,
        key_serializer="raw",
        value_serializer="raw",
        table_cleanup_interval=60.0,
        # the most a fetch takes of each partition (Kafka's max.partition.fetch.bytes, 1 MB by
        # default; aiokafka's fetch_max_bytes caps a fetch at 50 MB in all). A worker that is
        # behind gets batches of up to about 22,000 events of the bench fleet per partition with
        # 16 MB, and the events lane takes a batch a run at a time: the more steps of a run a
        # batch holds, the longer a run's state stays in the caches, and the fewer batch ends
        # the lane waits at for Kafka's acknowledgements. Through Kafka (3 rounds, the default
        # fleet), 16 MB against 4 MB: 1.115 times the throughput, faster in 3 of 3, for a peak
        # RSS of 400 MB instead of 282 MB (1 MB to 4 MB gave 1.06 before). A worker that keeps
        # up fetches what came in the last fetch wait; a host short of memory sets less
        consumer_max_fetch_size=int(settings.fetch_mb * (1 << 20)),
        # the liveness timer walks the table's local keys: without standby replicas those are
        # only the runs this worker owns
        table_standby_replicas=0,
        # quick restarts: a stable instance id per worker (static membership) and a short session
        # a brake waiting for Redis must not hold up a rebalance or a shutdown: its alert is not
        # acknowledged, so whoever owns the partition next pulls it
        stream_wait_empty=False,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=max(0.5, min(3.0, settings.session_timeout / 4)),
        consumer_group_instance_id=worker_instance_id(settings),
    )
    gate = BrokerLogGate().install()
    processor = Processor(pack if pack is not None else load_pack(settings.rules))
    events = app.topic(settings.events_topic, key_type=bytes, value_type=bytes)
    alerts_topic = app.topic(settings.alerts_topic, key_type=bytes, value_type=bytes)
    dlq = app.topic(settings.dlq_topic, key_type=bytes, value_type=bytes)
    table = app.Table(RUN_TABLE, default=None, partitions=PARTITIONS, key_type=bytes,
                      value_type=bytes, use_partitioner=True, extra_topic_configs=CHANGELOG_CONFIG)
    states = RunStates(table, processor)
    marks = ReadMarks()         # how far each partition is read: the liveness timer's clock
    heap = Heap()
    # recent steps and samples per run, for incident snapshots: as many runs as the decoded
    # states (the recorder's default of 1,000 runs, under a fleet of 1,250, dropped each run's
    # history before its next step came: every snapshot was empty, and making the history
    # afresh took 6 % of the worker's time). The price is memory: about 1.5 MB per run of 30
    # metrics and 8 ranks (768 steps kept), measured
    recorder = SnapshotRecorder(max_runs=MAX_DECODED_RUNS)
    counters = {"events": 0, "dlq": 0, "alerts": 0}
    # the fleet view every dashboard and `rlwatch status` read (streams/fleet_store.py)
    fleet = FleetWriter(FleetStore.from_url(settings.redis, settings.app_id, settings.run_ttl_hours * 3600),
                        summary_of, local=observer, log=log)
    dispatcher_box: list = []
    brake_box: list = []

    def dispatcher():
        if not dispatcher_box:
            dispatcher_box.append(build_dispatcher(settings))
        return dispatcher_box[0]

    def brakes():
        """The brake's own thread (its own loop and Redis client), started on first use."""
        if not brake_box:
            brake_box.append(build_brake_thread(settings, dispatcher(), asyncio.get_running_loop()))
        return brake_box[0]

    crash_at = os.environ.get("RLWATCH_CRASH_AT")     # the crash drills' (tests only)

    async def publish(alerts: list[Alert]) -> list:
        """Send ``alerts`` to the alerts topic; the futures of their acknowledgements by Kafka.
        A send refused at once (the producer stopped, a record over the broker's limit) is
        logged with its run and raised: the caller, the events lane or the liveness timer,
        has held the run's state back, and the worker stops."""
        landed = []
        for a in alerts:
            counters["alerts"] += 1
            if observer is not None:
                observer.observe_alert(a)
            try:
                landed.append(await alerts_topic.send(
                    key=a.run_id.encode(),
                    value=attach_snapshot(a, recorder, states.cache.get(a.run_id)).to_json().encode()))
            except Exception as exc:
                log.error("rlwatch: the %s alert %s of run %s could not be sent to %s (%s): its "
                          "state is not written, and the worker stops, so that whoever owns the "
                          "run next raises it again", a.state, a.rule, a.run_id,
                          settings.alerts_topic, exc)
                raise
            if crash_at == "alerted" and a.state == "firing":
                await app.producer.flush()      # the drill: the alert is in Kafka, nothing acted
                _crash_point("alerted")
            if a.state == "firing":
                # the fast path: the brake at once, not behind whatever the alerts topic's
                # consumer has yet to read; the brake lane acknowledges the alert's copy on the
                # topic once it has landed (a worker that dies first leaves it to its successor)
                fast_brake(a)
        return landed

    # (the run id, its state, its recorder's keeper) of the run whose routine rank steps take()
    # is taking one after another: the events lane takes a batch a run at a time, so most
    # events come in such streaks (a run's other events, its rank 0's steps, go on through the
    # usual path without ending its streak), and each step after the first is only kept by the
    # recorder: the lane hands the records that come next to take_run, which takes the run's
    # routine rank steps among them at once (RunState.rank_steps). Valid only while nothing
    # else runs: a streak ends with another run, a failure, and at every await (end_streak),
    # as a flush, an eviction or a revocation may happen then. Without streaks when a local
    # observer is given every event (the dashboard of ``rlwatch demo``, tests)
    streak: list = [None, None, None]
    streaks = observer is None

    def end_streak() -> None:
        streak[:] = None, None, None

    def take(key, raw, now: float):
        """One event through the core: None, or what must be awaited (a dead letter or the
        alerts it raised). No awaits in here: the batch lane runs this per event. A routine
        step of a rank other than 0 (most of a fleet's events) is read natively and taken by
        RunState.rank_step; any other event is read by read_event and applied."""
        stray = False
        event = read_routine(raw)
        if event is not None:
            run_id = event.run_id
            keep = streak[2] if run_id == streak[0] else None
            st = streak[1] if keep is not None else states.get(run_id)
            try:
                alerts = st.rank_step(event, now)
            except Exception as exc:  # noqa: BLE001 - one bad event must not stop the worker
                end_streak()
                return failed(exc, key, run_id, raw, now)
            if alerts is None:
                event = None      # not routine: read and applied as any other event
            elif keep is not None:
                # the run's routine steps in a row: its state is the recently used one, marked
                # changed, and noted for the fleet view already; only the step is kept
                keep(event.step, event.rank, raw)
                counters["events"] += 1
                return (_ALERTS, run_id, alerts) if alerts else None
            else:
                recorder.observe(event, raw)
                if streaks:
                    streak[:] = run_id, st, recorder.rank_keeper(run_id)
        if event is None:
            try:
                event = read_event(raw, now)
            except EventError as exc:
                counters["dlq"] += 1
                log.warning("rlwatch: rejected an event (%s); sent to %s", exc.reason, settings.dlq_topic)
                body = raw if isinstance(raw, bytes) else str(raw).encode()
                return _DEAD, key, json.dumps(
                    {"reason": exc.reason, "ts": now, "key": key.decode("utf-8", "replace") if key else None,
                     "raw": body.decode("utf-8", "replace")[:100_000]}).encode()
            st = states.get(event.run_id)
            # an event of a program the run was relaunched from is dropped (RunState.apply): its
            # values go into no snapshot and no sparkline
            stray = bool(st.retired) and st.is_stray(event.incarnation, sane_ts(event.ts, now))
            if not stray:
                recorder.observe(event, raw)
            if st is not streak[1]:
                end_streak()        # (the streak's run goes on after its other events)
            try:
                alerts = processor.process(st, event, now)
            except Exception as exc:  # noqa: BLE001 - one bad event must not stop the worker
                end_streak()
                return failed(exc, key, event.run_id, raw, now)
        counters["events"] += 1
        states.touch(event.run_id)
        fleet.note(st, None if stray else event)
        if alerts:
            return _ALERTS, event.run_id, alerts
        return None

    def take_run(records: list, order, k: int, now: float, taken: bytearray):
        """The routine rank steps of the streak's run at ``order[k:]``, taken one after
        another by RunState.rank_steps (and marked in ``taken``): the position after them, and
        None or what must be awaited (the alerts of the rules the last one left due, or the
        dead letter of the step whose rules failed)."""
        run_id, st, keep = streak
        try:
            at, count, complete, due = st.rank_steps(records, order, k, now, keep, taken)
        except Exception:  # noqa: BLE001 - a fault here must not stop the worker
            # (those it took before the fault are marked taken; the others go through take(),
            # which words any fault per event)
            log.exception("rlwatch: taking the routine steps of run %s at once failed; they "
                          "are taken one by one", run_id)
            end_streak()
            while k < len(order) and taken[order[k]]:
                k += 1
                counters["events"] += 1
            return k, None
        if not complete and due is None:
            counters["events"] += count
            return at, None
        counters["events"] += count - 1     # (the last is counted below, or by failed())
        try:
            alerts = st.after_rank_steps(complete, due)
        except Exception as exc:  # noqa: BLE001 - one bad event must not stop the worker
            end_streak()
            record = records[order[at - 1]]
            return at, failed(exc, record.key, run_id, record.value, now)
        counters["events"] += 1
        return at, ((_ALERTS, run_id, alerts) if alerts else None)

    def failed(exc: Exception, key, run_id: str, raw, now: float):
        """The dead letter of an event the core failed on."""
        counters["events"] += 1
        counters["dlq"] += 1
        log.exception("rlwatch: processing an event of run %s failed; sent to %s",
                      run_id, settings.dlq_topic)
        return _DEAD, key, json.dumps(
            {"reason": f"processing failed: {type(exc).__name__}: {exc}", "ts": now,
             "key": run_id, "raw": raw.decode("utf-8", "replace")[:100_000]
             if isinstance(raw, bytes) else str(raw)[:100_000]}).encode()

    async def send_out(outs: list) -> tuple[set, list]:
        """Send what events left to send (dead letters, alerts), in order: the runs that raised
        the alerts, held back from the table from now on, and the futures of Kafka's
        acknowledgements of those alerts (for :func:`landed`)."""
        runs = {key for kind, key, _ in outs if kind is _ALERTS}
        states.hold(runs)
        if runs and crash_at == "publishing":
            await app.producer.flush()      # the drill: what was written so far is in Kafka
            _crash_point("publishing")
        acks = []
        for kind, key, body in outs:
            if kind is _DEAD:
                await dlq.send(key=key, value=body)
            else:
                acks += await publish(body)
        return runs, acks

    async def after(outs: list) -> None:
        """Send what events left to send, and once Kafka holds the alerts, write the state of
        each run that raised them to the table, once (the other runs wait for the next commit).
        In that order a crash loses no alert: a successor that finds the state from before them
        reads their events again and raises the same alerts, which delivery and the brake take
        once (by delivery key and command id); one that finds the state after them knows they
        are on the alerts topic."""
        await landed(*await send_out(outs))

    async def landed(runs: set, acks: list) -> None:
        """Wait until Kafka acknowledged the alerts of ``runs`` (``acks``), then write their
        states. Until then those states are held back from the table (a commit meanwhile writes
        the others); if Kafka refuses an alert they stay held, so the state that raised it is
        never written without it."""
        if acks:
            try:
                await asyncio.gather(*acks)
            except Exception as exc:
                log.error("rlwatch: Kafka did not take the alerts of runs %s (%s): their states "
                          "are not written, so whoever reads their events next raises them again",
                          sorted(runs), exc)
                raise
        states.release(runs)
        for run_id in runs:
            states.flush_run(run_id)

    @app.batch_lane(events)
    async def process_batch(batch) -> None:
        """The events of one fetched batch (a :class:`streams.batch_lane.LaneBatch` of records),
        a run's events together (:meth:`~streams.batch_lane.LaneBatch.by_key`: each run's in
        order; a run's state then stays in the processor's caches for several steps). The
        batch's first records that are all processed are acknowledged before every await
        (Faust commits, and a rebalance starts, only while this waits), so a commit covers
        only events processed. A rebalance stops it: what was not acknowledged is read again
        by whoever owns the partition next, and the events of it that were processed, when a
        state written meanwhile holds them, are taken as the duplicates they are.

        What the events of a turn leave to send (alerts, dead letters) goes out at the turn's
        end (at most ``LANE_TURN_SECONDS`` later), so that a run whose ranks raise alerts at
        one step (a NaN on every rank) has its state written once for them all. The lane
        reads on while Kafka has yet to acknowledge the alerts; until it has, the
        acknowledgement stops before the first of those events, and the runs that raised them
        are not written (the batch ends once every send landed)."""
        active = batch.checker()
        clock = time.time
        turns = Turns()     # the loop's other work (timers, the alerts lanes) gets a turn
        n = len(batch)
        taken = bytearray(n)  # taken[i]: batch[i] processed
        done = 0            # batch[:done] processed
        sent = 0            # batch[:sent] processed, and what they left to send sent and landed
        outs: list = []     # what the events since the last send left to send
        # sends whose alerts Kafka has yet to acknowledge, in order: (n, the task that waits for
        # the acknowledgements and then writes the runs' states); batch[:n] is acknowledged
        # once it is done. The lane reads on meanwhile: waiting there, it stood idle for a
        # round trip to the broker (7 ms at the median on a busy worker) per turn that alerted
        pending: deque = deque()

        async def send() -> None:
            batch.ack(sent)
            runs, acks = await send_out(outs)
            outs.clear()
            pending.append((done, asyncio.ensure_future(landed(runs, acks))))

        def settle() -> None:
            """Move ``sent`` past the sends that landed (the first refused raises here)."""
            nonlocal sent
            while pending and pending[0][1].done():
                upto, task = pending.popleft()
                task.result()
                sent = upto
            if not pending and not outs:
                sent = done

        try:
            order = batch.by_key()
            k = 0               # order[:k] processed
            while k < n:
                if not active():
                    break
                i = order[k]
                k += 1
                record = batch[i]
                now = clock()
                out = take(record.key, record.value, now)
                if out is not None:
                    outs.append(out)
                taken[i] = 1
                if streak[0] is not None and k < n:
                    # the run's routine rank steps that come next, taken at once (they are
                    # marked in taken)
                    k, out = take_run(batch, order, k, now, taken)
                    if out is not None:
                        outs.append(out)
                if done < n and taken[done]:
                    done = taken.find(0, done)
                    if done < 0:
                        done = n
                if not outs and not pending:
                    sent = done
                if turns.due():
                    end_streak()
                    if outs:
                        await send()
                    settle()
                    batch.ack(sent)
                    await asyncio.sleep(0)
                    if alerts_lane.behind:      # (defined below; the lane runs once started)
                        await alerts_lane.catch_up(NOTIFY_TURN_SECONDS, time.monotonic)
                    turns.taken()
            end_streak()
            if outs:
                await send()
            while pending:
                await asyncio.wait([pending[0][1]])
                settle()
        finally:
            end_streak()
            batch.ack(sent)
            marks.read_records(batch, done, batch.partitions)
            for _, task in pending:     # left by a raise: landed() logs its own failure
                task.add_done_callback(_retrieved)

    @app.agent(events)
    async def process_events(stream):
        """Subscribes the events topic (co-partitioned with the table); with the batch lane on,
        its messages go to ``process_batch`` instead, and this agent gets none."""
        async for event in stream.events():
            end_streak()        # (other tasks ran while this waited for the message)
            out = take(event.key, event.value, time.time())
            msg = event.message
            marks.read(msg.partition, msg.offset, msg.timestamp)
            if out is not None:
                await after([out])

    def read_alert(raw) -> Alert | None:
        """The alert of a message on the alerts topic, or None (logged). Its snapshot, if it
        has one, is not read: the incident stores it as the JSON text it came in."""
        try:
            return Alert.from_json_keeping_snapshot(raw)
        except Exception as exc:  # noqa: BLE001 - a foreign message on the topic
            log.error("rlwatch: unreadable alert on %s: %s", settings.alerts_topic, exc)
            return None

    # the brakes this worker pulled on the fast path, by alert (delivery key): done once the
    # control channel took every command of the alert; the alerts lane acknowledges the alert's
    # copy on the topic then, without a trip to the brake thread (a thread woken for nothing
    # takes the GIL from the events lane)
    fast_brakes: OrderedDict[str, asyncio.Future] = OrderedDict()

    def fast_brake(alert: Alert) -> None:
        loop = asyncio.get_running_loop()
        landed = loop.create_future()

        def done() -> None:     # on the brake thread
            loop.call_soon_threadsafe(lambda: landed.done() or landed.set_result(None))

        brakes().submit(alert, done)
        fast_brakes[delivery_key(alert)] = landed      # once submitted: the lane may wait for it
        while len(fast_brakes) > FAST_BRAKES:
            old, fut = next(iter(fast_brakes.items()))
            if not fut.done():
                break     # still on its way: kept (the lane waits for it)
            del fast_brakes[old]

    def brake(alert: Alert, done) -> None:
        """A firing alert's brake from the alerts topic: ``done()`` (on this loop) once the
        control channel took its commands. Commands first, on their own thread, each run's in
        order and runs side by side."""
        _crash_point("brake")

        def braked() -> None:
            _crash_point("braked")
            done()

        landed = fast_brakes.get(delivery_key(alert))
        if landed is not None:      # pulled by this worker's fast path: done once it landed
            landed.add_done_callback(lambda _: braked())
            return
        loop = asyncio.get_running_loop()
        brakes().submit(alert, lambda: loop.call_soon_threadsafe(braked))   # on the brake thread

    async def notify(alerts: list[Alert]) -> None:
        """Incidents and outbox; the sends run in the background, one lane per receiver."""
        await dispatcher().notify_all(alerts)
        _crash_point("notified")

    alerts_lane = AlertsLane(read_alert, brake, notify, lambda: app.consumer_generation_id)

    @app.batch_lane(alerts_topic)
    async def take_alerts(batch) -> None:
        """The alerts of one fetched batch, each acknowledged once its brake and notification
        are done (:class:`streams.alerts_lane.AlertsLane`)."""
        active = batch.checker()
        for i, record in enumerate(batch):
            if not active():
                break
            await alerts_lane.take(record.value, partial(batch.ack_at, i), batch.generation_id)

    @app.agent(alerts_topic)
    async def alerts_agent(stream):
        """Subscribes the alerts topic; with the batch lanes on, its messages go to
        ``take_alerts`` instead, and this agent gets none."""
        async for event in stream.noack().events():
            await alerts_lane.take(event.value, event.ack, app.consumer_generation_id)

    @app.task
    async def notifications():
        await alerts_lane.notifications()

    @app.task
    async def gate_broker_logs():
        """The worker has set its logging up by now: put the gate on its handlers."""
        gate.install()

    @app.timer(interval=settings.delivery_tick_seconds)
    async def deliver_due():
        """The outbox's retries and held groups, repeats, unacknowledged brakes."""
        await dispatcher().tick(wait=False)
        gate.check()

    # changed run states go to the table right before each offset commit: Faust flushes the
    # producer (the table's changelog among it) before it commits, so the state that the
    # committed events made is in the changelog first
    app.before_commit.append(states.flush)

    @app.timer(interval=FLUSH_SECONDS)
    async def flush_fleet():
        if fleet.ready():     # every second, or less often when flushes grow long
            await fleet.flush()

    async def liveness_alerts(st: RunState, alerts: list[Alert]) -> None:
        fleet.note(st)
        states.hold((st.run_id,))
        await landed({st.run_id}, await publish(alerts))     # a refused send is logged there

    def expired(run_id: str) -> None:
        fleet.forget(run_id)

    def owner_of(assignment):
        """Whether a run (its id, or its table key) is on a partition of ``assignment``."""
        mine = {tp.partition for tp in assignment if tp.topic == settings.events_topic}
        partitions = app.consumer.topic_partitions(settings.events_topic) or PARTITIONS
        return lambda run_id: partition_of(run_id, partitions) in mine

    @app.timer(interval=settings.tick_seconds)
    async def liveness():
        """Liveness rules for every run this worker owns, a slice of runs at a time; runs silent
        past the TTL expire. A rebalance stops the pass (the next one starts over)."""
        generation = app.consumer_generation_id
        assignment = app.consumer.assignment()
        owns = owner_of(assignment)
        # the table's in-memory store keeps the states this worker wrote for partitions a
        # rebalance took away since (Faust drops only those it read from the changelog): their
        # runs go on elsewhere, and their copies here would look silent (false run_stalled)
        owned = [run_id for run_id in dict.fromkeys(
                     [*states.cache, *(k.decode() for k in list(table.keys()))])
                 if owns(run_id)]
        now = time.time()
        read_to = read_times(assignment, now)
        partitions = app.consumer.topic_partitions(settings.events_topic) or PARTITIONS
        done = await liveness_pass(
            states, processor, owned, now, ttl_seconds=settings.run_ttl_hours * 3600,
            active=lambda: app.lane_active(generation), alerted=liveness_alerts,
            expired=expired, as_of=lambda run_id: read_to.get(partition_of(run_id, partitions)))
        behind = sorted(p for p, t in read_to.items()
                        if t is None or now - t > settings.tick_seconds)
        if behind != behind_logged[0]:      # logged when it changes, not every tick
            behind_logged[0] = behind
            if behind:
                log.info("rlwatch: behind on partitions %s of %s: their runs' silence is judged "
                         "as of what is read there (%d runs not judged yet)", behind,
                         settings.events_topic, done.waiting)
            else:
                log.info("rlwatch: caught up on every partition of %s", settings.events_topic)

    behind_logged: list = [None]

    def read_times(assignment, now: float) -> dict:
        """Each assigned partition of the events topic: the time it is read up to
        (streams.read_marks), or None."""
        consumer = app.consumer
        committed = consumer._committed_offset      # Faust's: set at assignment and each commit
        out = {}
        for tp in assignment:
            if tp.topic == settings.events_topic:
                try:
                    highwater = consumer.highwater(tp)
                except Exception:  # noqa: BLE001 - a partition the rebalance took meanwhile
                    highwater = None
                out[tp.partition] = marks.as_of(tp.partition, highwater, committed.get(tp), now)
        return out

    @app.timer(interval=HEAP_SECONDS)
    async def collect_heap():
        """The frozen heap thawed and collected when due (streams.heap; the worker stands
        still meanwhile, so it is logged)."""
        thaw = heap.tick(time.time())
        if thaw is not None:
            log.info("rlwatch: collected the frozen heap in %.0f ms: %d objects freed, %d "
                     "frozen again; the next in %.0f minutes", thaw.seconds * 1e3, thaw.collected,
                     thaw.frozen, thaw.next_in / 60)

    @app.timer(interval=60.0)
    async def report():
        waiting = alerts_lane.waiting
        log.info("rlwatch: %d events, %d dead-lettered, %d alerts%s", counters["events"],
                 counters["dlq"], counters["alerts"],
                 f"; {waiting} read back and waiting for their notification" if waiting else "")

    @app.on_partitions_revoked.connect
    async def on_revoked(app_, revoked, **kwargs):
        states.flush()
        states.forget()
        marks.forget()

    @app.on_partitions_assigned.connect
    async def on_assigned(app_, assigned, **kwargs):
        gone = forget_foreign_states(table, owner_of(assigned))
        if gone:
            log.info("rlwatch: let go of %d run states of partitions now at another worker", gone)

    @app.on_before_shutdown.connect
    async def on_shutdown(app_, **kwargs):
        states.flush()
        await fleet.flush()
        if brake_box:        # brakes still waiting for Redis: their alerts stay unacknowledged
            brake_box[0].stop()
        if dispatcher_box:   # sends in flight get a moment; the rest wait in the outbox for the
            d = dispatcher_box[0]   # next worker
            await d.idle(timeout=2.0)
            await d.drainer.close()

    app.rlwatch_counters = counters
    app.rlwatch_states = states
    app.rlwatch_recorder = recorder
    app.rlwatch_heap = heap         # installed by `rlwatch worker` (cli), not by tests' apps
    app.rlwatch_fleet = fleet
    app.rlwatch_alerts_lane = alerts_lane
    app.rlwatch_liveness_alerts = liveness_alerts     # what the liveness pass calls (tests)
    return app

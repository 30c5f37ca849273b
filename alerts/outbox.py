"""The durable outbox: every notification is written down before it is sent, and stays until a
receiver took it.

One item per (receiver, alert key): enqueuing the same one twice is a no-op, and once sent its
marker stays for two weeks, so a restarted or second worker, or a redelivered alert, never sends
it again. A failed send is retried with exponential backoff (the item keeps its attempts and
next-try time); nothing is dropped while Slack or a webhook is down, and an item that keeps
failing for a day (or that the receiver refuses outright) moves to a dead-letter list, loudly.

Items wait in a sorted set per receiver scored by their next-try time; a drain takes the due
ones under a short lease (atomically, so two workers never send the same item at once). Items
held for a group's ``group_wait``/``group_interval`` are simply not due yet; when the wait is
counted in steps, they are released by the first alert of their run at or after that step.

The outbox also keeps what the dispatcher shares between workers: the groups' clocks, the
firing alerts (for inhibition and repeats) and the latest step seen per run.

Redis keys (prefix ``rlwatch:<app id>:outbox:``, so deployments sharing a Redis never send each
other's notifications): ``items`` (hash id -> item), ``due:<receiver>`` (zset),
``steps:<run>`` (zset id -> step), ``mark:<id>`` (outcome), ``dead:<receiver>`` (list),
``groups`` (hash), ``active`` (hash fingerprint -> alert), ``active:<run>`` (the same, one
run's), ``runstep`` (hash run -> step), ``receivers`` (hash receiver -> when a worker last said
it sends to it: an operator's notice is kept for a retry only for such a receiver,
:mod:`alerts.announce`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from alerts.control import pipelined
from alerts.grouping import GroupClock
from contract.alert import Alert

__all__ = ["MemoryOutbox", "Outbox", "OutboxItem", "RedisOutbox", "item_id"]
MARK_TTL = 14 * 24 * 3600
ACTIVE_MAX_AGE = 24 * 3600.0
MAX_PARSED = 20_000     # active alerts kept parsed by a RedisOutbox between reads
GROUP_MAX_AGE = 7 * 24 * 3600.0


def item_id(receiver: str, key: str, variant: str = "") -> str:
    """The idempotency key of one notification: (receiver, alert key[, repeat])."""
    return hashlib.sha256(f"{receiver}|{variant}|{key}".encode()).hexdigest()[:32]


@dataclass
class OutboxItem:
    id: str
    receiver: str
    group: str
    key: str
    run_id: str
    alert: str                      # the alert's JSON line
    done: list[str] = field(default_factory=list)
    enqueued: float = 0.0
    next_try: float = 0.0
    due_step: int | None = None
    attempts: int = 0
    last_error: str = ""
    variant: str = ""

    def to_json(self) -> str:
        # its fields in order, as asdict gives them, without asdict's deep copy (a third of the time)
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> OutboxItem:
        return cls(**json.loads(raw))

    def alert_obj(self) -> Alert:
        return Alert.from_json(self.alert)

    @property
    def step(self) -> int:
        return int(json.loads(self.alert).get("step", 0))


class Outbox(Protocol):
    async def enqueue(self, item: OutboxItem) -> bool: ...
    async def take_due(self, receiver: str, now: float, limit: int = 100, lease: float = 30.0) -> list[OutboxItem]: ...
    async def finish(self, item: OutboxItem, outcome: str) -> None: ...
    async def retry(self, item: OutboxItem, next_try: float, error: str, count: bool = True) -> None: ...
    async def bury(self, item: OutboxItem, error: str) -> None: ...
    async def outcome(self, receiver: str, key: str, variant: str = "") -> str | None: ...
    async def outcomes(self, receiver: str, keys: list[str]) -> dict[str, str | None]:
        """:meth:`outcome` of each of ``keys`` (no variant), in one round trip."""
    async def release_steps(self, run_id: str, step: int, now: float) -> int: ...
    async def pending(self, receiver: str | None = None) -> int: ...
    async def dead(self, receiver: str) -> list[OutboxItem]: ...
    async def clock(self, group: str) -> GroupClock | None: ...
    async def set_clock(self, group: str, clock: GroupClock) -> None: ...
    async def clocks(self) -> dict[str, GroupClock]: ...
    async def drop_clock(self, group: str) -> None: ...
    async def turn(self, name: str, now: float, every: float) -> bool:
        """Whether the caller takes the deployment's turn at ``name`` (the timer's reads of the
        whole fleet's state) at ``now``: one caller in ``every`` seconds does (by the callers'
        clocks, :func:`takes_turn`)."""
    async def track(self, alert: Alert, now: float) -> None:
        """A firing alert joins the active alerts (a resolved one leaves them), and its step
        becomes its run's newest step if it is newer."""
    async def active(self, now: float, runs: Iterable[str] | None = None) -> list[Alert]:
        """The firing alerts (of these ``runs`` only, when given); those older than
        ``ACTIVE_MAX_AGE`` are dropped."""
    async def run_step(self, run_id: str) -> int | None: ...
    async def run_steps(self, run_ids: list[str]) -> dict[str, int | None]:
        """:meth:`run_step` of each of ``run_ids``, in one round trip."""
    async def note_receivers(self, receivers: list[str], now: float) -> None:
        """A worker says it sends to ``receivers`` (drains their items), as of ``now``."""
    async def receivers_seen(self) -> dict[str, float]:
        """Each receiver some worker said it sends to, and when it last said so."""
    async def forget_receivers(self, receivers: list[str]) -> None:
        """``receivers`` leave :meth:`receivers_seen` (until a worker notes them again)."""
    async def queued_receivers(self) -> list[str]:
        """The receivers that have items waiting (due or not)."""
    async def admit_all(self, alerts: list[tuple[Alert, list[str]]], now: float) -> list[dict[str, GroupClock | None]]:
        """:meth:`track` each alert, then read the clocks of its groups, as they were before
        this call (one round trip for all)."""
    async def sent(self, items: list[OutboxItem], now: float) -> None:
        """:meth:`finish` ``items`` as sent and note the flush on their groups' clocks (last
        flush ``now``, at the newest step of the group's items): one round trip, atomic (a
        clock changed meanwhile by another writer keeps its change)."""
    async def enqueue_all(self, items: list[OutboxItem], clocks: dict[str, GroupClock],
                          steps: dict[str, int], now: float) -> tuple[list[bool], int]:
        """Set ``clocks``, :meth:`enqueue` each item, then :meth:`release_steps` of each run of
        ``steps`` (run id -> the step it reached): (whether each item was new, how many held
        items were released). One round trip, in one transaction: a receiver's pass running
        meanwhile takes an alert's items with the held items they release, or neither."""


def flush_steps(items: list[OutboxItem]) -> dict[str, int]:
    """The newest step of each group among ``items`` (sent together)."""
    out: dict[str, int] = {}
    for it in items:
        step = it.step
        if it.group not in out or step > out[it.group]:
            out[it.group] = step
    return out


def takes_turn(last: float | None, now: float, every: float) -> bool:
    """Whether a caller at ``now`` takes a turn last taken at ``last`` (None: never), one turn
    in ``every`` seconds. A caller whose clock is behind the last taker's takes it too: callers
    whose clocks disagree may both do the work of a turn, never neither.

    >>> takes_turn(None, 10.0, 1.8), takes_turn(10.0, 11.0, 1.8), takes_turn(10.0, 11.8, 1.8)
    (True, False, True)
    >>> takes_turn(10.0, 9.0, 1.8), takes_turn(10.0, 10.5, 0.0)
    (True, True)
    """
    return last is None or not last <= now < last + every


class MemoryOutbox:
    """The outbox in process (embedded demo, replay, unit tests): same semantics, no Redis."""

    def __init__(self):
        self.items: dict[str, OutboxItem] = {}
        self.due: dict[str, dict[str, float]] = {}
        self.steps: dict[str, dict[str, int]] = {}
        self.marks: dict[str, str] = {}
        self.dead_items: dict[str, list[OutboxItem]] = {}
        self.groups: dict[str, GroupClock] = {}
        self.firing: dict[str, tuple[float, Alert]] = {}
        self.run_steps_seen: dict[str, int] = {}   # run -> its newest step
        self.turns: dict[str, float] = {}          # name -> when last taken
        self.drained: dict[str, float] = {}        # receiver -> when a worker last said it sends to it

    async def enqueue(self, item: OutboxItem) -> bool:
        if item.id in self.marks:
            return False
        self.marks[item.id] = "queued"
        self.items[item.id] = item
        self.due.setdefault(item.receiver, {})[item.id] = item.next_try
        if item.due_step is not None:
            self.steps.setdefault(item.run_id, {})[item.id] = item.due_step
        return True

    async def take_due(self, receiver: str, now: float, limit: int = 100, lease: float = 30.0) -> list[OutboxItem]:
        q = self.due.get(receiver, {})
        ids = sorted((i for i, t in q.items() if t <= now), key=lambda i: (q[i], i))[:limit]
        out = []
        for i in ids:
            q[i] = now + lease
            it = self.items.get(i)
            if it is None:
                q.pop(i, None)
                continue
            self.steps.get(it.run_id, {}).pop(i, None)
            out.append(it)
        return out

    def _drop(self, item: OutboxItem) -> None:
        self.items.pop(item.id, None)
        self.due.get(item.receiver, {}).pop(item.id, None)
        self.steps.get(item.run_id, {}).pop(item.id, None)

    async def finish(self, item: OutboxItem, outcome: str) -> None:
        self._drop(item)
        self.marks[item.id] = outcome

    async def sent(self, items: list[OutboxItem], now: float) -> None:
        for it in items:
            await self.finish(it, "sent")
        for group, step in flush_steps(items).items():
            clock = self.groups.get(group)
            if clock is not None:
                clock.last_flush_ts, clock.last_flush_step = now, step

    async def retry(self, item: OutboxItem, next_try: float, error: str, count: bool = True) -> None:
        if count:
            item.attempts += 1
        item.next_try, item.last_error = next_try, error
        self.items[item.id] = item
        self.due.setdefault(item.receiver, {})[item.id] = next_try

    async def bury(self, item: OutboxItem, error: str) -> None:
        item.last_error = error
        self._drop(item)
        self.marks[item.id] = "dead"
        self.dead_items.setdefault(item.receiver, []).insert(0, item)

    async def outcome(self, receiver: str, key: str, variant: str = "") -> str | None:
        return self.marks.get(item_id(receiver, key, variant))

    async def outcomes(self, receiver: str, keys: list[str]) -> dict[str, str | None]:
        return {k: self.marks.get(item_id(receiver, k)) for k in keys}

    async def release_steps(self, run_id: str, step: int, now: float) -> int:
        waiting = self.steps.get(run_id, {})
        ready = [i for i, s in waiting.items() if s <= step]
        for i in ready:
            waiting.pop(i)
            it = self.items.get(i)
            if it is not None:
                q = self.due.setdefault(it.receiver, {})
                if i in q:
                    q[i] = min(q[i], now)
        return len(ready)

    async def pending(self, receiver: str | None = None) -> int:
        return sum(len(q) for r, q in self.due.items() if receiver in (None, r))

    async def dead(self, receiver: str) -> list[OutboxItem]:
        return list(self.dead_items.get(receiver, []))

    async def clock(self, group: str) -> GroupClock | None:
        return self.groups.get(group)

    async def set_clock(self, group: str, clock: GroupClock) -> None:
        self.groups[group] = clock

    async def clocks(self) -> dict[str, GroupClock]:
        return dict(self.groups)

    async def drop_clock(self, group: str) -> None:
        self.groups.pop(group, None)

    async def turn(self, name: str, now: float, every: float) -> bool:
        if not takes_turn(self.turns.get(name), now, every):
            return False
        self.turns[name] = now
        return True

    async def track(self, alert: Alert, now: float) -> None:
        if alert.state == "firing":
            self.firing[alert.fingerprint] = (now, alert)
        else:
            self.firing.pop(alert.fingerprint, None)
        self.run_steps_seen[alert.run_id] = max(alert.step, self.run_steps_seen.get(alert.run_id, alert.step))

    async def admit_all(self, alerts: list[tuple[Alert, list[str]]], now: float) -> list[dict[str, GroupClock | None]]:
        clocks = [{g: self.groups.get(g) for g in groups} for _, groups in alerts]
        for alert, _ in alerts:
            await self.track(alert, now)
        return clocks

    async def enqueue_all(self, items: list[OutboxItem], clocks: dict[str, GroupClock],
                          steps: dict[str, int], now: float) -> tuple[list[bool], int]:
        self.groups.update(clocks)
        new = [await self.enqueue(it) for it in items]
        released = 0
        for run_id, step in steps.items():
            released += await self.release_steps(run_id, step, now)
        return new, released

    async def active(self, now: float, runs: Iterable[str] | None = None) -> list[Alert]:
        for fp, (at, _) in list(self.firing.items()):
            if now - at > ACTIVE_MAX_AGE:
                self.firing.pop(fp)
        wanted = None if runs is None else set(runs)
        return [a for _, a in self.firing.values() if wanted is None or a.run_id in wanted]

    async def run_step(self, run_id: str) -> int | None:
        return self.run_steps_seen.get(run_id)

    async def run_steps(self, run_ids: list[str]) -> dict[str, int | None]:
        return {r: self.run_steps_seen.get(r) for r in run_ids}

    async def note_receivers(self, receivers: list[str], now: float) -> None:
        self.drained.update(dict.fromkeys(receivers, now))

    async def receivers_seen(self) -> dict[str, float]:
        return dict(self.drained)

    async def forget_receivers(self, receivers: list[str]) -> None:
        for name in receivers:
            self.drained.pop(name, None)

    async def queued_receivers(self) -> list[str]:
        return sorted(r for r, q in self.due.items() if q)


_ENQUEUE = """
if redis.call('SET', KEYS[1], 'queued', 'NX', 'EX', ARGV[4]) then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  if ARGV[5] ~= '' then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1]) end
  return 1
end
return 0
"""

#: RedisOutbox.track: KEYS the active alerts, the runs' newest steps, the run's own active
#: alerts; ARGV the alert's fingerprint, its record ("" for a resolved alert: removed), its
#: run, its step
_TRACK = """
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
local cur = redis.call('HGET', KEYS[2], ARGV[3])
if not cur or tonumber(cur) < tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
end
return 0
"""

#: RedisOutbox._index_runs: KEYS the fleet's active alerts, one run's; ARGV fingerprints of
#: that run. Each still active in the fleet's hash is copied to the run's (if not there yet).
_INDEX = """
for _, fp in ipairs(ARGV) do
  local v = redis.call('HGET', KEYS[1], fp)
  if v then redis.call('HSETNX', KEYS[2], fp, v) end
end
return 0
"""
#: RedisOutbox.turn: KEYS the turn's record (when last taken); ARGV now, the seconds a turn
#: lasts. 1 when the caller takes it (recorded), else 0: :func:`takes_turn`, in one step.
_TURN = """
local last, now = tonumber(redis.call('GET', KEYS[1])), tonumber(ARGV[1])
if last and last <= now and now < last + tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""

#: runs :meth:`RedisOutbox._index_runs` indexes in one round trip, at most (it made a round
#: trip per run: 1,000 at a worker's start in a fleet of 1,000 runs alerting)
INDEX_RUNS = 500

#: RedisOutbox.take_due: KEYS a receiver's due set, the items; ARGV now, the lease's end, the
#: limit. The items due (each leased: due again at the lease's end); ids whose item is gone
#: leave the due set.
#: RedisOutbox.enqueue_all / release_steps: KEYS a run's held items (its steps zset), the
#: items; ARGV the step the run reached, now, the due sets' prefix. Every item held until that
#: step or an earlier one becomes due now (only brought forward: never re-opened under a
#: lease) and is held no longer. How many were held. (It writes the due set of each item's
#: receiver, a key named by its item: the outbox lives in one Redis, not a cluster.)
_RELEASE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    redis.call('ZADD', ARGV[3] .. cjson.decode(raw)['receiver'], 'XX', 'LT', ARGV[2], id)
  end
  redis.call('ZREM', KEYS[1], id)
end
return #ids
"""

#: RedisOutbox.finish, sent and bury, in one script (atomic, as the transaction it replaces:
#: four commands an item and three a call): KEYS the items, the group clocks; ARGV the marks'
#: TTL, the outbox's key prefix, the outcome, now (as JSON writes it), the number of items,
#: then each item's (id, receiver, run id), then (group, the step flushed at) pairs. Each item
#: leaves the outbox (the items, its receiver's due set, its run's held items) and its mark
#: says the outcome. Each group's clock notes the flush: its JSON (as GroupClock.to_dict and
#: json.dumps write it, "last_flush_ts" and "last_flush_step" its last two fields) has those
#: two fields written anew, its other fields left as they are (cjson would write their floats
#: with 14 digits). A group without a clock is left alone; the groups whose clock is written
#: otherwise (those two fields not last, other separators) are returned (the caller notes
#: their flush itself).
_SETTLE = """
local p, n = ARGV[2], tonumber(ARGV[5])
for i = 6, 5 + 3 * n, 3 do
  local id = ARGV[i]
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', p .. 'due:' .. ARGV[i + 1], id)
  redis.call('ZREM', p .. 'steps:' .. ARGV[i + 2], id)
  redis.call('SET', p .. 'mark:' .. id, ARGV[3], 'EX', ARGV[1])
end
local others = {}
for i = 6 + 3 * n, #ARGV, 2 do
  local raw = redis.call('HGET', KEYS[2], ARGV[i])
  if raw then
    local at = string.find(raw, '"last_flush_ts": ', 1, true)
    if at and string.find(raw, '^"last_flush_ts": [^,}]*, "last_flush_step": [^,}]*}$', at) then
      redis.call('HSET', KEYS[2], ARGV[i], string.sub(raw, 1, at - 1) .. '"last_flush_ts": '
                 .. ARGV[4] .. ', "last_flush_step": ' .. ARGV[i + 1] .. '}')
    else
      others[#others + 1] = ARGV[i]
    end
  end
end
return others
"""

_TAKE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    out[#out + 1] = raw
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
"""


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis pattern (SCAN's MATCH): ``*?[]\\`` escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisOutbox:
    """The outbox in Redis (redis.asyncio client), shared by every worker."""

    def __init__(self, redis, namespace: str = "rlwatch"):
        self.redis = redis
        self.p = f"{namespace}:outbox:"
        self._enqueue = redis.register_script(_ENQUEUE)
        self._take = redis.register_script(_TAKE)
        self._release = redis.register_script(_RELEASE)
        self._settle = redis.register_script(_SETTLE)
        self._track = redis.register_script(_TRACK)
        self._index = redis.register_script(_INDEX)
        self._turn = redis.register_script(_TURN)
        self._indexed = False
        # the active alerts as last parsed, by their stored value: every pass of the outbox reads
        # them all (inhibition), and parsing each again made a fleet's deliveries quadratic
        self._parsed: dict[bytes, tuple[float, Alert]] = {}

    async def enqueue(self, item: OutboxItem) -> bool:
        keys, args = self._enqueue_call(item)
        return bool(await self._enqueue(keys=keys, args=args))

    def _enqueue_call(self, item: OutboxItem) -> tuple[list[str], list]:
        return ([self.p + "mark:" + item.id, self.p + "items", self.p + "due:" + item.receiver,
                 self.p + "steps:" + item.run_id],
                [item.id, item.to_json(), item.next_try, MARK_TTL, "" if item.due_step is None else item.due_step])

    async def take_due(self, receiver: str, now: float, limit: int = 100, lease: float = 30.0) -> list[OutboxItem]:
        raws = await self._take(keys=[self.p + "due:" + receiver, self.p + "items"], args=[now, now + lease, limit])
        out = [OutboxItem.from_json(raw) for raw in raws]
        held = [it for it in out if it.due_step is not None]
        if held:      # due now: no longer waiting for a step
            async with self.redis.pipeline(transaction=False) as pipe:
                for it in held:
                    pipe.zrem(self.p + "steps:" + it.run_id, it.id)
                await pipe.execute()
        return out

    async def finish(self, item: OutboxItem, outcome: str) -> None:
        await self._settled([item], outcome)

    async def sent(self, items: list[OutboxItem], now: float) -> None:
        steps = flush_steps(items)
        others = await self._settled(items, "sent", now, steps)
        if others:     # clocks written otherwise than GroupClock writes them (none, so far)
            await self._flush_slowly(others, steps, now)

    async def _settled(self, items: list[OutboxItem], outcome: str, now: float = 0.0,
                       steps: dict[str, int] | None = None) -> list[str]:
        """``items`` out of the outbox with their marks saying ``outcome``, and the flush at
        ``now`` noted on the clocks of ``steps``' groups (:data:`_SETTLE`): the groups whose
        clock the script could not note."""
        keys, args = self._settle_call(items, outcome, now, steps)
        return [_s(g) for g in await self._settle(keys=keys, args=args)]

    def _settle_call(self, items: list[OutboxItem], outcome: str, now: float = 0.0,
                     steps: dict[str, int] | None = None) -> tuple[list[str], list]:
        args: list = [MARK_TTL, self.p, outcome, json.dumps(now), len(items)]
        for it in items:
            args += [it.id, it.receiver, it.run_id]
        for group, step in (steps or {}).items():
            args += [group, step]
        return [self.p + "items", self.p + "groups"], args

    async def _flush_slowly(self, groups: list[str], steps: dict[str, int], now: float) -> None:
        """Note a flush on ``groups``' clocks read and written whole (two round trips)."""
        raws = await self.redis.hmget(self.p + "groups", groups)
        flushed = {}
        for group, raw in zip(groups, raws):
            if raw is not None:
                clock = GroupClock.from_dict(json.loads(raw))
                clock.last_flush_ts, clock.last_flush_step = now, steps[group]
                flushed[group] = json.dumps(clock.to_dict())
        if flushed:
            await self.redis.hset(self.p + "groups", mapping=flushed)

    async def retry(self, item: OutboxItem, next_try: float, error: str, count: bool = True) -> None:
        if count:
            item.attempts += 1
        item.next_try, item.last_error = next_try, error
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.p + "items", item.id, item.to_json())
            pipe.zadd(self.p + "due:" + item.receiver, {item.id: next_try})
            await pipe.execute()

    async def bury(self, item: OutboxItem, error: str) -> None:
        item.last_error = error

        def queue(pipe) -> None:
            keys, args = self._settle_call([item], "dead")
            pipe.evalsha(self._settle.sha, len(keys), *keys, *args)
            pipe.lpush(self.p + "dead:" + item.receiver, item.to_json())
            pipe.ltrim(self.p + "dead:" + item.receiver, 0, 9999)
        await self._pipelined(queue, transaction=True)

    async def outcome(self, receiver: str, key: str, variant: str = "") -> str | None:
        raw = await self.redis.get(self.p + "mark:" + item_id(receiver, key, variant))
        return None if raw is None else _s(raw)

    async def outcomes(self, receiver: str, keys: list[str]) -> dict[str, str | None]:
        if not keys:
            return {}
        raws = await self.redis.mget([self.p + "mark:" + item_id(receiver, k) for k in keys])
        return {k: None if raw is None else _s(raw) for k, raw in zip(keys, raws)}

    async def release_steps(self, run_id: str, step: int, now: float) -> int:
        return int(await self._release(keys=self._release_keys(run_id), args=[step, now, self.p + "due:"]))

    def _release_keys(self, run_id: str) -> list[str]:
        return [self.p + "steps:" + run_id, self.p + "items"]

    async def pending(self, receiver: str | None = None) -> int:
        if receiver is not None:
            return int(await self.redis.zcard(self.p + "due:" + receiver))
        return int(await self.redis.hlen(self.p + "items"))

    async def dead(self, receiver: str) -> list[OutboxItem]:
        return [OutboxItem.from_json(r) for r in await self.redis.lrange(self.p + "dead:" + receiver, 0, -1)]

    async def clock(self, group: str) -> GroupClock | None:
        raw = await self.redis.hget(self.p + "groups", group)
        return None if raw is None else GroupClock.from_dict(json.loads(raw))

    async def set_clock(self, group: str, clock: GroupClock) -> None:
        await self.redis.hset(self.p + "groups", group, json.dumps(clock.to_dict()))

    async def clocks(self) -> dict[str, GroupClock]:
        raw = await self.redis.hgetall(self.p + "groups")
        return {_s(k): GroupClock.from_dict(json.loads(v)) for k, v in raw.items()}

    async def drop_clock(self, group: str) -> None:
        await self.redis.hdel(self.p + "groups", group)

    async def turn(self, name: str, now: float, every: float) -> bool:
        return bool(await self._turn(keys=[self.p + "turn:" + name], args=[repr(now), repr(every)]))

    async def track(self, alert: Alert, now: float) -> None:
        await self._track(keys=self._track_keys(alert), args=self._track_args(alert, now))

    def _track_keys(self, alert: Alert) -> list[str]:
        return [self.p + "active", self.p + "runstep", self.p + "active:" + alert.run_id]

    def _track_args(self, alert: Alert, now: float) -> list:
        firing = alert.state == "firing"
        return [alert.fingerprint, json.dumps({"at": now, "alert": alert.to_json()}) if firing else "",
                alert.run_id, alert.step]

    async def admit_all(self, alerts: list[tuple[Alert, list[str]]], now: float) -> list[dict[str, GroupClock | None]]:
        def queue(pipe) -> None:
            for _, groups in alerts:       # the clocks first: as they were before this call
                for g in groups:
                    pipe.hget(self.p + "groups", g)
            for alert, _ in alerts:
                keys = self._track_keys(alert)
                pipe.evalsha(self._track.sha, len(keys), *keys, *self._track_args(alert, now))
        got = iter(await self._pipelined(queue))
        return [{g: None if raw is None else GroupClock.from_dict(json.loads(raw))
                 for g, raw in zip(groups, got)} for _, groups in alerts]

    async def enqueue_all(self, items: list[OutboxItem], clocks: dict[str, GroupClock],
                          steps: dict[str, int], now: float) -> tuple[list[bool], int]:
        """In one transaction: a drain running meanwhile takes an alert's items together with
        the held items it releases, or neither (with the release a round trip later, a pass
        could take the alert's own items first, and a grouped receiver got two messages)."""
        def queue(pipe) -> None:
            for g, clock in clocks.items():
                pipe.hset(self.p + "groups", g, json.dumps(clock.to_dict()))
            for it in items:
                keys, args = self._enqueue_call(it)
                pipe.evalsha(self._enqueue.sha, len(keys), *keys, *args)
            for run_id, step in steps.items():
                keys = self._release_keys(run_id)
                pipe.evalsha(self._release.sha, len(keys), *keys, step, now, self.p + "due:")
        got = await self._pipelined(queue, transaction=True)
        new = [bool(x) for x in got[len(clocks):len(clocks) + len(items)]]
        return new, sum(int(n) for n in got[len(clocks) + len(items):])

    async def _pipelined(self, queue, transaction: bool = False) -> list:
        """One round trip of the commands ``queue(pipe)`` puts on a pipeline, the outbox's
        scripts called by their SHA (:func:`alerts.control.pipelined`)."""
        return await pipelined(self.redis, queue, (self._track, self._enqueue, self._release,
                                                   self._settle, self._index), transaction=transaction)

    async def active(self, now: float, runs: Iterable[str] | None = None) -> list[Alert]:
        """The firing alerts, of the whole fleet or of ``runs`` only (each run's own hash: a
        notification's inhibition reads its run's alerts, not the fleet's). A value changed by
        another worker is parsed again. The alerts returned are shared with later calls: read
        them, do not change them."""
        if runs is None:
            keys = [self.p + "active"]
            raws = [await self.redis.hgetall(keys[0])]
        else:
            if not self._indexed:
                await self._index_runs()
            keys = [self.p + "active:" + r for r in runs]
            async with self.redis.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.hgetall(k)
                raws = await pipe.execute()
        parsed, kept = self._parsed, {}
        out, stale = [], []
        for raw in raws:
            for fp, v in raw.items():
                hit = parsed.get(v)
                if hit is None:
                    d = json.loads(v)
                    hit = (d["at"], Alert.from_json(d["alert"]))
                if now - hit[0] > ACTIVE_MAX_AGE:
                    stale.append((fp, hit[1].run_id))
                else:
                    kept[v] = hit
                    out.append(hit[1])
        if runs is None:
            self._parsed = kept          # a whole read: only what is active stays parsed
        else:
            if len(parsed) > MAX_PARSED:
                parsed.clear()
            parsed.update(kept)
        if stale:
            async with self.redis.pipeline(transaction=False) as pipe:
                for fp, run_id in stale:
                    pipe.hdel(self.p + "active", fp)
                    pipe.hdel(self.p + "active:" + run_id, fp)
                await pipe.execute()
        return out

    async def _index_runs(self) -> None:
        """Once per process: the fleet's firing alerts into their runs' hashes, for alerts
        tracked by a version that kept only the fleet's (each copied only while still active)."""
        by_run: dict[str, list[str]] = {}
        for fp, v in (await self.redis.hgetall(self.p + "active")).items():
            try:
                run_id = Alert.from_json(json.loads(v)["alert"]).run_id
            except (ValueError, KeyError, TypeError):
                continue      # an unreadable record: left where it is
            by_run.setdefault(run_id, []).append(_s(fp))
        runs = list(by_run.items())
        for k in range(0, len(runs), INDEX_RUNS):     # one round trip per INDEX_RUNS runs

            def queue(pipe, part=runs[k:k + INDEX_RUNS]) -> None:
                for run_id, fps in part:
                    pipe.evalsha(self._index.sha, 2, self.p + "active", self.p + "active:" + run_id,
                                 *fps)
            await self._pipelined(queue)
        self._indexed = True

    async def run_step(self, run_id: str) -> int | None:
        raw = await self.redis.hget(self.p + "runstep", run_id)
        return None if raw is None else int(raw)

    async def run_steps(self, run_ids: list[str]) -> dict[str, int | None]:
        if not run_ids:
            return {}
        raws = await self.redis.hmget(self.p + "runstep", run_ids)
        return {r: None if raw is None else int(raw) for r, raw in zip(run_ids, raws)}

    async def note_receivers(self, receivers: list[str], now: float) -> None:
        if receivers:
            await self.redis.hset(self.p + "receivers", mapping=dict.fromkeys(receivers, repr(now)))

    async def receivers_seen(self) -> dict[str, float]:
        return {_s(k): float(v) for k, v in (await self.redis.hgetall(self.p + "receivers")).items()}

    async def forget_receivers(self, receivers: list[str]) -> None:
        if receivers:
            await self.redis.hdel(self.p + "receivers", *receivers)

    async def queued_receivers(self) -> list[str]:
        """The receivers with a due set (Redis deletes an empty one): a scan of the keys, for
        the occasional check of items no worker sends (:meth:`Drainer.bury_strays`)."""
        prefix = self.p + "due:"
        names = {_s(k)[len(prefix):] async for k in
                 self.redis.scan_iter(match=_glob_escape(prefix) + "*", count=1000)}
        return sorted(names)

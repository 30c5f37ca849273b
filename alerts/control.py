"""The monitor side of the control channel: the authoritative run state and the push.

:class:`RedisControl` keeps each run's state in Redis (``rlwatch:run:<id>:state``), publishes
every command on ``rlwatch:control:<id>`` for the workers, and appends commands to the audit
stream ``rlwatch:audit:<id>`` (workers append their acknowledgements there too).
:class:`MemoryControl` does the same in process, for the embedded demo.

Applying a command is idempotent: the first time, the state changes, the audit grows and the
command is marked applied (``rlwatch:cmd:<id>``), all in one compare-and-set script (one round
trip when the state is the one this client last saw); any later time (an
alert handled again after a crash, a brake re-sent because nobody acknowledged it) the command
is only published again. The stored state is trusted only for its signed command: a record
whose command is missing or does not verify with the control secret is ignored (and logged).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any, Callable, Protocol

from contract.commands import (
    AUDIT_LENGTH,
    Command,
    RunControl,
    applied_key,
    audit_key,
    audit_since,
    channel,
    implied_state,
    next_state,
    pending_key,
    runs_key,
    state_key,
)

__all__ = ["AUDIT_READ", "ControlChannel", "MemoryControl", "RedisControl", "audit_entries", "pipelined",
           "redis_client"]

log = logging.getLogger("rlwatch.alerts")

APPLIED_TTL = 14 * 24 * 3600
_SEEN_RUNS = 10_000     # state records remembered by a RedisControl (RedisControl._seen)
_STALE_TRIES = 100      # a state changed by others this many times in a row: give up loudly

#: audit entries read for the answers to one command, at most: the whole stream (trimmed
#: approximately, it may hold more than its length)
AUDIT_READ = 2 * AUDIT_LENGTH


def audit_entries(entries: list) -> list[dict]:
    """The entries of an ``XRANGE`` reply of an audit stream, as dicts (oldest first as read)."""
    return [json.loads(fields[b"entry"]) for _, fields in entries if b"entry" in fields]

#: Apply a command once, atomically (RedisControl._apply). KEYS: the run's state, the command's
#: applied mark, the set of runs, the audit stream, the pending list. ARGV: whether a state
#: record is expected ("1") or not ("0"), the record expected, the new record ("" when the
#: state does not change), the mark's TTL, the run id, the audit entry, the pending entry (""
#: for none), the channel and the command. Answers {"applied", state} when the command was
#: applied before (it is published again), {"stale", state} when the state is not the one
#: expected (nothing done), {"ok"} when applied now.
_APPLY = """
local cur = redis.call('GET', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[8], ARGV[9])
  return {'applied', cur}
end
if cur then
  if ARGV[1] ~= '1' or cur ~= ARGV[2] then return {'stale', cur} end
elseif ARGV[1] ~= '0' then
  return {'stale', cur}
end
if ARGV[3] ~= '' then redis.call('SET', KEYS[1], ARGV[3]) end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '%d', '*', 'entry', ARGV[6])
if ARGV[7] ~= '' then
  redis.call('LPUSH', KEYS[5], ARGV[7])
  redis.call('LTRIM', KEYS[5], 0, 99)
end
redis.call('PUBLISH', ARGV[8], ARGV[9])
return {'ok'}
""" % AUDIT_LENGTH


class ControlChannel(Protocol):
    async def apply(self, cmd: Command) -> RunControl: ...
    async def send(self, cmd: Command) -> bool:
        """Apply ``cmd``; True the first time, False when it was applied before (then it is
        only published again)."""
    async def status(self, run_id: str) -> RunControl: ...
    async def runs(self) -> list[str]: ...
    async def history(self, run_id: str, count: int = 50) -> list[dict]: ...
    async def since(self, run_id: str, ts: float) -> list[dict]:
        """The run's audit entries written since a command sent at ``ts`` (oldest first):
        every answer of its ranks to it, however many ranks the run has."""
    async def close(self) -> None: ...


def _transition(current: RunControl, cmd: Command) -> RunControl:
    state = next_state(current.state, cmd.action)
    if cmd.action in ("pause", "resume", "stop") and state != current.state:
        return RunControl(run_id=cmd.run_id, state=state, command=cmd, updated=cmd.ts)
    return current


def trusted(run_id: str, raw: bytes | str | None, secret: str | None) -> RunControl:
    """The stored state of ``run_id`` as far as its signed command vouches for it."""
    if not raw:
        return RunControl(run_id=run_id)
    try:
        ctl = RunControl.model_validate_json(raw)
    except ValueError:
        log.error("rlwatch: the stored control state of run %s is unreadable; taken as running", run_id)
        return RunControl(run_id=run_id)
    cmd = ctl.command
    if cmd is None or cmd.run_id != run_id or not cmd.verify(secret) or implied_state(cmd.action) is None:
        if ctl.state != "running":
            log.error("rlwatch: the stored control state of run %s (%s) carries no valid signed "
                      "command; ignored (someone wrote it by hand or forged it)", run_id, ctl.state)
        return RunControl(run_id=run_id)
    return RunControl(run_id=run_id, state=implied_state(cmd.action), command=cmd, updated=ctl.updated)


def redis_client(url: str):
    """The asyncio Redis client every delivery store shares: short timeouts, a few quick retries
    on connection errors (a pooled connection that went stale while Redis restarted is replaced,
    not reported), and a ping before reusing a connection idle for a while."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3, health_check_interval=10,
                                   retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
                                   retry_on_error=[RedisConnectionError, RedisTimeoutError, OSError])


async def pipelined(redis, queue, scripts, transaction: bool = False) -> list:
    """The replies of the commands ``queue(pipe)`` puts on a pipeline of ``redis`` (with
    ``transaction``, in MULTI/EXEC: no other client's command runs between them), sent in one
    round trip. The ``scripts`` (redis-py ``Script`` objects) are called on it by their SHA
    (``pipe.evalsha``: redis-py's own script calls on a pipeline cost a second round trip, to
    ask whether Redis knows them): a Redis that does not know them (restarted, or flushed)
    refuses them, so they are loaded and the whole pipeline sent again. Only for commands
    that may run twice. A command that ran the first time keeps its first reply (the second
    time it would find its own work done: a brake applied then reads "applied before")."""
    from redis.exceptions import NoScriptError
    async with redis.pipeline(transaction=transaction) as pipe:
        queue(pipe)
        first = await pipe.execute(raise_on_error=False)
    if not any(isinstance(r, NoScriptError) for r in first):
        for r in first:
            if isinstance(r, Exception):
                raise r
        return first
    for script in scripts:
        script.sha = await redis.script_load(script.script)
    async with redis.pipeline(transaction=transaction) as pipe:
        queue(pipe)
        again = await pipe.execute()
    return [a if isinstance(f, Exception) else f for f, a in zip(first, again)]


def _reply(reply) -> tuple[str, bytes | None]:
    """(status, the state Redis has) of an :data:`_APPLY` reply."""
    status, *rest = reply
    return (status.decode() if isinstance(status, bytes) else status), (rest[0] if rest else None)


class RedisControl:
    """Control state in Redis (redis.asyncio). ``url`` may carry AUTH and ``rediss://`` TLS.
    ``secret``: the control secret, to tell signed state records from planted ones."""

    def __init__(self, url: str, secret: str | None = None, redis=None):
        self.url, self.secret = url, secret
        self.redis = redis if redis is not None else redis_client(url)
        self._script = self.redis.register_script(_APPLY)
        #: each run's state record as this client last read or wrote it (None: no record), the
        #: guess a send starts from
        self._seen: OrderedDict[str, bytes | None] = OrderedDict()

    async def status(self, run_id: str) -> RunControl:
        return trusted(run_id, await self.redis.get(state_key(run_id)), self.secret)

    async def apply(self, cmd: Command) -> RunControl:
        return (await self._apply(cmd))[0]

    async def send(self, cmd: Command) -> bool:
        return (await self._apply(cmd))[1]

    async def _apply(self, cmd: Command) -> tuple[RunControl, bool]:
        """One compare-and-set script per send (:data:`_APPLY`): the run's state as this client
        last saw it goes with the command; Redis applies it only if the state is still that one
        (else it answers with the state it has, and the transition is worked out again). A
        command applied before is only published again. The state's signature is checked here,
        never in Redis, so the script takes the new state ready-made."""
        run_id = cmd.run_id
        raw = self._seen.get(run_id)
        for _ in range(_STALE_TRIES):
            keys, args, new, new_raw = self._apply_call(cmd, raw)
            status, got = _reply(await self._script(keys=keys, args=args))
            if status == "ok":
                self._remember(run_id, new_raw or raw)
                return new, True
            self._remember(run_id, got)
            if status == "applied":
                return trusted(run_id, got, self.secret), False
            raw = got     # stale: another writer changed the state since
        raise RuntimeError(f"the control state of run {run_id} kept changing under "
                           f"{_STALE_TRIES} attempts to apply {cmd.action}")

    async def send_all(self, cmds: list[Command], then: Callable[[Any], None] | None = None,
                       scripts: tuple = ()) -> list[bool | None]:
        """Apply ``cmds`` in order in one round trip: a pipeline of :data:`_APPLY` scripts, each
        expecting the state the commands before it leave (from the state this client last saw),
        then what ``then(pipe)`` queues on it (calling ``scripts`` by their SHA). For each
        command: True (applied now), False (applied before: published again) or None (its
        run's state was not the one expected, so it was not applied: :meth:`send` it, which
        works the transition out again; a command after it of the same run is then None too,
        as it expected a state that did not come)."""
        calls = []
        guess: dict[str, bytes | None] = {}
        for cmd in cmds:
            raw = guess[cmd.run_id] if cmd.run_id in guess else self._seen.get(cmd.run_id)
            keys, args, _, new_raw = self._apply_call(cmd, raw)
            calls.append((keys, args, raw, new_raw))
            guess[cmd.run_id] = new_raw or raw

        def queue(pipe) -> None:
            for keys, args, _, _ in calls:
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            if then is not None:
                then(pipe)
        replies = await pipelined(self.redis, queue, (self._script, *scripts))
        out: list[bool | None] = []
        for cmd, (_, _, raw, new_raw), reply in zip(cmds, calls, replies):
            status, got = _reply(reply)
            self._remember(cmd.run_id, (new_raw or raw) if status == "ok" else got)
            out.append(True if status == "ok" else False if status == "applied" else None)
        return out

    def _apply_call(self, cmd: Command, raw: bytes | None) -> tuple[list, list, RunControl, bytes]:
        """The keys and arguments of :data:`_APPLY` for ``cmd`` on a run whose state is
        expected to be ``raw``; the state it leaves, and its record (b"" when unchanged)."""
        run_id = cmd.run_id
        keys = [state_key(run_id), applied_key(cmd.id), runs_key(), audit_key(run_id), pending_key(run_id)]
        body = cmd.model_dump_json()
        entry = json.dumps({"type": "command", **cmd.model_dump(exclude_none=True)})
        # a command that sets no state is also kept in a list for workers disconnected right now
        # (pub/sub is fire and forget); they read it when they connect
        pending = body if implied_state(cmd.action) is None else ""
        current = trusted(run_id, raw, self.secret)
        new = _transition(current, cmd)
        new_raw = new.model_dump_json().encode() if new is not current else b""
        return keys, [b"0" if raw is None else b"1", raw or b"", new_raw, APPLIED_TTL, run_id, entry,
                      pending, channel(run_id), body], new, new_raw

    def _remember(self, run_id: str, raw: bytes | None) -> None:
        seen = self._seen
        seen[run_id] = raw
        seen.move_to_end(run_id)
        if len(seen) > _SEEN_RUNS:
            seen.popitem(last=False)

    async def runs(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(runs_key()))

    async def history(self, run_id: str, count: int = 50) -> list[dict]:
        return audit_entries(list(reversed(await self.redis.xrevrange(audit_key(run_id), count=count))))

    async def since(self, run_id: str, ts: float) -> list[dict]:
        return audit_entries(await self.redis.xrange(audit_key(run_id), min=audit_since(ts), max="+",
                                                     count=AUDIT_READ))

    async def close(self) -> None:
        await self.redis.aclose()


class MemoryControl:
    """The same semantics in process. Subscribers get each command as Redis would push it."""

    def __init__(self):
        self.states: dict[str, RunControl] = {}
        self.audit: dict[str, list[dict]] = {}
        self.applied: set[str] = set()
        self.subscribers: dict[str, list[Callable[[Command], None]]] = {}

    def subscribe(self, run_id: str, fn: Callable[[Command], None]) -> None:
        self.subscribers.setdefault(run_id, []).append(fn)

    def record_ack(self, ack: dict) -> None:
        self.audit.setdefault(ack["run_id"], []).append(ack)

    async def status(self, run_id: str) -> RunControl:
        return self.states.get(run_id) or RunControl(run_id=run_id)

    async def apply(self, cmd: Command) -> RunControl:
        await self.send(cmd)
        return await self.status(cmd.run_id)

    async def send(self, cmd: Command) -> bool:
        first = cmd.id not in self.applied
        if first:
            self.applied.add(cmd.id)
            self.states[cmd.run_id] = _transition(await self.status(cmd.run_id), cmd)
            self.audit.setdefault(cmd.run_id, []).append({"type": "command", **cmd.model_dump(exclude_none=True)})
        for fn in self.subscribers.get(cmd.run_id, []):
            fn(cmd)
        return first

    async def runs(self) -> list[str]:
        return sorted(set(self.states) | set(self.audit))

    async def history(self, run_id: str, count: int = 50) -> list[dict]:
        return self.audit.get(run_id, [])[-count:]

    async def since(self, run_id: str, ts: float) -> list[dict]:
        return self.audit.get(run_id, [])[-AUDIT_READ:]     # nothing older is kept in memory

    async def close(self) -> None:
        return None

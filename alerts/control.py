"""The monitor side of the control channel: the authoritative run state and the push.

:class:`RedisControl` keeps each run's state in Redis (``rlwatch:run:<id>:state``), publishes
every command on ``rlwatch:control:<id>`` for the workers, and appends commands to the audit
stream ``rlwatch:audit:<id>`` (workers append their acknowledgements there too).
:class:`MemoryControl` does the same in process, for the embedded demo.

Applying a command is idempotent: the first time, the state changes, the audit grows and the
command is marked applied (``rlwatch:cmd:<id>``), all in one transaction; any later time (an
alert handled again after a crash, a brake re-sent because nobody acknowledged it) the command
is only published again. The stored state is trusted only for its signed command: a record
whose command is missing or does not verify with the control secret is ignored (and logged).
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Protocol

from contract.commands import (
    Command,
    RunControl,
    applied_key,
    audit_key,
    channel,
    implied_state,
    next_state,
    pending_key,
    runs_key,
    state_key,
)

__all__ = ["ControlChannel", "MemoryControl", "RedisControl", "redis_client"]

log = logging.getLogger("rlwatch.alerts")

APPLIED_TTL = 14 * 24 * 3600


class ControlChannel(Protocol):
    async def apply(self, cmd: Command) -> RunControl: ...
    async def send(self, cmd: Command) -> bool:
        """Apply ``cmd``; True the first time, False when it was applied before (then it is
        only published again)."""
    async def status(self, run_id: str) -> RunControl: ...
    async def runs(self) -> list[str]: ...
    async def history(self, run_id: str, count: int = 50) -> list[dict]: ...
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


class RedisControl:
    """Control state in Redis (redis.asyncio). ``url`` may carry AUTH and ``rediss://`` TLS.
    ``secret``: the control secret, to tell signed state records from planted ones."""

    def __init__(self, url: str, secret: str | None = None, redis=None):
        self.url, self.secret = url, secret
        self.redis = redis if redis is not None else redis_client(url)

    async def status(self, run_id: str) -> RunControl:
        return trusted(run_id, await self.redis.get(state_key(run_id)), self.secret)

    async def apply(self, cmd: Command) -> RunControl:
        return (await self._apply(cmd))[0]

    async def send(self, cmd: Command) -> bool:
        return (await self._apply(cmd))[1]

    async def _apply(self, cmd: Command) -> tuple[RunControl, bool]:
        from redis.exceptions import WatchError

        key, mark = state_key(cmd.run_id), applied_key(cmd.id)
        body = cmd.model_dump_json()
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key, mark)
                    current = trusted(cmd.run_id, await pipe.get(key), self.secret)
                    if await pipe.exists(mark):
                        await pipe.reset()
                        await self.redis.publish(channel(cmd.run_id), body)
                        return current, False
                    new = _transition(current, cmd)
                    pipe.multi()
                    if new is not current:
                        pipe.set(key, new.model_dump_json())
                    pipe.set(mark, b"1", ex=APPLIED_TTL)
                    pipe.sadd(runs_key(), cmd.run_id)
                    pipe.xadd(audit_key(cmd.run_id),
                              {"entry": json.dumps({"type": "command", **cmd.model_dump(exclude_none=True)})},
                              maxlen=10_000, approximate=True)
                    if implied_state(cmd.action) is None:
                        # kept for workers that are disconnected right now (pub/sub is fire
                        # and forget); they read it when they connect
                        pipe.lpush(pending_key(cmd.run_id), body)
                        pipe.ltrim(pending_key(cmd.run_id), 0, 99)
                    pipe.publish(channel(cmd.run_id), body)
                    await pipe.execute()
                    return new, True
                except WatchError:
                    continue

    async def runs(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(runs_key()))

    async def history(self, run_id: str, count: int = 50) -> list[dict]:
        entries = await self.redis.xrevrange(audit_key(run_id), count=count)
        return [json.loads(fields[b"entry"]) for _, fields in reversed(entries)]

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

    async def close(self) -> None:
        return None

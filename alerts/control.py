"""The monitor side of the control channel: the authoritative run state and the push.

:class:`RedisControl` keeps each run's state in Redis (``rlwatch:run:<id>:state``), publishes
every command on ``rlwatch:control:<id>`` for the workers, and appends commands to the audit
stream ``rlwatch:audit:<id>`` (workers append their acknowledgements there too).
:class:`MemoryControl` does the same in process, for the embedded demo.
"""

from __future__ import annotations

import json
from typing import Callable, Protocol

from contract.commands import (
    Command,
    RunControl,
    audit_key,
    channel,
    next_state,
    pending_key,
    runs_key,
    state_key,
)

__all__ = ["ControlChannel", "MemoryControl", "RedisControl"]


class ControlChannel(Protocol):
    async def apply(self, cmd: Command) -> RunControl: ...
    async def status(self, run_id: str) -> RunControl: ...
    async def runs(self) -> list[str]: ...
    async def history(self, run_id: str, count: int = 50) -> list[dict]: ...
    async def close(self) -> None: ...


def _transition(current: RunControl, cmd: Command) -> RunControl:
    state = next_state(current.state, cmd.action)
    if cmd.action in ("pause", "resume", "stop") and state != current.state:
        return RunControl(run_id=cmd.run_id, state=state, command=cmd, updated=cmd.ts)
    return current


class RedisControl:
    """Control state in Redis (redis.asyncio). ``url`` may carry AUTH and ``rediss://`` TLS."""

    def __init__(self, url: str):
        import redis.asyncio as aioredis

        self.url = url
        self.redis = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)

    async def status(self, run_id: str) -> RunControl:
        raw = await self.redis.get(state_key(run_id))
        return RunControl.model_validate_json(raw) if raw else RunControl(run_id=run_id)

    async def apply(self, cmd: Command) -> RunControl:
        key = state_key(cmd.run_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    current = RunControl.model_validate_json(raw) if raw else RunControl(run_id=cmd.run_id)
                    new = _transition(current, cmd)
                    pipe.multi()
                    if new is not current:
                        pipe.set(key, new.model_dump_json())
                    pipe.sadd(runs_key(), cmd.run_id)
                    pipe.xadd(audit_key(cmd.run_id),
                              {"entry": json.dumps({"type": "command", **cmd.model_dump(exclude_none=True)})},
                              maxlen=10_000, approximate=True)
                    if cmd.action not in ("pause", "resume", "stop"):
                        # kept for workers that are disconnected right now (pub/sub is fire
                        # and forget); they read it when they connect
                        pipe.lpush(pending_key(cmd.run_id), cmd.model_dump_json())
                        pipe.ltrim(pending_key(cmd.run_id), 0, 99)
                    pipe.publish(channel(cmd.run_id), cmd.model_dump_json())
                    await pipe.execute()
                    return new
                except Exception as exc:
                    from redis.exceptions import WatchError

                    if isinstance(exc, WatchError):
                        continue
                    raise

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
        self.subscribers: dict[str, list[Callable[[Command], None]]] = {}

    def subscribe(self, run_id: str, fn: Callable[[Command], None]) -> None:
        self.subscribers.setdefault(run_id, []).append(fn)

    def record_ack(self, ack: dict) -> None:
        self.audit.setdefault(ack["run_id"], []).append(ack)

    async def status(self, run_id: str) -> RunControl:
        return self.states.get(run_id) or RunControl(run_id=run_id)

    async def apply(self, cmd: Command) -> RunControl:
        current = await self.status(cmd.run_id)
        new = _transition(current, cmd)
        self.states[cmd.run_id] = new
        self.audit.setdefault(cmd.run_id, []).append({"type": "command", **cmd.model_dump(exclude_none=True)})
        for fn in self.subscribers.get(cmd.run_id, []):
            fn(cmd)
        return new

    async def runs(self) -> list[str]:
        return sorted(set(self.states) | set(self.audit))

    async def history(self, run_id: str, count: int = 50) -> list[dict]:
        return self.audit.get(run_id, [])[-count:]

    async def close(self) -> None:
        return None

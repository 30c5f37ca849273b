"""Silences: mute the notifications of matching alerts for a while (commands still go out).

The model and the matching are pure (:class:`Silence`, :func:`silenced_by`); the stores keep
silences in Redis (``rlwatch:silences``, shared by every worker and the CLI) or in memory.
``rlwatch silence add run=exp-7 rule=kl_* --duration 2h --comment "known, retuning beta"``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from alerts.matchers import Matchers
from alerts.intervals import parse_interval
from contract.alert import Alert

__all__ = ["MemorySilences", "RedisSilences", "Silence", "SilenceStore", "parse_duration", "silenced_by"]

KEY = "rlwatch:silences"


def parse_duration(text: str | float) -> float:
    """Seconds from ``"90"``, ``"30m"``, ``"2h"``, ``"1d"``."""
    iv = parse_interval(text)
    if iv.unit != "s" or iv.value <= 0:
        raise ValueError(f"a silence lasts a positive time such as 30m or 2h, got {text!r}")
    return iv.value


class Silence(BaseModel):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    matchers: dict[str, Any]
    starts_at: float
    ends_at: float
    created_by: str = ""
    comment: str = ""

    @field_validator("matchers")
    @classmethod
    def _valid(cls, v: dict) -> dict:
        if not v:
            raise ValueError("a silence needs at least one matcher (it would mute everything)")
        Matchers.parse(v)
        return v

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, alert: Alert) -> bool:
        return Matchers.parse(self.matchers).matches(alert)

    def state(self, now: float) -> str:
        return "active" if self.active(now) else ("pending" if now < self.starts_at else "expired")


def silenced_by(alert: Alert, silences: list[Silence], now: float) -> Silence | None:
    """The first active silence that matches ``alert``."""
    for s in silences:
        if s.active(now) and s.matches(alert):
            return s
    return None


class SilenceStore(Protocol):
    async def add(self, silence: Silence) -> Silence: ...
    async def all(self) -> list[Silence]: ...
    async def expire(self, silence_id: str, now: float) -> Silence | None: ...


class MemorySilences:
    def __init__(self):
        self.items: dict[str, Silence] = {}

    async def add(self, silence: Silence) -> Silence:
        self.items[silence.id] = silence
        return silence

    async def all(self) -> list[Silence]:
        return sorted(self.items.values(), key=lambda s: s.starts_at)

    async def expire(self, silence_id: str, now: float) -> Silence | None:
        s = self._find(silence_id)
        if s is None:
            return None
        s = s.model_copy(update={"ends_at": min(s.ends_at, now)})
        self.items[s.id] = s
        return s

    def _find(self, prefix: str) -> Silence | None:
        hits = [s for k, s in self.items.items() if k.startswith(prefix)]
        return hits[0] if len(hits) == 1 else None


class RedisSilences:
    """Silences in the hash ``rlwatch:silences``; expired ones are dropped after a week."""

    KEEP_EXPIRED = 7 * 86400

    def __init__(self, redis, cache_seconds: float = 0.0, clock=time.time):
        self.redis, self.cache_seconds, self.clock = redis, cache_seconds, clock
        self._cache: tuple[float, list[Silence]] | None = None

    async def add(self, silence: Silence) -> Silence:
        await self.redis.hset(KEY, silence.id, silence.model_dump_json())
        self._cache = None
        return silence

    async def all(self) -> list[Silence]:
        now = self.clock()
        if self._cache and now - self._cache[0] < self.cache_seconds:
            return self._cache[1]
        raw = await self.redis.hgetall(KEY)
        out, stale = [], []
        for k, v in raw.items():
            s = Silence.model_validate(json.loads(v))
            if s.ends_at < now - self.KEEP_EXPIRED:
                stale.append(k)
            else:
                out.append(s)
        if stale:
            await self.redis.hdel(KEY, *stale)
        out.sort(key=lambda s: s.starts_at)
        self._cache = (now, out)
        return out

    async def expire(self, silence_id: str, now: float) -> Silence | None:
        self._cache = None
        hits = [s for s in await self.all() if s.id.startswith(silence_id)]
        self._cache = None
        if len(hits) != 1:
            return None
        s = hits[0].model_copy(update={"ends_at": min(hits[0].ends_at, now)})
        await self.redis.hset(KEY, s.id, s.model_dump_json())
        return s

"""Deduplication of deliveries by alert identity, so no one is paged twice for one alert.

The key is (fingerprint, state, onset step): a restarted or second worker re-emitting the same
firing alert finds the key taken. Kept in Redis for workers, in memory for demo and replay.
"""

from __future__ import annotations

from typing import Protocol

from contract.alert import Alert

__all__ = ["Dedup", "MemoryDedup", "RedisDedup", "delivery_key"]

TTL_SECONDS = 14 * 24 * 3600


def delivery_key(alert: Alert) -> str:
    return f"{alert.fingerprint}:{alert.state}:{alert.onset_step}"


class Dedup(Protocol):
    async def claim(self, key: str) -> bool:
        """True the first time ``key`` is claimed (deliver), False afterwards (skip)."""

    async def release(self, key: str) -> None:
        """Forget a claim whose delivery failed, so a retry may deliver it."""


class MemoryDedup:
    def __init__(self, limit: int = 100_000):
        self.keys: dict[str, None] = {}
        self.limit = limit

    async def claim(self, key: str) -> bool:
        if key in self.keys:
            return False
        if len(self.keys) >= self.limit:
            self.keys.pop(next(iter(self.keys)))
        self.keys[key] = None
        return True

    async def release(self, key: str) -> None:
        self.keys.pop(key, None)


class RedisDedup:
    def __init__(self, redis):
        self.redis = redis

    async def claim(self, key: str) -> bool:
        return bool(await self.redis.set(f"rlwatch:delivered:{key}", b"1", nx=True, ex=TTL_SECONDS))

    async def release(self, key: str) -> None:
        await self.redis.delete(f"rlwatch:delivered:{key}")

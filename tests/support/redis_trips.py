"""Round trips to Redis, counted in the client: what a test asserts when a change is about
sending fewer of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def counting_round_trips() -> Iterator[list[int]]:
    """Within the block, ``count[0]`` is the number of round trips any ``redis.asyncio`` client
    makes (one per command, one per pipeline, sent or not in a transaction)."""
    from redis.asyncio.connection import AbstractConnection

    count = [0]
    send = AbstractConnection.send_packed_command

    async def counted(self, command, check_health=True):
        count[0] += 1
        return await send(self, command, check_health)

    AbstractConnection.send_packed_command = counted
    try:
        yield count
    finally:
        AbstractConnection.send_packed_command = send

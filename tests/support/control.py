"""Apply a control command on a real Redis the way the monitor does (``RedisControl.apply``)."""

from __future__ import annotations

import asyncio

from alerts.control import RedisControl
from contract.commands import Command, RunControl


def apply_command(url: str, cmd: Command) -> RunControl:
    async def go():
        c = RedisControl(url)
        try:
            return await c.apply(cmd)
        finally:
            await c.close()

    return asyncio.run(go())

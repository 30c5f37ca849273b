"""An unacknowledged brake escalates.

Every pause or stop the monitor sends is remembered; a worker that applies it acknowledges it
(``rlwatch:acks:<run>``, written by :class:`producers.control.ControlListener`). A brake with no
acknowledgement after ``timeout`` seconds (default 60) raises a follow-up alert one tier up
(``control_unacknowledged``, black after a red pause), routed like any other alert, so whoever
is on call learns that the run may be training on, unbraked. When the acknowledgement finally
arrives, or an operator resumes or stops the run, that alert resolves.

The decision is a pure function of (commands sent, acks seen, run states, now):
:func:`overdue_commands`. :class:`RedisAcks` / :class:`MemoryAcks` keep the bookkeeping; the
dispatcher's ``tick()`` runs the check on the worker's timer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

from contract.alert import SEVERITIES, Alert
from contract.commands import Command, RunControl, state_key

__all__ = ["BRAKES", "MemoryAcks", "RedisAcks", "SentCommand", "escalation_alert", "overdue_commands"]

BRAKES = ("pause", "stop")
RULE = "control_unacknowledged"
PENDING = "rlwatch:acks:pending"
ESCALATED = "rlwatch:acks:escalated"


@dataclass(frozen=True)
class SentCommand:
    command_id: str
    run_id: str
    action: str
    ts: float
    rule: str | None = None
    severity: str | None = None
    step: int | None = None

    @classmethod
    def of(cls, cmd: Command) -> SentCommand:
        return cls(cmd.id, cmd.run_id, cmd.action, cmd.ts, cmd.rule, cmd.severity, cmd.step)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> SentCommand:
        return cls(**json.loads(raw))


def settled(sent: SentCommand, acked: set[str], current: Mapping[str, RunControl]) -> bool:
    """Acknowledged, or overtaken by a later operator decision (a resume, or another brake)."""
    if sent.command_id in acked:
        return True
    ctl = current.get(sent.run_id)
    cmd = ctl.command if ctl is not None else None
    return cmd is not None and cmd.id != sent.command_id and cmd.ts >= sent.ts and \
        cmd.action in ("resume", "stop")


def overdue_commands(sent: Iterable[SentCommand], acked: set[str], now: float, timeout: float,
                     current: Mapping[str, RunControl] | None = None
                     ) -> tuple[list[SentCommand], list[SentCommand]]:
    """(overdue, settled): brakes past ``timeout`` with no ack, and those needing no more care."""
    current = current or {}
    overdue, done = [], []
    for s in sent:
        if settled(s, acked, current):
            done.append(s)
        elif now - s.ts >= timeout:
            overdue.append(s)
    return overdue, done


def escalation_alert(sent: SentCommand, timeout: float, now: float, state: str = "firing") -> Alert:
    """The follow-up alert, one tier above the command's own."""
    tier = SEVERITIES[min(SEVERITIES.index(sent.severity or "red") + 1, len(SEVERITIES) - 1)]
    what = f"{sent.action} command {sent.command_id[:12]}"
    if state == "firing":
        summary = (f"run {sent.run_id}: no worker acknowledged the {what} within {timeout:.0f}s "
                   f"(sent for {sent.rule or 'an operator'}); the run may still be training")
    else:
        summary = f"run {sent.run_id}: the {what} is acknowledged or overtaken"
    diagnosis = ("The monitor set the run's state in Redis and published the command, but no "
                 "worker wrote an acknowledgement. Likely: the training process hangs or died, "
                 "it runs without the rlwatch SDK's control listener (Monitor(redis=...)), it "
                 "cannot reach Redis, or it rejects the command's signature (check "
                 "RLWATCH_CONTROL_SECRET on both sides). Check the run now; "
                 f"`rlwatch status {sent.run_id}` shows the command history.")
    return Alert(rule=RULE, severity=tier, state=state, run_id=sent.run_id,
                 step=sent.step or 0, onset_step=sent.step, value=round(now - sent.ts, 1),
                 threshold=timeout, metric="seconds_without_ack", actions=["notify"],
                 summary=summary, diagnosis=diagnosis if state == "firing" else "",
                 labels={"command": sent.action, "command_id": sent.command_id,
                         "source_rule": sent.rule or ""}, ts=now)


class AckTracker(Protocol):
    async def expect(self, cmd: Command) -> None: ...
    async def check(self, now: float, timeout: float) -> tuple[list[SentCommand], list[SentCommand]]:
        """(newly overdue, escalated ones now settled); each is returned to one caller only."""


class MemoryAcks:
    """For the embedded demo and tests: acks read from a :class:`MemoryControl`'s audit."""

    def __init__(self, control):
        self.control = control
        self.pending: dict[str, SentCommand] = {}
        self.escalated: dict[str, SentCommand] = {}

    async def expect(self, cmd: Command) -> None:
        if cmd.action in BRAKES:
            self.pending[cmd.id] = SentCommand.of(cmd)

    def _acked(self, run_id: str) -> set[str]:
        return {e.get("command_id") for e in self.control.audit.get(run_id, []) if e.get("type") == "ack"}

    async def check(self, now: float, timeout: float):
        runs = {s.run_id for s in [*self.pending.values(), *self.escalated.values()]}
        acked = set().union(*(self._acked(r) for r in runs)) if runs else set()
        current = {r: await self.control.status(r) for r in runs}
        overdue, done = overdue_commands(self.pending.values(), acked, now, timeout, current)
        for s in [*overdue, *done]:
            self.pending.pop(s.command_id, None)
        for s in overdue:
            self.escalated[s.command_id] = s
        _, late = overdue_commands(self.escalated.values(), acked, now, float("inf"), current)
        for s in late:
            self.escalated.pop(s.command_id, None)
        return overdue, late


class RedisAcks:
    """Pending brakes in ``rlwatch:acks:pending`` (zset by time sent), escalated ones in
    ``rlwatch:acks:escalated``; acks in the workers' ``rlwatch:acks:<run>`` hashes. ZREM
    decides which worker escalates (or resolves) each one, so it happens once."""

    def __init__(self, redis):
        self.redis = redis

    async def expect(self, cmd: Command) -> None:
        if cmd.action in BRAKES:
            await self.redis.zadd(PENDING, {SentCommand.of(cmd).to_json(): cmd.ts})

    async def _context(self, sent: list[SentCommand]):
        runs = sorted({s.run_id for s in sent})
        acked: set[str] = set()
        current: dict[str, RunControl] = {}
        for r in runs:
            ids = [s.command_id for s in sent if s.run_id == r]
            got = await self.redis.hmget(f"rlwatch:acks:{r}", ids)
            acked |= {i for i, v in zip(ids, got) if v is not None}
            raw = await self.redis.get(state_key(r))
            if raw:
                current[r] = RunControl.model_validate_json(raw)
        return acked, current

    async def check(self, now: float, timeout: float):
        pending = [SentCommand.from_json(m) for m in await self.redis.zrangebyscore(PENDING, "-inf", now)]
        escalated = [SentCommand.from_json(m) for m in await self.redis.zrange(ESCALATED, 0, -1)]
        if not pending and not escalated:
            return [], []
        acked, current = await self._context(pending + escalated)
        overdue, done = overdue_commands(pending, acked, now, timeout, current)
        for s in done:
            await self.redis.zrem(PENDING, s.to_json())
        mine = []
        for s in overdue:
            if await self.redis.zrem(PENDING, s.to_json()):
                await self.redis.zadd(ESCALATED, {s.to_json(): s.ts})
                mine.append(s)
        _, late = overdue_commands(escalated, acked, now, float("inf"), current)
        resolved = [s for s in late if await self.redis.zrem(ESCALATED, s.to_json())]
        return mine, resolved

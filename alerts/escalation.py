"""An unacknowledged brake escalates.

Every pause or stop the monitor sends is remembered; a worker that applies it acknowledges it
(``rlwatch:acks:<run>``, written by :class:`producers.control.ControlListener`, signed with the
control secret when there is one). Until then the brake is re-sent now and then (the worker
acknowledges a command it applied already again): ``first`` seconds after it was sent, then
twice as long after each re-send, at most ``most`` apart (:func:`next_resend`), each re-send
taken by one worker of the deployment (:meth:`AckTracker.due_again`). A brake with no
acknowledgement after ``timeout`` seconds (default 60) raises a follow-up alert one tier up
(``control_unacknowledged``, black after a red pause), routed like any other alert, so whoever
is on call learns that the run may be training on, unbraked. When the acknowledgement finally
arrives, or an operator resumes or stops the run, that alert resolves. A brake acknowledged in
time is returned once as confirmed, with its ranks' answers, and told as holding
(:mod:`alerts.notices`); so is a rule's adjust or rollback (:data:`ASKED`) when it is answered,
applied or not (never re-sent nor escalated). Either waits for the answers of every rank of the
run (the ``world_size`` in them), or the timeout, and then names the silent ranks
(:func:`complete`).

The decision is a pure function of (commands sent, acks seen, run states, now):
:func:`overdue_commands`. :class:`RedisAcks` / :class:`MemoryAcks` keep the bookkeeping; the
dispatcher's ``tick()`` runs the check on the worker's timer.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from contract.alert import SEVERITIES, Alert
from contract.commands import Command, RunControl, ack_signature, acks_key, audit_key, audit_since, state_key

__all__ = ["BRAKES", "Checked", "MemoryAcks", "RedisAcks", "SentCommand", "escalation_alert", "overdue_commands",
           "unreachable_alert"]

BRAKES = ("pause", "stop")
#: a rule's commands that change the training, whose answer is told when it comes (a script
#: without the callback answers "ignored", and the alert said the monitor did it): neither
#: re-sent nor escalated (a run that does not answer is the brake's business)
ASKED = ("adjust", "rollback")
RULE = "control_unacknowledged"
UNREACHABLE = "control_unreachable"
FORGET_AFTER = 86400.0
#: the longest wait between two re-sends of a brake no worker acknowledged (default). A
#: listener reads its run's state on every (re)connect, so a re-send only reaches one that
#: missed the publication while connected, or asks one that applied it for an acknowledgement
#: that was lost. A run that never answers (no listener, or gone) had its brake published
#: every 5 s for a day, by every worker.
RESEND_MOST = 300.0


def next_resend(gap: float | None, first: float, most: float) -> float:
    """The wait before a brake's next re-send, after one that waited ``gap`` (None: the wait
    before its first re-send): ``first``, then twice the last, at most ``most`` (never less
    than ``first``).

    >>> waits, gap = [], None
    >>> for _ in range(7):
    ...     gap = next_resend(gap, 5.0, 60.0)
    ...     waits.append(gap)
    >>> waits
    [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    """
    if gap is None:
        return first
    return max(first, min(most, 2.0 * gap))


@dataclass(frozen=True)
class Checked:
    """What one check of the brakes found: each brake in one list, for one caller only."""

    overdue: list[SentCommand]           # no acknowledgement within the timeout: escalate
    late: list[SentCommand]              # escalated, now acknowledged or overtaken: resolve
    #: acknowledged within the timeout, each with its ranks' answers (rank -> acknowledgement,
    #: :func:`alerts.operator.answers_of`), once every rank answered or the timeout passed: say
    #: it holds (or on which ranks)
    confirmed: list[tuple[SentCommand, dict[int, dict]]]


@dataclass(frozen=True)
class SentCommand:
    command_id: str
    run_id: str
    action: str
    ts: float
    rule: str | None = None
    severity: str | None = None
    step: int | None = None
    said: str = ""            # the command in a few words (alerts.operator.say_sent)

    @classmethod
    def of(cls, cmd: Command) -> SentCommand:
        from alerts.operator import say_sent

        return cls(cmd.id, cmd.run_id, cmd.action, cmd.ts, cmd.rule, cmd.severity, cmd.step, say_sent(cmd))


def settled(sent: SentCommand, acked: Container[str], current: Mapping[str, RunControl]) -> bool:
    """Acknowledged, or overtaken by a later operator decision (a resume, or another brake)."""
    return sent.command_id in acked or overtaken(sent, current)


def overtaken(sent: SentCommand, current: Mapping[str, RunControl]) -> bool:
    """The run's state was set since by a later resume or stop."""
    ctl = current.get(sent.run_id)
    cmd = ctl.command if ctl is not None else None
    return cmd is not None and cmd.id != sent.command_id and cmd.ts >= sent.ts and \
        cmd.action in ("resume", "stop")


def overdue_commands(sent: Iterable[SentCommand], acked: Container[str], now: float, timeout: float,
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


def unreachable_alert(cmd: Command, error: str, waited: float, now: float, state: str = "firing") -> Alert:
    """The alarm for a brake the control channel has not taken for ``waited`` seconds (Redis
    down): one tier above the command's own. Sent straight to the receivers, not through Redis."""
    tier = SEVERITIES[min(SEVERITIES.index(cmd.severity or "red") + 1, len(SEVERITIES) - 1)]
    if state == "firing":
        summary = (f"run {cmd.run_id}: the {cmd.action} command {cmd.id[:12]} (for {cmd.rule or 'an operator'}) "
                   f"could not be sent for {waited:.0f}s: the control channel is unreachable "
                   f"({error}); the run is training on, unbraked, and the monitor keeps trying")
        diagnosis = ("The monitor could not write the command to Redis. Check Redis (RLWATCH_REDIS) "
                     "now; the brake lands by itself when it is back. If the run must stop at once, "
                     "stop it by hand on the training side.")
    else:
        summary = f"run {cmd.run_id}: the {cmd.action} command {cmd.id[:12]} reached the control channel after {waited:.0f}s"
        diagnosis = ""
    return Alert(rule=UNREACHABLE, severity=tier, state=state, run_id=cmd.run_id, step=cmd.step or 0,
                 onset_step=cmd.step, value=round(waited, 1), threshold=None, metric="seconds_unsent",
                 actions=["notify"], summary=summary, diagnosis=diagnosis,
                 labels={"command": cmd.action, "command_id": cmd.id, "source_rule": cmd.rule or ""}, ts=now)


class AckTracker(Protocol):
    async def expect(self, cmd: Command) -> None:
        """Remember a brake until a worker acknowledges it (idempotent per command id)."""

    async def check(self, now: float, timeout: float) -> Checked:
        """The brakes newly overdue, the escalated ones now settled, and those acknowledged in
        time; each is returned to one caller only."""

    async def outstanding(self) -> list[Command]:
        """The brakes still waiting for an acknowledgement (escalated or not)."""

    async def due_again(self, now: float, first: float, most: float) -> list[Command]:
        """The brakes still waiting for an acknowledgement whose re-send is due at ``now``
        (:func:`next_resend`; the first ``first`` seconds after the brake's ``ts``), each
        marked re-sent as it is returned: a due re-send is returned to one caller only, so
        the workers of a deployment share them."""


def _acked(entries: Iterable[dict], secret: str | None) -> dict[str, dict]:
    """The acknowledgements among ``entries`` by the id of their command (with a secret,
    signed ones only; the last one of a command when it has several)."""
    return {e.get("command_id"): e for e in entries
            if e.get("type", "ack") == "ack" and (not secret or e.get("signature") == ack_signature(e, secret))}


def confirmed_of(done: Iterable[SentCommand], acked: Mapping[str, dict],
                 current: Mapping[str, RunControl]) -> list[tuple[SentCommand, dict]]:
    """The settled brakes among ``done`` that a worker acknowledged, each with its
    acknowledgement: applied, or answered otherwise and not overtaken since (a pause that
    reached a process already stopped answers "ignored": the stop is the news, not that)."""
    def stopped_since(s: SentCommand) -> bool:
        ctl = current.get(s.run_id)
        return overtaken(s, current) or (ctl is not None and ctl.state == "stopped" and
                                         ctl.command is not None and ctl.command.id != s.command_id)
    return [(s, acked[s.command_id]) for s in done if s.command_id in acked and
            (acked[s.command_id].get("status", "applied") == "applied" or not stopped_since(s))]


def answered_of(asked: Iterable[Command], acked: Mapping[str, dict],
                now: float) -> tuple[list[tuple[SentCommand, dict]], list[Command]]:
    """(the asked commands a worker answered, each with its answer; those unanswered for
    :data:`FORGET_AFTER`, to forget)."""
    answered, stale = [], []
    for c in asked:
        if c.id in acked:
            answered.append((SentCommand.of(c), acked[c.id]))
        elif now - c.ts > FORGET_AFTER:
            stale.append(c)
    return answered, stale


def complete(sent: SentCommand, answers: Mapping[int, dict], now: float, timeout: float) -> bool:
    """Whether the answers of a run to a command are all in, to be told: every rank of the run
    answered (its number of ranks as the answers give it, :func:`alerts.notices.world_of`; the
    first answer when they do not say), or ``timeout`` passed since the command was sent (the
    ranks still silent are then named)."""
    from alerts.notices import silent_ranks

    return not silent_ranks(answers) or now - sent.ts >= timeout


def ready_of(heard: list[tuple[SentCommand, dict[int, dict]]], now: float,
             timeout: float) -> tuple[list[tuple[SentCommand, dict[int, dict]]], set[str]]:
    """(the commands among ``heard`` whose answers are all in (:func:`complete`), to tell; the
    ids of the others, which wait where they are for their silent ranks)."""
    ready = [(s, a) for s, a in heard if complete(s, a, now, timeout)]
    told = {s.command_id for s, _ in ready}
    return ready, {s.command_id for s, _ in heard} - told


def with_answers(confirmed: list[tuple[SentCommand, dict]], audits: Mapping[str, list],
                 secret: str | None) -> list[tuple[SentCommand, dict[int, dict]]]:
    """Each confirmed brake with the answers of its run's ranks read from the run's audit
    entries (``audits``: run id -> entries, oldest first); the acknowledgement that settled it
    alone when the audit holds none (trimmed, or unread)."""
    from alerts.operator import answers_of

    out = []
    for s, ack in confirmed:
        answers = answers_of(audits.get(s.run_id) or [], s.command_id, secret)
        rank = ack.get("rank")
        out.append((s, answers or {rank if isinstance(rank, int) else -1: ack}))
    return out


class MemoryAcks:
    """For the embedded demo and tests: acks read from a :class:`MemoryControl`'s audit."""

    def __init__(self, control, secret: str | None = None):
        self.control, self.secret = control, secret
        self.pending: dict[str, Command] = {}
        self.escalated: dict[str, Command] = {}
        self.resends: dict[str, tuple[float, float]] = {}    # id -> (next re-send due, its wait)
        self.asked: dict[str, Command] = {}                   # adjusts and rollbacks not answered

    async def expect(self, cmd: Command) -> None:
        if cmd.action in BRAKES and cmd.id not in self.escalated:
            self.pending.setdefault(cmd.id, cmd)
        elif cmd.action in ASKED:
            self.asked.setdefault(cmd.id, cmd)

    async def check(self, now: float, timeout: float):
        cmds = [*self.pending.values(), *self.escalated.values(), *self.asked.values()]
        runs = {c.run_id for c in cmds}
        acked = _acked([e for r in runs for e in self.control.audit.get(r, []) if e.get("type") == "ack"],
                       self.secret)
        current = {r: await self.control.status(r) for r in runs}
        overdue, done = overdue_commands([SentCommand.of(c) for c in self.pending.values()], acked, now,
                                         timeout, current)
        answered, stale = answered_of(self.asked.values(), acked, now)
        heard = confirmed_of(done, acked, current) + answered
        audits = {s.run_id: self.control.audit.get(s.run_id, []) for s, _ in heard}
        confirmed, waiting = ready_of(with_answers(heard, audits, self.secret), now, timeout)
        told = {s.command_id for s, _ in confirmed}
        for s in [*overdue, *done]:
            if s.command_id in waiting:
                continue
            cmd = self.pending.pop(s.command_id)
            if s in overdue:
                self.escalated[s.command_id] = cmd
        _, late = overdue_commands([SentCommand.of(c) for c in self.escalated.values()], acked, now,
                                   float("inf"), current)
        for s in late:
            self.escalated.pop(s.command_id, None)
        for cid in [*(s.command_id for s, _ in answered if s.command_id in told), *(c.id for c in stale)]:
            del self.asked[cid]
        return Checked(overdue, late, confirmed)

    async def outstanding(self) -> list[Command]:
        return [*self.pending.values(), *self.escalated.values()]

    async def due_again(self, now: float, first: float, most: float) -> list[Command]:
        waiting = await self.outstanding()
        alive = {c.id for c in waiting}
        for cid in [c for c in self.resends if c not in alive]:
            del self.resends[cid]
        due = []
        for cmd in waiting:
            at, gap = self.resends.get(cmd.id, (cmd.ts + first, first))
            if at <= now:
                gap = next_resend(gap, first, most)
                self.resends[cmd.id] = (now + gap, gap)
                due.append(cmd)
        return due


#: stored commands RedisAcks keeps parsed, at most (then it parses afresh)
PARSED_MEMORY = 20_000

#: RedisAcks.expect: KEYS the pending brakes, their times sent; ARGV the command's id, the
#: command, its time. A brake already waiting keeps its first record and time.
_EXPECT = """
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[1])
return 0
"""


#: RedisAcks.due_again: KEYS the pending brakes, the escalated ones, their re-sends (hash id ->
#: "<next due> <its wait>"); ARGV now, the first wait, the longest. Answers the stored texts of
#: the brakes due, each marked re-sent (as :func:`next_resend` counts); a brake never re-sent
#: is due ``first`` after its ``ts`` (now, if its text cannot be read). Records of brakes no
#: longer outstanding are dropped.
_DUE_AGAIN = """
local now, first, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, live = {}, {}
for k = 1, 2 do
  local all = redis.call('HGETALL', KEYS[k])
  for i = 1, #all, 2 do
    local id, text = all[i], all[i + 1]
    live[id] = true
    local at, gap
    local rec = redis.call('HGET', KEYS[3], id)
    if rec then
      local sp = string.find(rec, ' ', 1, true)
      at, gap = tonumber(string.sub(rec, 1, sp - 1)), tonumber(string.sub(rec, sp + 1))
    else
      local ok, cmd = pcall(cjson.decode, text)
      local ts = ok and type(cmd) == 'table' and tonumber(cmd['ts']) or (now - first)
      at, gap = ts + first, first
    end
    if at <= now then
      gap = math.max(first, math.min(most, 2 * gap))
      redis.call('HSET', KEYS[3], id, string.format('%.17g %.17g', now + gap, gap))
      out[#out + 1] = text
    end
  end
end
for _, id in ipairs(redis.call('HKEYS', KEYS[3])) do
  if not live[id] then redis.call('HDEL', KEYS[3], id) end
end
return out
"""


class RedisAcks:
    """Brakes waiting for an acknowledgement, per application (``namespace`` is
    ``rlwatch:<app id>``, so two deployments sharing a Redis never escalate each other's):
    ``<ns>:brakes:pending`` (hash id -> command) with ``<ns>:brakes:sent`` (zset id -> time
    sent), and ``<ns>:brakes:escalated`` (hash). Acks are read from the workers'
    ``rlwatch:acks:<run>`` hashes (signed ones only, with a control secret). HDEL decides which
    worker escalates (or resolves) each brake, so it happens once; ``<ns>:brakes:resend`` (hash
    id -> next re-send and its wait, :data:`_DUE_AGAIN`) which worker re-sends it.
    ``<ns>:asked`` (hash id -> command) holds a rule's adjusts and rollbacks until answered."""

    def __init__(self, redis, namespace: str = "rlwatch", secret: str | None = None):
        self.redis, self.secret = redis, secret
        self.pending, self.sent = f"{namespace}:brakes:pending", f"{namespace}:brakes:sent"
        self.escalated = f"{namespace}:brakes:escalated"
        self.resends = f"{namespace}:brakes:resend"
        self.asked = f"{namespace}:asked"          # hash id -> an adjust or rollback not answered
        self._expect = redis.register_script(_EXPECT)
        self._due_again = redis.register_script(_DUE_AGAIN)
        self._parsed: dict[bytes, Command] = {}     # stored text -> the command (_load)

    async def expect(self, cmd: Command) -> None:
        if cmd.action in BRAKES:
            await self._expect(keys=[self.pending, self.sent], args=[cmd.id, cmd.model_dump_json(), cmd.ts])
        elif cmd.action in ASKED:
            await self.redis.hsetnx(self.asked, cmd.id, cmd.model_dump_json())

    def expect_on(self, pipe, cmd: Command) -> None:
        """:meth:`expect` queued on a pipeline of this tracker's Redis client (its script by
        SHA: :data:`scripts`, for :func:`alerts.control.pipelined`)."""
        if cmd.action in BRAKES:
            pipe.evalsha(self._expect.sha, 2, self.pending, self.sent, cmd.id, cmd.model_dump_json(), cmd.ts)
        elif cmd.action in ASKED:
            pipe.hsetnx(self.asked, cmd.id, cmd.model_dump_json())

    @property
    def scripts(self) -> tuple:
        return (self._expect,)

    async def _load(self, key: str, ids: list[str] | None = None) -> list[Command]:
        """The commands stored under ``key`` (those of ``ids`` only, when given), by
        :meth:`_parse`."""
        if ids is None:
            raw = list((await self.redis.hgetall(key)).values())
        else:
            raw = [r for r in (await self.redis.hmget(key, ids) if ids else []) if r is not None]
        return self._parse(raw)

    def _parse(self, raw: list[bytes]) -> list[Command]:
        """The commands of stored texts, each text parsed once (every tick reads every brake
        still outstanding, for a day when no worker answers): the commands returned are shared
        with later calls, read them only."""
        parsed = self._parsed
        out = []
        for r in raw:
            cmd = parsed.get(r)
            if cmd is None:
                if len(parsed) >= PARSED_MEMORY:
                    parsed.clear()
                cmd = parsed[r] = Command.model_validate_json(r)
            out.append(cmd)
        return out

    async def _context(self, cmds: list[Command]):
        """(the commands among ``cmds`` acknowledged, each of their runs' control state), read
        for every run in one round trip (a tick of a fleet with many brakes outstanding read
        two per run)."""
        from alerts.control import trusted

        ids: dict[str, list[str]] = {}
        for c in cmds:
            ids.setdefault(c.run_id, []).append(c.id)
        runs = sorted(ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for r in runs:
                pipe.hmget(acks_key(r), ids[r])
                pipe.get(state_key(r))
            got = await pipe.execute()
        acked: dict[str, dict] = {}
        current: dict[str, RunControl] = {}
        for k, r in enumerate(runs):
            acked.update(_acked([json.loads(v) for v in got[2 * k] if v is not None], self.secret))
            current[r] = trusted(r, got[2 * k + 1], self.secret)
        return acked, current

    async def check(self, now: float, timeout: float):
        due = [i.decode() if isinstance(i, bytes) else i
               for i in await self.redis.zrangebyscore(self.sent, "-inf", now)]
        async with self.redis.pipeline(transaction=False) as pipe:     # one round trip for the three
            pipe.hmget(self.pending, due or ["-"])
            pipe.hgetall(self.escalated)
            pipe.hgetall(self.asked)
            got_pending, got_escalated, got_asked = await pipe.execute()
        pending = self._parse([t for t in got_pending if t is not None] if due else [])
        escalated, asked = self._parse(list(got_escalated.values())), self._parse(list(got_asked.values()))
        if not pending and not escalated and not asked:
            return Checked([], [], [])
        acked, current = await self._context(pending + escalated + asked)
        by_id = {c.id: c for c in pending}
        overdue, done = overdue_commands([SentCommand.of(c) for c in pending], acked, now, timeout, current)
        answered, stale = answered_of(asked, acked, now)
        # what a run answered is told once all its ranks have (or after the timeout): until
        # then the command stays where it is, read again on the next check
        heard = confirmed_of(done, acked, current) + answered
        confirmed, waiting = ready_of(with_answers(heard, await self._audits(heard), self.secret), now, timeout)
        ready = {s.command_id for s, _ in confirmed}
        done = [s for s in done if s.command_id not in waiting and await self._forget(s.command_id)]  # one caller each
        mine = []
        for s in overdue:
            if await self.redis.hdel(self.pending, s.command_id):
                await self.redis.hset(self.escalated, s.command_id, by_id[s.command_id].model_dump_json())
                await self.redis.zrem(self.sent, s.command_id)
                mine.append(s)
        _, late = overdue_commands([SentCommand.of(c) for c in escalated], acked, now, float("inf"), current)
        resolved = [s for s in late if await self.redis.hdel(self.escalated, s.command_id)]
        for c in escalated:   # a day without an answer: stop re-sending (it was escalated long ago)
            if now - c.ts > FORGET_AFTER:
                await self.redis.hdel(self.escalated, c.id)
        asked_ids = {s.command_id for s, _ in answered}
        won = {s.command_id for s in done}
        for cid in sorted(asked_ids & ready):
            if await self.redis.hdel(self.asked, cid):     # one caller
                won.add(cid)
        if stale:
            await self.redis.hdel(self.asked, *[c.id for c in stale])
        return Checked(mine, resolved, [(s, a) for s, a in confirmed if s.command_id in won])

    async def _audits(self, confirmed: list) -> dict[str, list]:
        """The audit entries of the runs of ``confirmed`` since the earliest of their commands
        was sent, every rank's answer however many ranks a run has (one round trip; read while a
        command that a rank answered waits for the others' answers, within the timeout)."""
        from alerts.control import AUDIT_READ, audit_entries

        since: dict[str, float] = {}
        for s, _ in confirmed:
            since[s.run_id] = min(s.ts, since.get(s.run_id, s.ts))
        if not since:
            return {}
        runs = sorted(since)
        async with self.redis.pipeline(transaction=False) as pipe:
            for r in runs:
                pipe.xrange(audit_key(r), min=audit_since(since[r]), max="+", count=AUDIT_READ)
            got = await pipe.execute()
        return {r: audit_entries(entries) for r, entries in zip(runs, got)}

    async def _forget(self, command_id: str) -> bool:
        """Forget a settled brake; whether this call did (another worker's check may have)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.pending, command_id)
            pipe.zrem(self.sent, command_id)
            gone, _ = await pipe.execute()
        return bool(gone)

    async def outstanding(self) -> list[Command]:
        return await self._load(self.pending) + await self._load(self.escalated)

    async def unsettled(self) -> list[tuple[Command, bool]]:
        """The brakes no worker has acknowledged and no later decision overtook (a resume, a
        stop), each with whether it escalated: what an operator asks of a run's brake
        (``rlwatch status``). Read from the acknowledgements as they are now, not from the
        timer's last check (and without changing anything: a worker's tick escalates)."""
        pending, escalated = await self._load(self.pending), await self._load(self.escalated)
        if not pending and not escalated:
            return []
        acked, current = await self._context(pending + escalated)
        return [(c, k >= len(pending)) for k, c in enumerate(pending + escalated)
                if not settled(SentCommand.of(c), acked, current)]

    async def due_again(self, now: float, first: float, most: float) -> list[Command]:
        """One round trip: the outstanding brakes read, the due ones marked and returned."""
        return self._parse(await self._due_again(keys=[self.pending, self.escalated, self.resends],
                                                 args=[repr(now), repr(first), repr(most)]))

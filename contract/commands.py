"""Control commands of the public contract (contract.md, section 4). Pure.

A command travels from the monitor (or an operator) to the training workers of one run:
``pause``, ``resume``, ``stop``, ``rollback {to_step, checkpoint}``, ``adjust {param: factor}``
and ``snapshot``. The authoritative state of a run (``running|paused|stopped``, with the command
that set it) lives in Redis under :func:`state_key`; changes are published on
:func:`channel`; every command and acknowledgement is appended to :func:`audit_key`.

Commands can be signed with HMAC-SHA256 over their canonical JSON (``RLWATCH_CONTROL_SECRET``);
a worker that holds a secret rejects unsigned or forged commands.

What a worker obeys is decided by one pure function, :func:`refusal`: a command must be signed
(when a secret is set), for this run, issued after the worker's process started (a relaunch does
not inherit the brakes of the previous process, and a command captured earlier cannot be
replayed at it), not older than the last state change it applied, and, when it arrives live, sent
within :data:`FRESH_SECONDS`. The state a worker is in is derived only from such commands
(:func:`implied_state`), never from a bare ``state`` field. The monitor re-sends an
unacknowledged brake with the same ``id`` and ``ts`` and a new signed ``sent`` time; a worker
that has applied it already acknowledges it again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ACTIONS",
    "AUDIT_LENGTH",
    "AUDIT_SKEW",
    "FRESH_SECONDS",
    "SKEW_SECONDS",
    "STATE_ACTIONS",
    "Command",
    "RunControl",
    "ack_signature",
    "acks_key",
    "applied_key",
    "audit_key",
    "audit_since",
    "channel",
    "implied_state",
    "next_state",
    "pending_key",
    "refusal",
    "runs_key",
    "state_key",
]

Action = Literal["pause", "resume", "stop", "rollback", "adjust", "snapshot"]
ACTIONS: tuple[str, ...] = ("pause", "resume", "stop", "rollback", "adjust", "snapshot")
RunStateName = Literal["running", "paused", "stopped"]
STATE_ACTIONS: tuple[str, ...] = ("pause", "resume", "stop")

PREFIX = "rlwatch"

#: A command arriving live (pub/sub) must have been sent at most this long ago.
FRESH_SECONDS = 300.0
#: Clocks of the monitor and of training hosts may differ by this much.
SKEW_SECONDS = 5.0


def state_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}:state"


def pending_key(run_id: str) -> str:
    """Recent one-shot commands (adjust, rollback, snapshot) for workers that were away."""
    return f"{PREFIX}:run:{run_id}:oneshots"


def channel(run_id: str) -> str:
    return f"{PREFIX}:control:{run_id}"


def acks_key(run_id: str) -> str:
    """Acknowledgements of the run's workers: command id -> the latest ack (JSON)."""
    return f"{PREFIX}:acks:{run_id}"


def applied_key(command_id: str) -> str:
    """Marks a command the monitor side has applied (so applying it again changes nothing)."""
    return f"{PREFIX}:cmd:{command_id}"


def audit_key(run_id: str) -> str:
    return f"{PREFIX}:audit:{run_id}"


#: entries a run's audit stream keeps (trimmed approximately: Redis may keep a few more)
AUDIT_LENGTH = 10_000

#: how far the clock of the host that sent a command may run ahead of Redis's, whose clock
#: numbers the audit entries: the answers to a command are read from this long before it was sent
AUDIT_SKEW = 300.0


def audit_since(ts: float) -> str:
    """The first audit-stream id (``XRANGE`` start) that can hold an answer to a command sent
    at ``ts`` (seconds since the epoch, the sender's clock): Redis numbers entries by its own
    clock in milliseconds, so :data:`AUDIT_SKEW` earlier."""
    return str(max(0, int((ts - AUDIT_SKEW) * 1000)))


def runs_key() -> str:
    return f"{PREFIX}:runs"


class Command(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    run_id: str = Field(min_length=1)
    action: Action
    params: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    issuer: str = "operator"
    ts: float
    rule: str | None = None
    severity: str | None = None
    step: int | None = None
    sent: float | None = None         # when this copy was sent (a re-sent brake gets a new one)
    signature: str | None = None

    def canonical(self) -> bytes:
        data = self.model_dump(exclude={"signature"}, exclude_none=True)
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, secret: str | bytes | None, sent: float | None = None) -> "Command":
        """A copy signed with ``secret`` (unchanged without one); ``sent`` stamps the copy."""
        if sent is not None:
            self = self.model_copy(update={"sent": sent})
        if not secret:
            return self
        key = secret.encode() if isinstance(secret, str) else secret
        sig = hmac.new(key, self.canonical(), hashlib.sha256).hexdigest()
        return self.model_copy(update={"signature": sig})

    def verify(self, secret: str | bytes | None) -> bool:
        """True when no secret is required, or the signature matches it."""
        if not secret:
            return True
        if not self.signature:
            return False
        key = secret.encode() if isinstance(secret, str) else secret
        want = hmac.new(key, self.canonical(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(want, self.signature)


class RunControl(BaseModel):
    """The authoritative control state of a run."""

    run_id: str
    state: RunStateName = "running"
    command: Command | None = None
    updated: float | None = None


def implied_state(action: str) -> str | None:
    """The run state a pause, resume or stop sets; None for one-shot commands."""
    return {"pause": "paused", "resume": "running", "stop": "stopped"}.get(action)


def refusal(cmd: Command, *, run_id: str, secret: str | bytes | None, now: float, started_at: float,
            last_state_ts: float | None = None, live: bool = True,
            fresh: float = FRESH_SECONDS, skew: float = SKEW_SECONDS) -> str | None:
    """Why a worker of ``run_id`` (its process started at ``started_at``) must not obey ``cmd``,
    or None when it may. ``last_state_ts``: the ``ts`` of the last pause/resume/stop it applied.
    ``live``: the command arrived on the channel now (else it was read from the stored state or
    the list of one-shot commands, where only its issue time counts).

    >>> c = Command(run_id="r", action="pause", ts=100.0).signed("k")
    >>> refusal(c, run_id="r", secret="k", now=101.0, started_at=50.0) is None
    True
    >>> refusal(c, run_id="other", secret="k", now=101.0, started_at=50.0)
    'it is for run r'
    >>> refusal(c, run_id="r", secret="k", now=101.0, started_at=200.0)
    'it was issued before this process started'
    """
    if cmd.run_id != run_id:
        return f"it is for run {cmd.run_id}"
    if not cmd.verify(secret):
        return "it is unsigned or forged"
    # a stop from before this process is a stop of the previous launch: never inherited
    grace = 0.0 if cmd.action == "stop" else skew
    if cmd.ts < started_at - grace:
        return "it was issued before this process started"
    if cmd.ts > now + skew or (cmd.sent is not None and cmd.sent > now + skew):
        return "it is dated in the future"
    if live and (cmd.sent if cmd.sent is not None else cmd.ts) < now - fresh:
        return f"it was sent more than {fresh:.0f}s ago"
    if cmd.action in STATE_ACTIONS and last_state_ts is not None and cmd.ts < last_state_ts:
        return "a newer pause, resume or stop was applied already"
    return None


def ack_signature(ack: dict, secret: str | bytes | None) -> str | None:
    """HMAC-SHA256 of an acknowledgement's canonical JSON (its ``signature`` left out)."""
    if not secret:
        return None
    key = secret.encode() if isinstance(secret, str) else secret
    body = json.dumps({k: v for k, v in ack.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def next_state(current: str, action: str) -> str:
    """The run state after ``action``. A stopped run stays stopped until resumed."""
    if current == "stopped":   # only an explicit resume (an operator relaunching) clears a stop
        return "running" if action == "resume" else "stopped"
    return {"pause": "paused", "resume": "running", "stop": "stopped"}.get(action, current)

"""Control commands of the public contract (contract.md, section 4). Pure.

A command travels from the monitor (or an operator) to the training workers of one run:
``pause``, ``resume``, ``stop``, ``rollback {to_step, checkpoint}``, ``adjust {param: factor}``
and ``snapshot``. The authoritative state of a run (``running|paused|stopped``, with the command
that set it) lives in Redis under :func:`state_key`; changes are published on
:func:`channel`; every command and acknowledgement is appended to :func:`audit_key`.

Commands can be signed with HMAC-SHA256 over their canonical JSON (``RLWATCH_CONTROL_SECRET``);
a worker that holds a secret rejects unsigned or forged commands.
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
    "Command",
    "RunControl",
    "audit_key",
    "channel",
    "next_state",
    "pending_key",
    "runs_key",
    "state_key",
]

Action = Literal["pause", "resume", "stop", "rollback", "adjust", "snapshot"]
ACTIONS: tuple[str, ...] = ("pause", "resume", "stop", "rollback", "adjust", "snapshot")
RunStateName = Literal["running", "paused", "stopped"]

PREFIX = "rlwatch"


def state_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}:state"


def pending_key(run_id: str) -> str:
    """Recent one-shot commands (adjust, rollback, snapshot) for workers that were away."""
    return f"{PREFIX}:run:{run_id}:oneshots"


def channel(run_id: str) -> str:
    return f"{PREFIX}:control:{run_id}"


def audit_key(run_id: str) -> str:
    return f"{PREFIX}:audit:{run_id}"


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
    signature: str | None = None

    def canonical(self) -> bytes:
        data = self.model_dump(exclude={"signature"}, exclude_none=True)
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, secret: str | bytes | None) -> "Command":
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


def next_state(current: str, action: str) -> str:
    """The run state after ``action``. A stopped run stays stopped until resumed."""
    if current == "stopped":   # only an explicit resume (an operator relaunching) clears a stop
        return "running" if action == "resume" else "stopped"
    return {"pause": "paused", "resume": "running", "stop": "stopped"}.get(action, current)

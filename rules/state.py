"""The alert state machine, in the spirit of Prometheus' alerting rules. Pure.

One :class:`AlertState` per (rule, tier, rank) of a run::

    inactive --true--> pending --true for N steps and T seconds--> firing
    pending  --false--> inactive
    firing   --false for more than keep_firing_for steps--> inactive  (emits "resolved")
    firing   --still true escalate_after steps after firing--> escalated (emits once)

An unknown verdict (no data at this step) changes nothing. Steps and seconds are both counted:
the step numbers and timestamps come from the events, never from a clock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["AlertState", "Transition", "advance"]

Transition = Literal["firing", "resolved", "escalated"]


@dataclass
class AlertState:
    status: Literal["inactive", "pending", "firing"] = "inactive"
    onset_step: int | None = None
    onset_ts: float | None = None
    true_steps: int = 0
    false_steps: int = 0
    fired_step: int | None = None
    escalated: bool = False
    value: float | None = None
    threshold: float | None = None
    metric: str | None = None
    rank: int | None = None

    def to_state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, data: dict) -> "AlertState":
        return cls(**data)


def advance(s: AlertState, holds: bool | None, step: int, ts: float, *, for_steps: int = 1,
            for_seconds: float = 0.0, keep_firing_for: int = 0,
            escalate_after: int | None = None) -> Transition | None:
    """Move ``s`` by one evaluation; return the transition to announce, if any."""
    if holds is None:
        return None
    if holds:
        s.false_steps = 0
        if s.status == "inactive":
            s.status, s.onset_step, s.onset_ts, s.true_steps = "pending", step, ts, 0
        s.true_steps += 1
        if (s.status == "pending" and s.true_steps >= for_steps
                and ts - (s.onset_ts if s.onset_ts is not None else ts) >= for_seconds):
            s.status, s.fired_step = "firing", step
            return "firing"
        if (s.status == "firing" and escalate_after is not None and not s.escalated
                and step - (s.fired_step if s.fired_step is not None else step) >= escalate_after):
            s.escalated = True
            return "escalated"
        return None
    if s.status == "pending":
        s.status, s.onset_step, s.onset_ts, s.true_steps = "inactive", None, None, 0
        return None
    if s.status == "firing":
        s.false_steps += 1
        if s.false_steps > keep_firing_for:
            s.status, s.true_steps, s.false_steps, s.escalated = "inactive", 0, 0, False
            return "resolved"
    return None

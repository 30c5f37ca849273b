"""The alert state machine, in the spirit of Prometheus' alerting rules. Pure.

One :class:`AlertState` per (rule, tier, rank) of a run; every count is in training steps
(the step numbers of the events), so a run logging every 10 steps is judged like one logging
every step::

    inactive --true--> pending --true over N steps (and P points) and T seconds--> firing
    pending  --false--> inactive
    firing   --false for more than keep_firing_for steps--> inactive  (emits "resolved")
             (a step at which ``keep`` holds -- keep_firing_while -- is not false)
    firing   --still true escalate_after steps after firing--> escalated (emits once)

"True over N steps" is ``step - onset_step + 1 >= N`` at a true point, ``onset_step`` being the
step of the first true point; "and P points": the condition was true at P logged points in a
row (``for_points``: on a run logging every 10 steps, ``for: 3`` alone holds at the second
point, so a two-point transient would pass). An undecided verdict (no data at this step)
changes nothing. The step numbers and timestamps come from the events, never from a clock.
"""

from __future__ import annotations

from typing import Callable, Literal

__all__ = ["AlertState", "Transition", "advance"]

Transition = Literal["firing", "resolved", "escalated"]

_FIELDS = ("status", "onset_step", "onset_ts", "false_since", "fired_step", "escalated", "value",
           "threshold", "metric", "rank", "detail", "summary", "points", "adjusts")


class AlertState:
    __slots__ = _FIELDS

    def __init__(self, status: str = "inactive", onset_step: int | None = None,
                 onset_ts: float | None = None, false_since: int | None = None,
                 fired_step: int | None = None, escalated: bool = False,
                 value: float | None = None, threshold: float | None = None,
                 metric: str | None = None, rank: int | None = None, detail: str | None = None,
                 summary: str | None = None, points: int = 0, adjusts: int = 0):
        self.status = status
        self.onset_step = onset_step
        self.onset_ts = onset_ts
        self.false_since = false_since   # first step of the current false spell while firing
        self.fired_step = fired_step
        self.escalated = escalated
        # what the alert showed when it last changed state (for the resolved notice)
        self.value = value
        self.threshold = threshold
        self.metric = metric
        self.rank = rank
        self.detail = detail
        self.summary = summary
        self.points = points             # true points in a row while pending
        self.adjusts = adjusts           # the tier's adjusts sent to the run (kept while inactive)

    def to_state(self) -> dict:
        return {k: getattr(self, k) for k in _FIELDS}

    @classmethod
    def from_state(cls, data: dict) -> "AlertState":
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})

    def __eq__(self, other) -> bool:
        return isinstance(other, AlertState) and self.to_state() == other.to_state()

    __hash__ = None

    def __repr__(self) -> str:
        return f"AlertState({self.to_state()})"


def advance(s: AlertState, holds: bool | None, step: int, ts: float, *, for_steps: int = 1,
            for_seconds: float = 0.0, keep_firing_for: int = 0,
            escalate_after: int | None = None, for_points: int = 1,
            keep: Callable[[], bool | None] | None = None) -> Transition | None:
    """Move ``s`` by one evaluation; return the transition to announce, if any. ``keep``
    (read only while firing and false) keeps a firing alert from resolving while it holds."""
    if holds is None:
        return None
    if holds:
        s.false_since = None
        if s.status == "inactive":
            s.status, s.onset_step, s.onset_ts, s.points = "pending", step, ts, 0
        if s.status == "pending":
            s.points += 1
            if (step - s.onset_step + 1 >= for_steps and s.points >= for_points
                    and ts - (s.onset_ts if s.onset_ts is not None else ts) >= for_seconds):
                s.status, s.fired_step, s.points = "firing", step, 0
                return "firing"
            return None
        if (escalate_after is not None and not s.escalated
                and step - (s.fired_step if s.fired_step is not None else step) >= escalate_after):
            s.escalated = True
            return "escalated"
        return None
    if s.status == "pending":
        s.status, s.onset_step, s.onset_ts, s.points = "inactive", None, None, 0
        return None
    if s.status == "firing":
        if keep is not None and keep():
            s.false_since = None
            return None
        if s.false_since is None:
            s.false_since = step
        if step - s.false_since + 1 > keep_firing_for:
            s.status, s.false_since, s.escalated = "inactive", None, False
            return "resolved"
    return None

"""Aggregation groups: which group an alert joins on a route, and when the group's next
notification (or repeat) is due. In the spirit of Alertmanager's ``dispatch/dispatch.go``. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from alerts.matchers import field_value
from contract.alert import Alert

if TYPE_CHECKING:
    from alerts.routing import Route

__all__ = ["GroupClock", "due", "group_key", "repeat_due"]


def group_key(route: Route, alert: Alert) -> str:
    """The aggregation group of ``alert`` on ``route``: the route and its group_by values."""
    return route.id + "|" + ",".join(f"{n}={field_value(alert, n)}" for n in route.group_by)


@dataclass
class GroupClock:
    """What a group remembers between notifications (kept in Redis by the outbox)."""

    route: str
    run_id: str
    created_ts: float
    created_step: int
    last_flush_ts: float | None = None
    last_flush_step: int | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupClock:
        return cls(**{k: d.get(k) for k in ("route", "run_id", "created_ts", "created_step",
                                             "last_flush_ts", "last_flush_step")})


def due(clock: GroupClock, route: Route) -> tuple[float | None, int | None]:
    """(earliest time, earliest step) at which the group's pending alerts may be sent.

    Before the first notification the group waits ``group_wait`` from its creation; afterwards
    ``group_interval`` from the last one. A wait in steps is measured on the steps of the run's
    alerts. ``None`` means no constraint in that unit.
    """
    if clock.last_flush_ts is None:
        wait, base_ts, base_step = route.group_wait, clock.created_ts, clock.created_step
    else:
        wait, base_ts, base_step = route.group_interval, clock.last_flush_ts, clock.last_flush_step
    if wait.zero:
        return base_ts, None
    if wait.unit == "steps":
        return None, int((base_step or 0) + wait.value)
    return base_ts + wait.value, None


def repeat_due(clock: GroupClock, route: Route, now: float, run_step: int | None) -> bool:
    """True when a group that has notified and still has firing alerts should repeat them."""
    r = route.repeat_interval
    if r.zero or clock.last_flush_ts is None:
        return False
    if r.unit == "steps":
        return run_step is not None and clock.last_flush_step is not None and \
            run_step - clock.last_flush_step >= r.value
    return now - clock.last_flush_ts >= r.value

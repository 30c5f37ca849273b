"""Where an alert goes: the routing tree, in the spirit of Alertmanager's
``dispatch/route.go``. Pure.

A route matches an alert when its ``match`` does (see :mod:`alerts.matchers`). Matching descends
the tree: the deepest matching routes win, the first matching child ends the search unless it
has ``continue: true``; a route none of whose children match takes the alert itself. A child
inherits every option it does not set from its parent. A :class:`Routing` is the whole
validated configuration: the tree, the inhibition rules (:mod:`alerts.inhibition`), the per-run
enforcement (:class:`alerts.actions.EnforcementPolicy`) and the brake's acknowledgement timeout.
It comes from a routes file (:mod:`alerts.routes_file`) or, without one, from
:meth:`Routing.default`: every alert goes at once to every configured receiver, nothing is
grouped, inhibited or repeated. When a group's notifications are due: :mod:`alerts.grouping`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from alerts.actions import EnforcementPolicy
from alerts.inhibition import InhibitRule
from alerts.intervals import NO_WAIT, Interval
from alerts.matchers import Matchers
from contract.alert import Alert

__all__ = ["ALL_RECEIVERS", "Route", "Routing"]

ALL_RECEIVERS = "*"


@dataclass(frozen=True)
class Route:
    """A node of the routing tree with its options resolved (inherited where unset)."""

    id: str
    receivers: tuple[str, ...]
    matchers: Matchers = Matchers()
    group_by: tuple[str, ...] = ("run", "rule")
    group_wait: Interval = NO_WAIT
    group_interval: Interval = NO_WAIT
    repeat_interval: Interval = NO_WAIT
    continue_: bool = False
    routes: tuple[Route, ...] = ()

    def match(self, alert: Alert) -> list[Route]:
        """The routes that take ``alert`` (route.go's ``Match``): [] if this one does not match."""
        if not self.matchers.matches(alert):
            return []
        out: list[Route] = []
        for child in self.routes:
            got = child.match(alert)
            out.extend(got)
            if got and not child.continue_:
                break
        return out or [self]

    def walk(self) -> Iterable[Route]:
        yield self
        for c in self.routes:
            yield from c.walk()


@dataclass(frozen=True)
class Routing:
    """A validated routing configuration, ready to use."""

    root: Route
    inhibit_rules: tuple[InhibitRule, ...] = ()
    policy: EnforcementPolicy = EnforcementPolicy()
    ack_timeout: float = 60.0
    receivers: tuple = ()                    # the receivers the routes file defines (ReceiverSpec)
    routes_by_id: dict[str, Route] = field(default_factory=dict, compare=False)

    @classmethod
    def default(cls, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
                ack_timeout: float = 60.0) -> Routing:
        """Today's behaviour: everything to every receiver, at once, nothing muted."""
        root = Route("root", tuple(dict.fromkeys(receivers)))
        return cls(root, (), EnforcementPolicy((), frozenset(advisory)), ack_timeout, (), {"root": root})

    def routes_for(self, alert: Alert) -> list[Route]:
        return self.root.match(alert)

    def targets(self, alert: Alert) -> list[tuple[Route, str]]:
        """(route, receiver) pairs for ``alert``; a receiver reached twice counts once."""
        seen: set[str] = set()
        out = []
        for r in self.routes_for(alert):
            for name in r.receivers:
                if name not in seen:
                    seen.add(name)
                    out.append((r, name))
        return out

"""Where an alert goes, when, and whether at all: the routing tree, grouping, inhibition and
per-run enforcement, in the spirit of Alertmanager's ``dispatch/route.go``. Pure.

The configuration is a YAML file (``RLWATCH_ROUTES`` / ``rlwatch worker --routes``)::

    receivers:                        # extra receivers; those configured by the environment
      - name: slack-oncall            # (console, slack-webhook, slack-bot, webhook, alertmanager,
        type: slack_bot               #  pagerduty) exist already under those names
        channel: "#rl-oncall"
        token: ${SLACK_ONCALL_TOKEN}  # ${VAR} is read from the environment
    route:
      receiver: slack-webhook         # the root route; without it, every configured receiver
      group_by: [run, rule]
      group_wait: 0                   # seconds ("30s", "5m") or steps ("20 steps")
      group_interval: 5m
      repeat_interval: 4h
      routes:
        - match: {severity: ">=red"}
          receiver: [pagerduty, slack-oncall]
          continue: true              # keep looking at the siblings after this one matched
        - match: {run: "exp-*"}
          receiver: webhook
          group_wait: 20 steps
    inhibit_rules:                    # omitted: a black or red alert of a run mutes the run's
      - source: {severity: black}     # lower tiers (the two rules shown here and below)
        target: {severity: "<black"}
        equal: [run]
    enforcement:                      # the first entry matching run (and rule) decides which
      - runs: "exp-*"                 # actions stay advisory; no match: RLWATCH_ADVISORY
        advisory: [pause, stop]
    ack_timeout: 60                   # seconds before an unacknowledged pause/stop escalates

A route matches an alert when its ``match`` does (see :mod:`alerts.matchers`). Matching descends
the tree: the deepest matching routes win, the first matching child ends the search unless it
has ``continue: true``; a route none of whose children match takes the alert itself. A child
inherits every option it does not set from its parent.

No file at all keeps the behaviour of a bare worker: every alert goes at once to every
configured receiver, nothing is grouped, inhibited or repeated.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from alerts.actions import COMMAND_ACTIONS
from alerts.matchers import Matchers, field_value
from contract.alert import Alert
from contract.yaml_lines import line_of, parse_yaml

__all__ = [
    "ALL_RECEIVERS",
    "DEFAULT_INHIBIT_RULES",
    "EnforcementPolicy",
    "GroupClock",
    "InhibitRule",
    "Interval",
    "ReceiverSpec",
    "Route",
    "RoutesFileError",
    "Routing",
    "RoutingSpec",
    "due",
    "group_key",
    "inhibited_by",
    "load_routes",
    "load_routes_text",
    "parse_interval",
]

ALL_RECEIVERS = "*"


class RoutesFileError(ValueError):
    """A routes file that cannot be used; the message names the file, line and field."""


# -- intervals --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    """A wait in seconds (``unit="s"``) or in training steps (``unit="steps"``)."""

    value: float
    unit: Literal["s", "steps"] = "s"

    @property
    def zero(self) -> bool:
        return self.value <= 0

    def __str__(self) -> str:
        return f"{self.value:g} steps" if self.unit == "steps" else f"{self.value:g}s"


_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
          "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


def parse_interval(value: Any) -> Interval:
    """``30`` / ``"30s"`` / ``"5m"`` / ``"2h"`` (seconds) or ``"50 steps"``.

    >>> parse_interval("5m"), parse_interval("20 steps"), parse_interval(0)
    (Interval(value=300.0, unit='s'), Interval(value=20.0, unit='steps'), Interval(value=0.0, unit='s'))
    """
    if isinstance(value, Interval):
        return value
    if isinstance(value, bool):
        raise ValueError("an interval is a number of seconds or a string like '5m' or '20 steps'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"an interval cannot be negative, got {value}")
        return Interval(float(value))
    if not isinstance(value, str):
        raise ValueError(f"an interval is a number or a string, got {type(value).__name__}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
    if not m:
        raise ValueError(f"cannot read interval {value!r} (examples: 30, '30s', '5m', '2h', '20 steps')")
    n, unit = float(m.group(1)), m.group(2)
    if unit in ("step", "steps"):
        return Interval(n, "steps")
    if unit == "":
        return Interval(n)
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in interval {value!r} (s, m, h, d or steps)")
    return Interval(n * _UNITS[unit])


# -- the file's schema ------------------------------------------------------------------------

def _matchers(v: Any) -> dict:
    Matchers.parse(v)
    return v or {}


class RouteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    receiver: str | list[str] | None = None
    match: dict[str, Any] = Field(default_factory=dict)
    group_by: list[str] | None = None
    group_wait: Any = None
    group_interval: Any = None
    repeat_interval: Any = None
    continue_: bool = Field(False, alias="continue")
    routes: list[RouteSpec] = Field(default_factory=list)

    @field_validator("match")
    @classmethod
    def _match(cls, v: Any) -> Any:
        return _matchers(v)

    @field_validator("group_wait", "group_interval", "repeat_interval")
    @classmethod
    def _interval(cls, v: Any) -> Any:
        return None if v is None else parse_interval(v)

    @field_validator("receiver")
    @classmethod
    def _known(cls, v: Any, info: ValidationInfo) -> Any:
        known = (info.context or {}).get("receivers")
        names = [v] if isinstance(v, str) else (v or [])
        if known is not None:
            for name in names:
                if name != ALL_RECEIVERS and name not in known:
                    raise ValueError(f"unknown receiver {name!r} (configured: {', '.join(known) or 'none'})")
        return v


class ReceiverSpec(BaseModel):
    """A receiver defined in the routes file (in addition to those the environment configures)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    type: Literal["console", "slack_webhook", "slack_bot", "webhook", "alertmanager", "pagerduty"]
    url: str | None = None
    token: str | None = None
    channel: str | None = None
    secret: str | None = None
    routing_key: str | None = None
    api_url: str | None = None

    @field_validator("url", "token", "channel", "secret", "routing_key", "api_url")
    @classmethod
    def _expand(cls, v: str | None) -> str | None:
        if v is None:
            return v

        def sub(m: re.Match) -> str:
            if m.group(1) not in os.environ:
                raise ValueError(f"environment variable {m.group(1)} is not set")
            return os.environ[m.group(1)]

        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, v)


class InhibitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    equal: list[str] = Field(default_factory=lambda: ["run"])

    @field_validator("source", "target")
    @classmethod
    def _match(cls, v: Any) -> Any:
        return _matchers(v)


class EnforcementSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runs: str | list[str] = "*"
    rules: str | list[str] = "*"
    advisory: list[str] | Literal["all", "none"] = Field(default_factory=list)

    @field_validator("advisory")
    @classmethod
    def _actions(cls, v: Any) -> Any:
        if isinstance(v, list):
            bad = sorted(set(v) - set(COMMAND_ACTIONS))
            if bad:
                raise ValueError(f"unknown actions {', '.join(bad)} (one of {', '.join(COMMAND_ACTIONS)}, or 'all')")
        return v


class RoutingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    receivers: list[ReceiverSpec] = Field(default_factory=list)
    route: RouteSpec = Field(default_factory=RouteSpec)
    inhibit_rules: list[InhibitSpec] | None = None
    enforcement: list[EnforcementSpec] = Field(default_factory=list)
    ack_timeout: float | None = Field(None, gt=0)

    @field_validator("receivers")
    @classmethod
    def _unique(cls, v: list[ReceiverSpec]) -> list[ReceiverSpec]:
        names = [r.name for r in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"receiver names must be unique: {', '.join(dup)}")
        return v


# -- the routing tree -------------------------------------------------------------------------

NO_WAIT = Interval(0.0)


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

    @classmethod
    def build(cls, spec: RouteSpec, receivers: Iterable[str], parent: Route | None = None,
              id: str = "root") -> Route:
        names = tuple(receivers)
        if spec.receiver is None:
            recv = parent.receivers if parent else names
        else:
            want = [spec.receiver] if isinstance(spec.receiver, str) else list(spec.receiver)
            recv = names if ALL_RECEIVERS in want else tuple(dict.fromkeys(want))
        node = cls(
            id=id, receivers=recv, matchers=Matchers.parse(spec.match),
            group_by=tuple(spec.group_by) if spec.group_by is not None else (parent.group_by if parent else ("run", "rule")),
            group_wait=spec.group_wait or (parent.group_wait if parent else NO_WAIT),
            group_interval=spec.group_interval or (parent.group_interval if parent else NO_WAIT),
            repeat_interval=spec.repeat_interval or (parent.repeat_interval if parent else NO_WAIT),
            continue_=spec.continue_,
        )
        children = tuple(cls.build(c, names, node, f"{id}.{i}") for i, c in enumerate(spec.routes))
        return cls(**{**node.__dict__, "routes": children})

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


def group_key(route: Route, alert: Alert) -> str:
    """The aggregation group of ``alert`` on ``route``: the route and its group_by values."""
    return route.id + "|" + ",".join(f"{n}={field_value(alert, n)}" for n in route.group_by)


# -- grouping: when a group's next notification is due -----------------------------------------

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


# -- inhibition -------------------------------------------------------------------------------

@dataclass(frozen=True)
class InhibitRule:
    """While an alert matching ``source`` fires, alerts matching ``target`` with the same
    values of ``equal`` are muted (their commands still go out: only notifications are muted)."""

    source: Matchers
    target: Matchers
    equal: tuple[str, ...] = ("run",)

    @classmethod
    def of(cls, spec: InhibitSpec) -> InhibitRule:
        return cls(Matchers.parse(spec.source), Matchers.parse(spec.target), tuple(spec.equal))


#: A black or red alert of a run mutes the run's lower tiers.
DEFAULT_INHIBIT_RULES: tuple[InhibitRule, ...] = (
    InhibitRule(Matchers.parse({"severity": "black"}), Matchers.parse({"severity": "<black"})),
    InhibitRule(Matchers.parse({"severity": "red"}), Matchers.parse({"severity": "<red"})),
)


def inhibited_by(alert: Alert, active: Iterable[Alert], rules: Iterable[InhibitRule]) -> Alert | None:
    """The firing alert that mutes ``alert``, or None. Only firing alerts are muted; a
    resolved notice follows its firing one (sent if and only if the firing was)."""
    if alert.state != "firing":
        return None
    rules = [r for r in rules if r.target.matches(alert)]
    if not rules:
        return None
    for src in active:
        if src.state != "firing" or src.fingerprint == alert.fingerprint:
            continue
        for r in rules:
            if r.source.matches(src) and all(field_value(src, n) == field_value(alert, n) for n in r.equal):
                return src
    return None


# -- per-run enforcement ----------------------------------------------------------------------

@dataclass(frozen=True)
class EnforcementPolicy:
    """Which of a rule's actions stay advisory for a run: the first entry matching the run and
    the rule decides; no entry matching, ``default`` (``RLWATCH_ADVISORY``)."""

    entries: tuple[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]], ...] = ()
    default: frozenset[str] = frozenset()

    @classmethod
    def of(cls, specs: Iterable[EnforcementSpec], default: frozenset[str] = frozenset()) -> EnforcementPolicy:
        entries = []
        for s in specs:
            runs = (s.runs,) if isinstance(s.runs, str) else tuple(s.runs)
            rules = (s.rules,) if isinstance(s.rules, str) else tuple(s.rules)
            adv = (frozenset(COMMAND_ACTIONS) if s.advisory == "all" else
                   frozenset() if s.advisory == "none" else frozenset(s.advisory))
            entries.append((runs, rules, adv))
        return cls(tuple(entries), frozenset(default))

    def advisory_for(self, run_id: str, rule: str) -> frozenset[str]:
        for runs, rules, adv in self.entries:
            if any(fnmatch.fnmatchcase(run_id, p) for p in runs) and \
                    any(fnmatch.fnmatchcase(rule, p) for p in rules):
                return adv
        return self.default


# -- the whole configuration ------------------------------------------------------------------

@dataclass(frozen=True)
class Routing:
    """A validated routing configuration, ready to use."""

    root: Route
    inhibit_rules: tuple[InhibitRule, ...] = ()
    policy: EnforcementPolicy = EnforcementPolicy()
    ack_timeout: float = 60.0
    receivers: tuple[ReceiverSpec, ...] = ()
    routes_by_id: dict[str, Route] = field(default_factory=dict, compare=False)

    @classmethod
    def default(cls, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
                ack_timeout: float = 60.0) -> Routing:
        """Today's behaviour: everything to every receiver, at once, nothing muted."""
        return cls.of(RoutingSpec(inhibit_rules=[]), receivers, advisory, ack_timeout)

    @classmethod
    def of(cls, spec: RoutingSpec, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
           ack_timeout: float = 60.0) -> Routing:
        """``advisory`` and ``ack_timeout`` apply where the file does not say otherwise."""
        names = list(dict.fromkeys([*receivers, *(r.name for r in spec.receivers)]))
        root = Route.build(spec.route, names)
        inhibit = DEFAULT_INHIBIT_RULES if spec.inhibit_rules is None else \
            tuple(InhibitRule.of(s) for s in spec.inhibit_rules)
        return cls(root, inhibit, EnforcementPolicy.of(spec.enforcement, advisory),
                   spec.ack_timeout or ack_timeout, tuple(spec.receivers), {r.id: r for r in root.walk()})

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


def load_routes_text(text: str, receivers: Iterable[str], source: str = "<routes>",
                     advisory: frozenset[str] = frozenset(), ack_timeout: float = 60.0) -> Routing:
    """Parse and validate a routes file; ``receivers`` are those the environment configured."""
    node, data = parse_yaml(text, source, RoutesFileError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RoutesFileError(f"{source}:1: a routes file is a mapping (route:, receivers:, ...), "
                              f"got {type(data).__name__}")
    names = list(receivers)
    extra = [r.get("name") for r in data.get("receivers") or [] if isinstance(r, dict)]
    try:
        spec = RoutingSpec.model_validate(data, context={"receivers": [*names, *[e for e in extra if e]]})
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False)[:8]:
            loc = tuple(err["loc"])
            path = ".".join(str(p) for p in loc if not str(p).startswith(("function-", "literal[")))
            path = path.replace("continue_", "continue")
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}:{line_of(node, loc) or '?'}: {path}: {msg}")
        raise RoutesFileError("\n".join(lines)) from None
    return Routing.of(spec, names, advisory, ack_timeout)


def load_routes(path: str | Path, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
                ack_timeout: float = 60.0) -> Routing:
    p = Path(path)
    if not p.is_file():
        raise RoutesFileError(f"{p}: no such routes file")
    return load_routes_text(p.read_text(), receivers, str(p), advisory, ack_timeout)

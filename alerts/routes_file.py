"""The routes file: its schema, its validation (errors name the file, line and field) and the
:class:`alerts.routing.Routing` it describes. Pure (reading the file aside).

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

How the tree is matched: :mod:`alerts.routing`. No file at all keeps the behaviour of a bare
worker (:meth:`alerts.routing.Routing.default`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from alerts.actions import COMMAND_ACTIONS, EnforcementPolicy
from alerts.inhibition import DEFAULT_INHIBIT_RULES, InhibitRule
from alerts.intervals import NO_WAIT, parse_interval
from alerts.matchers import Matchers
from alerts.routing import ALL_RECEIVERS, Route, Routing
from contract.yaml_lines import line_of, parse_yaml

__all__ = [
    "EnforcementSpec",
    "InhibitSpec",
    "ReceiverSpec",
    "RouteSpec",
    "RoutesFileError",
    "RoutingSpec",
    "build_route",
    "load_routes",
    "load_routes_text",
    "routing_of",
]


class RoutesFileError(ValueError):
    """A routes file that cannot be used; the message names the file, line and field."""


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


def build_route(spec: RouteSpec, receivers: Iterable[str], parent: Route | None = None,
                id: str = "root") -> Route:
    """The tree of ``spec`` with every option resolved (a child inherits what it does not set)."""
    names = tuple(receivers)
    if spec.receiver is None:
        recv = parent.receivers if parent else names
    else:
        want = [spec.receiver] if isinstance(spec.receiver, str) else list(spec.receiver)
        recv = names if ALL_RECEIVERS in want else tuple(dict.fromkeys(want))
    node = Route(
        id=id, receivers=recv, matchers=Matchers.parse(spec.match),
        group_by=tuple(spec.group_by) if spec.group_by is not None else (parent.group_by if parent else ("run", "rule")),
        group_wait=spec.group_wait or (parent.group_wait if parent else NO_WAIT),
        group_interval=spec.group_interval or (parent.group_interval if parent else NO_WAIT),
        repeat_interval=spec.repeat_interval or (parent.repeat_interval if parent else NO_WAIT),
        continue_=spec.continue_,
    )
    children = tuple(build_route(c, names, node, f"{id}.{i}") for i, c in enumerate(spec.routes))
    return Route(**{**node.__dict__, "routes": children})


def routing_of(spec: RoutingSpec, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
               ack_timeout: float = 60.0) -> Routing:
    """The :class:`Routing` of a validated file; ``advisory`` and ``ack_timeout`` apply where
    the file does not say otherwise."""
    names = list(dict.fromkeys([*receivers, *(r.name for r in spec.receivers)]))
    root = build_route(spec.route, names)
    inhibit = DEFAULT_INHIBIT_RULES if spec.inhibit_rules is None else tuple(
        InhibitRule(Matchers.parse(s.source), Matchers.parse(s.target), tuple(s.equal)) for s in spec.inhibit_rules)
    entries = []
    for s in spec.enforcement:
        runs = (s.runs,) if isinstance(s.runs, str) else tuple(s.runs)
        rules = (s.rules,) if isinstance(s.rules, str) else tuple(s.rules)
        adv = (frozenset(COMMAND_ACTIONS) if s.advisory == "all" else
               frozenset() if s.advisory == "none" else frozenset(s.advisory))
        entries.append((runs, rules, adv))
    return Routing(root, inhibit, EnforcementPolicy(tuple(entries), frozenset(advisory)),
                   spec.ack_timeout or ack_timeout, tuple(spec.receivers), {r.id: r for r in root.walk()})


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
    return routing_of(spec, names, advisory, ack_timeout)


def load_routes(path: str | Path, receivers: Iterable[str], advisory: frozenset[str] = frozenset(),
                ack_timeout: float = 60.0) -> Routing:
    p = Path(path)
    if not p.is_file():
        raise RoutesFileError(f"{p}: no such routes file")
    return load_routes_text(p.read_text(), receivers, str(p), advisory, ack_timeout)

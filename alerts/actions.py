"""From a firing alert to control commands. Pure.

Each action of a rule is *enforced* (a command is sent to the run's workers) or *advisory*
(the alert says what the monitor would do, nobody is stopped). ``notify`` is never a command.
Which actions stay advisory may depend on the run and the rule (:class:`EnforcementPolicy`, from
the ``enforcement:`` list of a routes file).
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field

from contract.alert import Alert
from contract.commands import Command

__all__ = ["COMMAND_ACTIONS", "Enforcement", "EnforcementPolicy", "command_id", "commands_for"]

COMMAND_ACTIONS = ("pause", "stop", "rollback", "adjust", "snapshot")


@dataclass(frozen=True)
class Enforcement:
    """Which actions become commands. ``advisory`` actions are only reported."""

    advisory: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, text: str | None) -> "Enforcement":
        """From a comma list such as ``"adjust,rollback"`` (``"all"`` = everything advisory)."""
        if not text:
            return cls()
        names = {t.strip() for t in text.split(",") if t.strip()}
        if "all" in names:
            names = set(COMMAND_ACTIONS)
        unknown = names - set(COMMAND_ACTIONS)
        if unknown:
            raise ValueError(f"unknown advisory actions: {', '.join(sorted(unknown))}")
        return cls(frozenset(names))


@dataclass(frozen=True)
class EnforcementPolicy:
    """Which of a rule's actions stay advisory for a run: the first entry matching the run and
    the rule decides; no entry matching, ``default`` (``RLWATCH_ADVISORY``)."""

    entries: tuple[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]], ...] = ()
    default: frozenset[str] = frozenset()

    def advisory_for(self, run_id: str, rule: str) -> frozenset[str]:
        for runs, rules, adv in self.entries:
            if any(fnmatch.fnmatchcase(run_id, p) for p in runs) and \
                    any(fnmatch.fnmatchcase(rule, p) for p in rules):
                return adv
        return self.default


def may_command(alert: Alert) -> bool:
    """Whether ``alert`` can send any command (a firing alert with a command action): the
    cheap test before planning them (:func:`commands_for` gives none for any other)."""
    return alert.state == "firing" and any(a in COMMAND_ACTIONS for a in alert.actions)


def command_id(key: str, action: str) -> str:
    """The id of the ``action`` command an alert of delivery key ``key`` sends (the same each
    time it is handled, so a worker applies it once; an incident names its commands by it)."""
    return hashlib.sha256(f"{key}|{action}".encode()).hexdigest()[:32]


def commands_for(alert: Alert, now: float, enforcement: Enforcement = Enforcement(),
                 secret: str | None = None, key: str | None = None) -> list[Command]:
    """The commands a firing alert sends (in order: stop before pause before the rest).

    With ``key`` (the alert's delivery key) each command's id is derived from it, so handling
    the same alert again (a redelivery after a crash) sends the same commands, which workers
    apply once."""
    if alert.state != "firing":
        return []
    wanted = [a for a in alert.actions if a in COMMAND_ACTIONS and a not in enforcement.advisory]
    if "stop" in wanted and "pause" in wanted:
        wanted.remove("pause")
    order = {"stop": 0, "pause": 1, "rollback": 2, "adjust": 3, "snapshot": 4}
    out = []
    for action in sorted(wanted, key=order.__getitem__):
        params: dict = {}
        if action == "adjust":
            if not alert.adjust:
                continue
            params = dict(alert.adjust)
        elif action == "rollback":
            if not alert.rollback_to:
                continue  # no checkpoint reported before the onset: nothing to roll back to
            params = {"to_step": alert.rollback_to["step"], "checkpoint": alert.rollback_to["checkpoint"]}
        ids = {"id": command_id(key, action)} if key else {}
        cmd = Command(**ids, run_id=alert.run_id, action=action, params=params, ts=now,
                      reason=f"{alert.rule} ({alert.severity}): {alert.summary}",
                      issuer=f"rule:{alert.rule}", rule=alert.rule, severity=alert.severity,
                      step=alert.step)
        out.append(cmd.signed(secret))
    return out

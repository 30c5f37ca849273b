"""One-off notices: news about a run's brake, not about its health. Pure.

Two kinds, each an :class:`~contract.alert.Alert` of severity ``info`` with a rule of its own,
so that a routes file routes them like any alert (``rule: operator_command``,
``rule: control_acknowledged``, ``command: pause`` ...):

* ``operator_command`` (:func:`alerts.operator.operator_notice`): an operator sent a run a
  command by hand (``rlwatch pause`` ..., the dashboard's buttons);
* ``control_acknowledged`` (:func:`acknowledged_notice`): a worker acknowledged a brake the
  monitor pulled, so the people who saw the alert learn that the run is in fact paused (or
  stopped), and when, rather than guessing from the dashboard or waiting for silence.

A notice never resolves and never repeats: it goes to the receivers that take one-off notices
(:func:`takes_notices`: Slack, webhooks; not the console, nor Alertmanager and PagerDuty, which
keep an alert open until it resolves), through the outbox, due at once, in a group of its own
(:func:`notice_group`), so it is retried like any notification and muted by a silence that
matches it; no alert inhibits it (the red alert that pulled a brake must not mute the news that
the brake holds). Its identity is its command's id (:func:`notice_fingerprint`): a receiver that
drops repeats (a webhook's ``Idempotency-Key``) drops no other command's notice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from contract.alert import Alert

__all__ = ["ACKNOWLEDGED_RULE", "NOTICE_RULES", "OPERATOR_RULE", "acknowledged_notice", "is_notice",
           "notice_fingerprint", "notice_group", "takes_notices"]

#: the rule name of an operator's notice
OPERATOR_RULE = "operator_command"
#: the rule name of the notice that a worker acknowledged a brake the monitor pulled
ACKNOWLEDGED_RULE = "control_acknowledged"
NOTICE_RULES = frozenset({OPERATOR_RULE, ACKNOWLEDGED_RULE})

#: seconds a worker's clock may run ahead of the monitor's before its acknowledgement's time is
#: not believed
CLOCK_SLACK = 5.0
#: what a run is once a worker applied each brake
_STATE_AFTER = {"pause": "paused", "stop": "stopped"}


def is_notice(alert: Alert) -> bool:
    return alert.rule in NOTICE_RULES


def takes_notices(notifier: Any) -> bool:
    """Whether a notifier takes one-off notices (its ``takes_notices``)."""
    return bool(getattr(notifier, "takes_notices", False))


def notice_fingerprint(rule: str, command_id: str) -> str:
    return hashlib.sha256(f"{rule}\0{command_id}".encode()).hexdigest()[:16]


def notice_group(alert: Alert) -> str:
    """The outbox group of a notice: its own, so it waits for no other alert and goes alone."""
    return f"notice|{alert.fingerprint}"


def acknowledged_notice(command_id: str, run_id: str, action: str, sent_ts: float,
                        ack: Mapping[str, Any], now: float, *, rule: str | None = None,
                        severity: str | None = None, step: int | None = None) -> Alert:
    """The notice that a worker acknowledged the brake ``command_id`` (``action`` of
    ``run_id``, sent at ``sent_ts`` for ``rule`` at ``severity``, the alert's ``step``): what
    the worker answered (``ack``: its ``status``, ``rank``, ``detail``), and how long after
    (by the acknowledgement's ``ts``, unless that is before the brake or ahead of ``now``)."""
    status = str(ack.get("status") or "applied")
    rank = ack.get("rank")
    who = "a worker" if rank is None else f"rank {rank}"
    at = ack.get("ts")
    if isinstance(at, (int, float)) and sent_ts <= at <= now + CLOCK_SLACK:   # the worker's clock
        delay = at - sent_ts
        when = f"{delay:.1f}s after it was sent"
    else:             # a worker clock far off the monitor's: when the monitor saw the answer
        delay = max(0.0, now - sent_ts)
        when = f"within {delay:.0f}s"
    what = f"the {action} for {rule}" + (f" ({severity})" if severity else "") if rule else f"the {action}"
    if status == "applied":
        state = _STATE_AFTER.get(action, "braked")
        summary = f"run {run_id}: {what} holds: {who} acknowledged it {when}; the run is {state}"
    else:
        state = "unknown"
        summary = f"run {run_id}: {what}: {who} answered {status}"
    detail = str(ack.get("detail") or "")
    if detail:
        summary += f" ({detail})"
    return Alert(rule=ACKNOWLEDGED_RULE, severity="info", state="firing", run_id=run_id,
                 fingerprint=notice_fingerprint(ACKNOWLEDGED_RULE, command_id),
                 step=step if isinstance(step, int) and step >= 0 else 0, onset_step=step,
                 value=round(delay, 1), metric="seconds_to_ack", actions=[], summary=summary[:2900],
                 labels={"command": action, "command_id": command_id, "source_rule": rule or "",
                         "ack_status": status, "ack_rank": "" if rank is None else str(rank),
                         "run_state": state},
                 ts=now)

"""One-off notices: news about a run's brake, not about its health. Pure.

Two kinds, each an :class:`~contract.alert.Alert` of severity ``info`` with a rule of its own,
so that a routes file routes them like any alert (``rule: operator_command``,
``rule: control_acknowledged``, ``command: pause`` ...):

* ``operator_command`` (:func:`alerts.operator.operator_notice`): an operator sent a run a
  command by hand (``rlwatch pause`` ..., the dashboard's buttons);
* ``control_acknowledged`` (:func:`acknowledged_notice`): a run answered a command a rule sent
  it: a pause or stop, so the people who saw the alert learn that the run is in fact paused (or
  stopped), and when, rather than guessing from the dashboard or waiting for silence; an adjust
  or a rollback, so they learn whether the script applied it (one without the callback answers
  "ignored", while the alert said the monitor did it).

A notice never resolves and never repeats: it goes to the receivers that take one-off notices
(:func:`takes_notices`: Slack, webhooks; not the console, nor Alertmanager and PagerDuty, which
keep an alert open until it resolves), through the outbox, due at once, in a group of its own
(:func:`notice_group`), so it is retried like any notification and muted by a silence that
matches it (an operator's notice is sent straight by the process that sent the command, and
left in the outbox only for a receiver that failed); no alert inhibits it (the red alert that
pulled a brake must not mute the news that the brake holds). Its identity is its command's id (:func:`notice_fingerprint`): a receiver that
drops repeats (a webhook's ``Idempotency-Key``) drops no other command's notice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from contract.alert import Alert

__all__ = ["ACKNOWLEDGED_RULE", "NOTICE_RULES", "OPERATOR_RULE", "acknowledged_notice", "is_notice",
           "notice_fingerprint", "notice_group", "say_answers", "say_heard", "say_ranks", "silent_ranks",
           "takes_notices",
           "world_of"]

#: the rule name of an operator's notice
OPERATOR_RULE = "operator_command"
#: the rule name of the notice of a run's answer to a command a rule sent it
ACKNOWLEDGED_RULE = "control_acknowledged"
NOTICE_RULES = frozenset({OPERATOR_RULE, ACKNOWLEDGED_RULE})

#: seconds a worker's clock may run ahead of the monitor's before its acknowledgement's time is
#: not believed
CLOCK_SLACK = 5.0
#: the largest run size believed from an acknowledgement (the stream processor's limit of
#: ranks per run); a larger one is not waited for
MAX_WORLD = 4096
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


def say_answers(answers: Mapping[int, dict]) -> tuple[bool, str]:
    """(every rank applied it, the answers in a few words): ``applied (rank 0): paused at step
    23``, ``applied (ranks 0-7)``, ``failed (rank 5): <why>; applied (ranks 0-4, 6-7)``."""
    groups: dict[tuple[str, str], list[int]] = {}
    for rank in sorted(answers):
        ack = answers[rank]
        detail = str(ack.get("detail") or "") if len(answers) == 1 or ack.get("status") != "applied" else ""
        groups.setdefault((str(ack.get("status")), detail), []).append(rank)
    ok = all(status == "applied" for status, _ in groups)
    parts = sorted(groups.items(), key=lambda g: (g[0][0] == "applied", g[1]))
    return ok, "; ".join(f"{status} ({say_ranks(ranks)})" + (f": {detail}" if detail else "")
                         for (status, detail), ranks in parts)


def say_ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-4, 6-7``."""
    spans: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)


def world_of(answers: Mapping[int, Mapping[str, Any]]) -> int | None:
    """The run's number of ranks as its answers give it (the ``world_size`` a training process
    puts in its acknowledgements, up to :data:`MAX_WORLD`); None when none says (one from an
    SDK before it did)."""
    sizes = [a.get("world_size") for a in answers.values()]
    sizes = [w for w in sizes if isinstance(w, int) and not isinstance(w, bool) and 0 < w <= MAX_WORLD]
    return max(sizes) if sizes else None


def silent_ranks(answers: Mapping[int, Mapping[str, Any]], world: int | None = None) -> list[int]:
    """The ranks of the run (``world`` ranks, else as :func:`world_of` gives it) that have not
    answered."""
    world = world or world_of(answers)
    return [r for r in range(world) if r not in answers] if world else []


def say_heard(answers: Mapping[int, Mapping[str, Any]], world: int | None = None) -> tuple[bool, list[int], str]:
    """(every rank that answered applied it, the silent ranks (:func:`silent_ranks`), the
    answers in a few words followed by ``; no answer yet (ranks 2-3)``): what an operator is
    shown while a run's ranks answer (``rlwatch pause --wait``, the dashboard's cockpit)."""
    applied, said = say_answers(answers)
    silent = silent_ranks(answers, world)
    return applied, silent, said + (f"; no answer yet ({say_ranks(silent)})" if silent else "")


def acknowledged_notice(sent, answers: Mapping[int, Mapping[str, Any]], now: float) -> Alert:
    """The notice that a run answered a command a rule sent it (``sent``, an
    :class:`alerts.escalation.SentCommand`: a pause or stop, which then holds, or an adjust or
    rollback, which the script applied or not): what its ranks answered (``answers``: rank ->
    acknowledgement, with its ``status``, ``detail`` and ``ts``; rank -1 for one that named
    none), and how long after the command the last of them did (by the acknowledgements' ``ts``,
    unless one is before the command or ahead of ``now``: then when the monitor saw them).
    The ranks of the run (:func:`world_of`) that did not answer are named, and then a brake is
    said to hold on the others only (``ack_status`` ``partial``)."""
    ranks = sorted(answers)
    applied, said = say_answers(answers)
    world, silent = world_of(answers), silent_ranks(answers)
    times = [a.get("ts") for a in answers.values()]
    if times and all(isinstance(t, (int, float)) and sent.ts <= t <= now + CLOCK_SLACK for t in times):
        delay = max(times) - sent.ts            # the workers' clocks
        when = f"{delay:.1f}s after it was sent"
    else:             # a worker clock far off the monitor's: when the monitor saw the answers
        delay = max(0.0, now - sent.ts)
        when = f"within {delay:.0f}s"
    who = say_ranks(ranks) if ranks and ranks[0] >= 0 else "a worker"
    of = f" of {world}" if world and world > 1 and who != "a worker" else ""
    what = f"the {sent.said or sent.action}" + (f" for {sent.rule}" if sent.rule else "") + \
        (f" ({sent.severity})" if sent.severity else "")
    brake = sent.action in _STATE_AFTER
    state = _STATE_AFTER[sent.action] if brake and applied and not silent else ""
    quiet = f"; {say_ranks(silent)} did not answer within {max(0.0, now - sent.ts):.0f}s" if silent else ""
    if applied and silent:       # the ranks that answered applied it; the others are silent
        got = f"holds on {len(answers)}{of} ranks" if brake else f"was applied on {len(answers)}{of} ranks"
        summary = f"run {sent.run_id}: {what} {got}: {who} acknowledged it {when}{quiet}"
        status = "partial"
    elif applied:
        summary = f"run {sent.run_id}: {what} {'holds' if brake else 'was applied'}: {who}{of} acknowledged it {when}"
        summary += f"; the run is {state}" if brake else ""
        if len(answers) == 1:
            detail = str(next(iter(answers.values())).get("detail") or "")
            summary += f" ({detail})" if detail else ""
        status = "applied"
    else:
        summary = f"run {sent.run_id}: {what}: the run answered {said}{quiet}"
        status = next(str(a.get("status")) for a in answers.values() if a.get("status") != "applied")
    return Alert(rule=ACKNOWLEDGED_RULE, severity="info", state="firing", run_id=sent.run_id,
                 fingerprint=notice_fingerprint(ACKNOWLEDGED_RULE, sent.command_id),
                 step=sent.step if isinstance(sent.step, int) and sent.step >= 0 else 0, onset_step=sent.step,
                 value=round(delay, 1), metric="seconds_to_ack", actions=[], summary=summary[:2900],
                 labels={"command": sent.action, "command_id": sent.command_id, "source_rule": sent.rule or "",
                         "ack_status": status, "ack_ranks": who.split(" ", 1)[1] if who != "a worker" else "",
                         "ack_world": str(world or ""), "ack_silent": say_ranks(silent).split(" ", 1)[1] if silent else "",
                         "run_state": state},
                 ts=now)

"""What an operator's ``adjust`` and ``rollback`` carry, and what the run answered. Pure.

``rlwatch adjust`` / ``rlwatch rollback`` and the dashboard's command API send them by hand, as
rules do with their ``adjust`` and ``rollback`` actions (:func:`alerts.actions.commands_for`).
This module turns what the operator typed, and what the run reported (its fleet record's
summary: the newest checkpoints, and for each open alert the checkpoint a rollback for it would
go to), into the command's parameters, or into one clear error (:class:`OperatorError`). The
caller reads the record and sends the command.

* ``adjust``: ``name=number`` pairs, numbers as rule actions write them: factors
  (``beta=1.5`` raises the KL coefficient by half), which the training script's ``on_adjust``
  (or the TRL callback) applies.
* ``rollback``: ``{to_step, checkpoint}``, both always. Given one, the other is found among the
  checkpoints the run reported. Given neither: the newest checkpoint before the onset of the
  run's worst open alert (what a rule's rollback would pick), or the run's newest checkpoint
  when no alert is open. A run whose worst alert has no checkpoint before its onset is refused,
  rather than rolled back to a checkpoint taken after the trouble began.
* the answers: each rank of the run acknowledges a command on its own (``applied``,
  ``ignored`` without the callback, ``failed`` when it raised); :func:`answers_of` reads them
  from the run's audit entries (signed ones only, with a control secret) and
  :func:`say_answers` words them, failures first.
* the notice: :func:`operator_notice` is the alert that tells the run's receivers (Slack, a
  webhook...) that an operator sent a command, who and why (:mod:`alerts.announce` sends it):
  a brake pulled by hand is news for everyone watching the run, as a rule's is.
"""

from __future__ import annotations

import hmac
import math
import re
from typing import Any, Iterable, Mapping

from alerts.notices import OPERATOR_RULE, notice_fingerprint, say_answers, say_ranks
from contract.alert import Alert
from contract.commands import Command, ack_signature

__all__ = ["OPERATOR_RULE", "OperatorError", "adjust_params", "answers_of", "operator_notice",
           "rollback_params", "say_answers", "say_ranks", "say_sent"]

#: the newest checkpoints a refusal names (the run's summary holds more)
SAID_CHECKPOINTS = 4


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")


class OperatorError(ValueError):
    """An operator's command that cannot be sent as asked: the message says why and what to do."""


def adjust_params(pairs: Iterable[str] | Mapping[str, Any]) -> dict[str, float]:
    """``["beta=1.5", "lr=0.5"]`` (or a mapping of names to numbers) as ``{"beta": 1.5, "lr": 0.5}``."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else [_split(p) for p in pairs]
    if not items:
        raise OperatorError("name at least one parameter and its factor, e.g. beta=1.5 lr=0.5")
    out: dict[str, float] = {}
    for name, raw in items:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise OperatorError(f"{name!r} is not a parameter name (letters, digits, _ . / -, "
                                f"starting with a letter, at most 64 characters)")
        if name in out:
            raise OperatorError(f"{name} is given twice")
        out[name] = _number(name, raw)
    return out


def _split(pair: Any) -> tuple[str, str]:
    if not isinstance(pair, str):
        raise OperatorError(f"{pair!r} is not name=number (e.g. beta=1.5)")
    name, eq, value = pair.partition("=")
    if not eq or not name.strip() or not value.strip():
        raise OperatorError(f"{pair!r} is not name=number (e.g. beta=1.5)")
    return name.strip(), value.strip()


def _number(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise OperatorError(f"{name}={raw}: the value must be a number (e.g. {name}=1.5)")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise OperatorError(f"{name}={raw}: the value must be a number (e.g. {name}=1.5)") from None
    if not math.isfinite(value) or value <= 0:
        raise OperatorError(f"{name}={raw}: the value must be a factor above 0 (beta=1.5 raises it by "
                            f"half, lr=0.5 halves it)")
    return value


def rollback_params(run_id: str, summary: Mapping[str, Any] | None, to_step: int | None = None,
                    checkpoint: str | None = None) -> tuple[dict[str, Any], str]:
    """``({"to_step": N, "checkpoint": PATH}, why that one)`` for a rollback of ``run_id``,
    from what the operator gave and the run's ``summary`` (None: no worker has seen the run)."""
    summary = summary or {}
    reported = _reported(summary)
    last = summary.get("last_step")
    if to_step is not None and to_step < 0:
        raise OperatorError(f"--to-step must be a step (0 or more), not {to_step}")
    if to_step is not None and isinstance(last, int) and to_step > last:
        raise OperatorError(f"run {run_id} is at step {last}: step {to_step} is ahead of it")
    if checkpoint is not None and (not isinstance(checkpoint, str) or not checkpoint.strip()):
        raise OperatorError("--checkpoint must be a path")
    if to_step is not None and checkpoint is not None:
        return {"to_step": to_step, "checkpoint": checkpoint}, "as given"
    known = ", ".join(f"step {s}: {p}" for s, p in reported[-SAID_CHECKPOINTS:]) or "none"
    if len(reported) > SAID_CHECKPOINTS:
        known += f" and {len(reported) - SAID_CHECKPOINTS} older (`rlwatch status RUN --json` lists them)"
    if to_step is not None:
        paths = [p for s, p in reported if s == to_step]
        if not paths:
            raise OperatorError(f"run {run_id} reported no checkpoint at step {to_step} (of its newest "
                                f"it reported: {known}); give --checkpoint PATH as well")
        return {"to_step": to_step, "checkpoint": paths[-1]}, f"the checkpoint it reported at step {to_step}"
    if checkpoint is not None:
        steps = [s for s, p in reported if p == checkpoint]
        if not steps:
            raise OperatorError(f"run {run_id} reported no checkpoint {checkpoint!r} (of its newest "
                                f"it reported: {known}); give --to-step N as well")
        return {"to_step": steps[-1], "checkpoint": checkpoint}, f"the step it reported {checkpoint} at"
    alerts = [a for a in summary.get("open_alerts") or [] if isinstance(a, Mapping)]
    if alerts:
        # the worst alert (RunState.summary puts the worst severity first), the earliest of that
        # severity if several: the checkpoint before its onset, or none (never one after it)
        worst = [a for a in alerts if a.get("severity") == alerts[0].get("severity")]
        a = min(worst, key=lambda a: a.get("onset_step") if isinstance(a.get("onset_step"), int) else -1)
        to = a.get("rollback_to")
        if isinstance(to, Mapping) and isinstance(to.get("step"), int) and to.get("checkpoint"):
            return ({"to_step": to["step"], "checkpoint": to["checkpoint"]},
                    f"the newest checkpoint before the onset of its {a.get('severity')} alert "
                    f"{a.get('rule')} (step {a.get('onset_step')})")
        raise OperatorError(f"run {run_id} reported no checkpoint before the onset of its "
                            f"{a.get('severity')} alert {a.get('rule')} (step {a.get('onset_step')}; its "
                            f"newest checkpoints: {known}); give --to-step N and --checkpoint PATH to "
                            f"roll back anyway")
    behind = [(s, p) for s, p in reported if not isinstance(last, int) or s <= last]
    if behind:
        s, p = behind[-1]
        return {"to_step": s, "checkpoint": p}, "its newest checkpoint (no alert is open)"
    raise OperatorError(f"run {run_id} reported no checkpoint (the SDK's Monitor.log_checkpoint "
                        f"reports them); give --to-step N and --checkpoint PATH")


def _reported(summary: Mapping[str, Any]) -> list[tuple[int, str]]:
    out = []
    for item in summary.get("checkpoints") or []:
        if (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], int)
                and isinstance(item[1], str)):
            out.append((item[0], item[1]))
    return sorted(out)


def answers_of(entries: Iterable[Any], command_id: str, secret: str | None) -> dict[int, dict]:
    """The answers of a run's ranks to a command, from its audit entries (oldest first): the
    latest acknowledgement of each rank. An entry that is not an acknowledgement of that command
    or, with a control secret, not signed with it does not count (a forged "applied" must not
    reassure)."""
    out: dict[int, dict] = {}
    for ack in entries:
        if not isinstance(ack, dict) or ack.get("type") != "ack" or ack.get("command_id") != command_id:
            continue
        if secret:
            sig = ack.get("signature")
            if not isinstance(sig, str) or not hmac.compare_digest(sig, ack_signature(ack, secret) or ""):
                continue
        rank = ack.get("rank")
        out[rank if isinstance(rank, int) else -1] = ack
    return out


def say_sent(cmd: Command, why: str | None = None) -> str:
    """A command in a few words: ``pause``, ``adjust beta=1.5, lr=0.5``, ``rollback to step 120
    (/ck/120: why that one)``."""
    p = cmd.params or {}
    if cmd.action == "adjust" and p:
        return "adjust " + ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                                     for k, v in p.items())
    if cmd.action == "rollback" and "to_step" in p:
        return f"rollback to step {p['to_step']} ({p.get('checkpoint')}" + (f": {why})" if why else ")")
    return cmd.action


def operator_notice(cmd: Command, state: str, now: float, step: Any = None,
                    why: str | None = None) -> Alert:
    """The alert that tells a run's receivers an operator sent ``cmd`` (severity ``info``,
    rule :data:`OPERATOR_RULE`: a notice, never a brake; it names no action, so nothing acts
    on it). ``state``: the run's state after it (running, paused, stopped); ``step``: the
    run's last step known to the monitor, as its summary has it (anything but a step, e.g. None
    for a run no worker has seen, reads 0); ``why``: why a rollback goes to that checkpoint."""
    summary = f"run {cmd.run_id}: {say_sent(cmd, why)} sent by {cmd.issuer or 'an operator'}"
    if cmd.reason:
        summary += f": {cmd.reason}"
    summary += f"; the run is {state}" + ("" if cmd.action in ("pause", "resume", "stop") else
                                         " (the script applies it at its next step boundary)")
    # its identity is the command's (an alert's is its rule, run, rank and tier): a receiver
    # that drops repeats by it (a webhook's Idempotency-Key) drops no other command's notice
    ident = notice_fingerprint(OPERATOR_RULE, cmd.id)
    return Alert(rule=OPERATOR_RULE, severity="info", state="firing", run_id=cmd.run_id,
                 fingerprint=ident, step=step if isinstance(step, int) and step >= 0 else 0, actions=[],
                 summary=summary[:2900],
                 labels={"command": cmd.action, "command_id": cmd.id, "issuer": cmd.issuer or "",
                         "run_state": state},
                 ts=now)

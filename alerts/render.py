"""How an alert reads to a person: plain text and Slack Block Kit. Pure."""

from __future__ import annotations

from alerts.notices import ACKNOWLEDGED_RULE, OPERATOR_RULE
from contract.alert import Alert

__all__ = ["TIER_COLOURS", "num", "slack_batch", "slack_blocks", "text"]

TIER_COLOURS = {"info": "#439FE0", "yellow": "#F2C744", "orange": "#F2952F", "red": "#D93F3F",
                "black": "#1D1C1D"}
#: terminal colours for tiers and for the demo's other lines
ANSI = {"info": "36", "yellow": "33", "orange": "38;5;208", "red": "31", "black": "1;37;40",
        "resolved": "32", "control": "35", "dim": "2"}


def paint(s: str, colour: str, use: bool) -> str:
    """``s`` in a terminal colour when ``use``; unchanged otherwise (a file, a pipe)."""
    return f"\033[{ANSI[colour]}m{s}\033[0m" if use else s


TIER_ICONS = {"info": "ℹ️", "yellow": "🟡", "orange": "🟠", "red": "🔴", "black": "⚫"}


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


num = _num


def text(alert: Alert, done: list[str] | None = None) -> str:
    """One line for logs and terminals."""
    head = "RESOLVED" if alert.state == "resolved" else alert.severity.upper()
    rank = "" if alert.rank is None else f" rank {alert.rank}"
    acts = f" -> {', '.join(done)}" if done else ""
    return (f"[{head}] {alert.run_id}{rank} step {alert.step} {alert.rule}: {alert.summary}{acts}")


def _ranks(label: str) -> str:
    """A ranks label (``0-7``, ``3``) in words: ``ranks 0-7``, ``rank 3``."""
    return ("ranks " if "-" in label or "," in label else "rank ") + label


def slack_blocks(alert: Alert, done: list[str] | None = None) -> tuple[str, list[dict], list[dict]]:
    """(fallback text, blocks, attachments) for chat.postMessage or an incoming webhook."""
    icon = "✅" if alert.state == "resolved" else TIER_ICONS.get(alert.severity, "")
    title = f"{icon} {alert.severity.upper()} {alert.rule} — {alert.run_id}"
    if alert.state == "resolved":
        title = f"{icon} RESOLVED {alert.rule} — {alert.run_id}"
    by_hand = alert.rule == OPERATOR_RULE
    if by_hand:
        title = f"{icon} {alert.labels.get('command', 'command').upper()} by hand — {alert.run_id}"
        fields = [
            {"type": "mrkdwn", "text": f"*Run*\n`{alert.run_id}`"},
            {"type": "mrkdwn", "text": f"*Now*\n{alert.labels.get('run_state', '?')}"},
            {"type": "mrkdwn", "text": f"*Sent by*\n{alert.labels.get('issuer') or 'an operator'}"},
            {"type": "mrkdwn", "text": f"*Last step seen*\n{alert.step}"},
        ]
    elif alert.rule == ACKNOWLEDGED_RULE:
        status = alert.labels.get("ack_status")
        held = status == "applied"
        icon = "✅" if held else "⚠️"
        what = alert.labels.get("command", "brake")
        verb = ("holds" if held else "answered") if what in ("pause", "stop") else \
            ("applied" if held else "not applied")
        if status == "partial":      # the ranks that answered applied it, others are silent
            verb = "holds on some ranks" if what in ("pause", "stop") else "applied on some ranks"
        title = f"{icon} {what.upper()} {verb} — {alert.run_id}"
        ranks, world = alert.labels.get("ack_ranks", ""), alert.labels.get("ack_world", "")
        who = _ranks(ranks) + (f" of {world}" if world not in ("", "1") else "") if ranks else "a worker"
        silent = alert.labels.get("ack_silent", "")
        fields = [
            {"type": "mrkdwn", "text": f"*Run*\n`{alert.run_id}`"},
            {"type": "mrkdwn", "text": f"*Now*\n{alert.labels.get('run_state') or '—'}"},
            {"type": "mrkdwn", "text": f"*For*\n{alert.labels.get('source_rule') or 'an operator'}"},
            {"type": "mrkdwn", "text": f"*Acknowledged by*\n{who} after {_num(alert.value)}s"
                                       + (f"\n*Silent:* {_ranks(silent)}" if silent else "")},
        ]
    else:
        fields = [
            {"type": "mrkdwn", "text": f"*Run*\n`{alert.run_id}`"},
            {"type": "mrkdwn", "text": f"*Step*\n{alert.step} (onset {alert.onset_step})"},
            {"type": "mrkdwn", "text": f"*Value*\n{_num(alert.value)} vs {_num(alert.threshold)}"},
            {"type": "mrkdwn", "text": f"*Rank*\n{'all' if alert.rank is None else alert.rank}"},
        ]
    blocks: list[dict] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": alert.summary[:2900] or alert.rule},
         "fields": fields},
    ]
    if alert.diagnosis and alert.state == "firing":
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": alert.diagnosis[:2900]}})
    did = ", ".join(done) if done else ("nothing (notify only)" if alert.state == "firing" else "—")
    context = f"monitor did: *{did}*"
    if by_hand:   # an operator's command, not the monitor's
        context = f"sent by hand · command `{alert.labels.get('command_id', '')}`"
    elif alert.rule == ACKNOWLEDGED_RULE:
        context = f"the worker's answer · command `{alert.labels.get('command_id', '')}`"
    advisory = getattr(alert, "actions_advisory", None)
    if advisory and alert.state == "firing":
        context += f" · advisory, not enforced for this run: {', '.join(advisory)}"
    incident = getattr(alert, "incident", None)
    if incident:
        context += f" · snapshot `rlwatch incidents show {incident}`"
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"{context} · fingerprint `{alert.fingerprint}`"}]})
    colour = "#2EB67D" if alert.state == "resolved" else TIER_COLOURS.get(alert.severity, "#888888")
    attachments = [{"color": colour, "blocks": blocks[1:]}]
    return text(alert, done), blocks[:1], attachments


def slack_batch(alerts: list[Alert], dones: list[list[str]]) -> tuple[str, list[dict], list[dict]]:
    """One message for a group's alerts (a webhook has no threads to keep them apart)."""
    if len(alerts) == 1:
        return slack_blocks(alerts[0], dones[0])
    runs = sorted({a.run_id for a in alerts})
    title = f"{len(alerts)} alerts — {', '.join(runs)[:100]}"
    attachments = []
    for a, d in zip(alerts, dones):
        _, head, att = slack_blocks(a, d)
        attachments.append({"color": att[0]["color"], "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{head[0]['text']['text']}*"}},
            *att[0]["blocks"]]})
    fallback = "\n".join(text(a, d) for a, d in zip(alerts, dones))
    return fallback, [{"type": "header", "text": {"type": "plain_text", "text": title[:150]}}], attachments[:20]

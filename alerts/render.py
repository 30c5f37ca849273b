"""How an alert reads to a person: plain text and Slack Block Kit. Pure."""

from __future__ import annotations

from rlwatch.alert import Alert

__all__ = ["TIER_COLOURS", "slack_blocks", "text"]

TIER_COLOURS = {"info": "#439FE0", "yellow": "#F2C744", "orange": "#F2952F", "red": "#D93F3F",
                "black": "#1D1C1D"}
TIER_ICONS = {"info": "ℹ️", "yellow": "🟡", "orange": "🟠", "red": "🔴", "black": "⚫"}


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def text(alert: Alert, done: list[str] | None = None) -> str:
    """One line for logs and terminals."""
    head = "RESOLVED" if alert.state == "resolved" else alert.severity.upper()
    rank = "" if alert.rank is None else f" rank {alert.rank}"
    acts = f" -> {', '.join(done)}" if done else ""
    return (f"[{head}] {alert.run_id}{rank} step {alert.step} {alert.rule}: {alert.summary}{acts}")


def slack_blocks(alert: Alert, done: list[str] | None = None) -> tuple[str, list[dict], list[dict]]:
    """(fallback text, blocks, attachments) for chat.postMessage or an incoming webhook."""
    icon = "✅" if alert.state == "resolved" else TIER_ICONS.get(alert.severity, "")
    title = f"{icon} {alert.severity.upper()} {alert.rule} — {alert.run_id}"
    if alert.state == "resolved":
        title = f"{icon} RESOLVED {alert.rule} — {alert.run_id}"
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
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"monitor did: *{did}* · fingerprint `{alert.fingerprint}`"}]})
    colour = "#2EB67D" if alert.state == "resolved" else TIER_COLOURS.get(alert.severity, "#888888")
    attachments = [{"color": colour, "blocks": blocks[1:]}]
    return text(alert, done), blocks[:1], attachments

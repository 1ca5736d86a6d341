"""What operators read: each finding's alert summary and description, the Slack message and the
JSON webhook payload."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from functions.alert_forwarder.received import Received
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.finding import FINDING_LABEL
from shared.intake import Incoming

if TYPE_CHECKING:
    from functions.alert_forwarder.decide import Alert

MAX_TEXT = 2900  # a Slack section's text is limited to 3000 characters


# -- summary and description, from the schema alone -------------------------------------------------
def advice(finding: Received) -> str:
    return "\n".join(f"- {_step(item)}" for item in finding.advice if item)


def _step(item: Any) -> str:
    """One piece of advice: a sentence, or {action, why[, yaml]}."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        said = item.get("text") or ": ".join(str(item[k]) for k in ("action", "why") if item.get(k))
        if said:
            return str(said)
    return json.dumps(item, sort_keys=True, default=str)


def paragraphs(*parts: str | None) -> str:
    return "\n\n".join(part for part in parts if part)


def summary(f: Received) -> str:
    """The finding's own sentence; failing that, one made of its category and identity."""
    if f.summary:
        return f.summary
    what = "no longer" if f.state == "resolved" else "now"
    return f"{f.category} {what} on {identity(f.identity)} ({f.function or 'vmevents'})."


def description(f: Received) -> str:
    """The advice, then the category, the state and the finding's plain details, whatever the producer put there."""
    facts = [f"{key}: {_plain(value)}" for key, value in sorted(f.details.items()) if _plain(value)]
    head = f"Category: {f.category}; state: {f.state}."
    return paragraphs(advice(f), head, clip("; ".join(facts), 1500) if facts else None)


def _plain(value: Any) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return ""
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def identity(labels: Mapping[str, str]) -> str:
    """Which alert this is, in a few words: "ns/vm [device=…]", from whatever identity labels it has."""
    name = labels.get("vm") or labels.get("name")
    who = "/".join(part for part in (labels.get("namespace"), name) if part) or "cluster"
    extra = [f"{k}={v}" for k, v in sorted(labels.items())
             if v and k not in ("alertname", "severity", "cluster", "namespace", "vm", "name", FINDING_LABEL)]
    return who + (f" [{', '.join(extra)}]" if extra else "")


# -- the webhook formats --------------------------------------------------------------------------
def webhook_payload(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """Alertmanager's own webhook payload (version 4) with one alert, so receivers written for
    Alertmanager read it unchanged, plus `finding`: the event it came from."""
    status = "resolved" if alert.resolved else "firing"
    return {"version": "4", "groupKey": f"vmevents/{alert.fingerprint}", "truncatedAlerts": 0, "status": status,
            "receiver": FUNCTION, "groupLabels": {"alertname": alert.labels["alertname"]},
            "commonLabels": alert.labels, "commonAnnotations": alert.annotations, "externalURL": "",
            "alerts": [{"status": status, **alert.postable(), "generatorURL": "", "fingerprint": alert.fingerprint}],
            "finding": {"id": event.id, "type": event.type, "source": event.source, "subject": event.subject,
                        "data": event.data}}


def slack_message(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """A Slack incoming-webhook message: a headline, the summary, the description and the runbook."""
    labels, notes = alert.labels, alert.annotations
    if alert.resolved:
        headline = f":white_check_mark: *RESOLVED: {labels['alertname']}* {identity(labels)}"
    else:
        icon = {"critical": ":red_circle:", "warning": ":warning:"}.get(labels["severity"], ":information_source:")
        headline = f"{icon} *{labels['severity'].upper()}: {labels['alertname']}* {identity(labels)}"
    if labels.get("cluster"):
        headline += f" on cluster {labels['cluster']}"
    body = paragraphs(_escape(headline), _escape(notes["summary"]),
                      "\n".join(f"> {line}" if line else ">" for line in _escape(notes["description"]).splitlines()),
                      f"<{notes['runbook_url']}|Runbook>")
    context = " · ".join(f"{k}={_escape(v)}" for k, v in sorted(labels.items()))
    return {"text": _escape(f"{headline.replace('*', '')}: {notes['summary']}"),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": clip(body, MAX_TEXT)}},
                       {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(context, MAX_TEXT)}]}]}


def _escape(text: str) -> str:
    """Slack mrkdwn: &, < and > are control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"

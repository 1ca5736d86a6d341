"""What people read: each finding's alert annotations (summary, description, runbook), the Slack message and the
JSON webhook payload, and the reason of every verdict in the log line."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from functions.alert_forwarder import decide as d
from functions.alert_forwarder.decide import Alert, Plan, Verdict
from functions.alert_forwarder.received import Received
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.finding import FINDING_LABEL
from shared.intake import Incoming

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
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # a key that is not a string: json's way
        return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def identity(labels: Mapping[str, str]) -> str:
    """Which alert this is, in a few words: "ns/vm [device=…]", from whatever identity labels it has."""
    name = labels.get("vm") or labels.get("name")
    who = "/".join(part for part in (labels.get("namespace"), name) if part) or "cluster"
    extra = [f"{k}={v}" for k, v in sorted(labels.items())
             if v and k not in ("alertname", "severity", "cluster", "namespace", "vm", "name", FINDING_LABEL)]
    return who + (f" [{', '.join(extra)}]" if extra else "")


# -- the alert as Alertmanager takes it ----------------------------------------------------------------
def notes_of(alert: Alert, settings: Settings) -> dict[str, str]:
    return {"summary": clip(summary(alert.finding), 1000), "description": clip(description(alert.finding), 4000),
            "runbook_url": f"{settings.runbook_base}#{alert.kind.runbook}"}


def postable(alert: Alert, settings: Settings) -> dict:
    """Alertmanager API v2 PostableAlert."""
    return {"labels": alert.labels, "annotations": notes_of(alert, settings),
            "startsAt": rfc3339(alert.starts_at), "endsAt": rfc3339(alert.ends_at)}


def rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the webhook formats --------------------------------------------------------------------------
def webhook_payload(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """Alertmanager's own webhook payload (version 4) with one alert, so receivers written for
    Alertmanager read it unchanged, plus `finding`: the finding it came from (in a summary, its own item)."""
    status = "resolved" if alert.resolved else "firing"
    posted = postable(alert, settings)
    return {"version": "4", "groupKey": f"vmevents/{alert.fingerprint}", "truncatedAlerts": 0, "status": status,
            "receiver": FUNCTION, "groupLabels": {"alertname": alert.labels["alertname"]},
            "commonLabels": alert.labels, "commonAnnotations": posted["annotations"], "externalURL": "",
            "alerts": [{"status": status, **posted, "generatorURL": "", "fingerprint": alert.fingerprint}],
            "finding": {"id": alert.finding.id or event.id, "type": event.type, "source": event.source,
                        "subject": event.subject, "data": alert.finding.data or event.data}}


def slack_message(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """A Slack incoming-webhook message: a headline, the summary, the description and the runbook."""
    labels, notes = alert.labels, notes_of(alert, settings)
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


# -- the log line's reason ------------------------------------------------------------------------
def below_threshold(severity: str, settings: Settings) -> str:
    """The reason of a drop whose findings are all below MIN_SEVERITY, the first of them `severity`."""
    return f"severity {severity}, below MIN_SEVERITY={settings.min_severity}"


def listed(alerts: Sequence[Alert]) -> str:
    """"firing: VMHostDeviceConflict default/vm2 [...], ..." (or resolved)."""
    state = "resolved" if all(a.resolved for a in alerts) else "firing"
    return f"{state}: " + ", ".join(sorted({f"{a.labels['alertname']} {identity(a.labels)}" for a in alerts}))


def dropped(verdict: Verdict, settings: Settings) -> str:
    """Why nothing is sent for this event, or this tick."""
    if verdict.reason == d.OWN_EVENT:
        return "alert-forwarder's own event (never forwarded: no loop)"
    if verdict.reason == d.BELOW:
        return below_threshold(verdict.below[0], settings)
    if verdict.reason == d.NO_RECEIVER:
        return f"no receiver configured (set ALERTMANAGER_URL or WEBHOOK_URL) for {listed(verdict.alerts)}"
    if verdict.reason == d.NO_ALERTMANAGER:
        return "no ALERTMANAGER_URL: nothing to keep alive (webhooks get one message per notice)"
    return "the event carries no finding"


_WHY = {d.ENDED: "its episode ended: not sent firing", d.SENT: "already accepted by every receiver",
        d.OTHER_LIFE: "of a record that is gone: nothing sent", d.BUSY: "being sent by another delivery: retried",
        d.UNREAD: "not reached within the delivery's budget: on redelivery"}


def forwarded(plans: Sequence[Plan], sent: Sequence[Alert], below: int, stopped: int = 0) -> str:
    """What a notice came to: what was sent, and why each finding that was not sent was not."""
    parts = [listed(sent)] if sent else ["nothing sent"]
    counts: dict[str, int] = {}
    for plan in plans:
        counts[plan.reason] = counts.get(plan.reason, 0) + 1
    for why, text in _WHY.items():
        if counts.get(why):
            parts.append(f"{counts[why]} finding(s) {text}")
    if below:
        parts.append(f"{below} below MIN_SEVERITY")
    if stopped:
        parts.append(f"{stopped} finding(s) {_WHY[d.UNREAD]}")
    return "; ".join(parts)


def refreshed(firing: int, resolved: int, on_record: int, chunks: int, stopped: bool, corrected: int = 0,
              uncorrected: bool = False) -> str:
    text = (f"{firing} firing and {resolved} resolved alert(s) re-posted from {on_record} finding(s) on record, "
            f"in {chunks} post(s)")
    if corrected:
        text += f"; {corrected} resolved during the tick posted resolved again after"
    if uncorrected:
        text += "; the findings resolved during the tick could not be looked for (the watch expired)"
    return text + ("; stopped at the tick's budget before the end of the list" if stopped else "")


def busy(plan: Plan) -> str:
    until = plan.busy.until.strftime("%H:%M:%SZ") if plan.busy else "?"
    return f"another delivery is sending {identity(plan.finding.labels)} until {until}; the broker will redeliver"


def unfinished(done: int, total: int) -> str:
    return (f"{done} of {total} finding(s) delivered within the delivery's budget; the broker will redeliver "
            f"and the others are sent then (what a receiver accepted is not sent again)")


def claim_ran_out(kind: str) -> str:
    return (f"not sent to {kind}: this delivery's claim on the finding ran short; the broker will redeliver "
            f"(nothing it accepted is sent again)")


# -- errors: what the broker, the log line and the dead letter say ---------------------------------------
# A receiver is named by `scheme://host[:port]` only (`where`), never its URL (a webhook URL is a secret).
def unreachable(name: str, where: str, error: str) -> str:
    return f"{name} at {where} is unreachable ({error}); the broker will redeliver"


def answered(name: str, where: str, status: int, said: str) -> str:
    return f"{name} at {where} answered {status}{said}; the broker will redeliver"


def refused(name: str, where: str, status: int, said: str) -> str:
    hint = " (check its credentials file)" if status in (401, 403) else ""
    if 300 <= status < 400:
        hint = " (a redirect alert-forwarder does not follow: set the receiver's final URL)"
    return f"{name} at {where} refused the alert: {status}{said}{hint}"


def redirected(name: str, where: str, status: int, to: str) -> str:
    return (f"{name} at {where} redirected the alert ({status}) to another origin, {to}, which is not followed: set "
            f"the receiver's final URL, or add that origin to REDIRECT_ALLOWED_ORIGINS")


def post_failed(error: Exception) -> str:
    return f"posting to Alertmanager failed: {error!r}"


def kept_changing(namespace: str, name: str) -> str:
    return f"finding Event {namespace}/{name} kept changing while its notice was delivered; the broker will redeliver"


def not_a_finding(namespace: str, name: str) -> str:
    return f"finding Event {namespace}/{name} is no finding's any more"


def receipts_unwritten(namespace: str, name: str) -> str:
    return (f"finding Event {namespace}/{name} kept changing; what its receivers accepted was not written, so a "
            f"redelivery may send it again")

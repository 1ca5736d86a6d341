"""What operators read: each finding's alert summary and description, the Slack message and the
JSON webhook payload."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from functions.alert_forwarder.finding import Finding, names, volumes
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.intake import Incoming

if TYPE_CHECKING:
    from functions.alert_forwarder.decide import Alert

MAX_TEXT = 2900  # a Slack section's text is limited to 3000 characters


# -- summaries and descriptions, per producer ------------------------------------------------------
def advice(finding: Finding) -> str:
    given = finding.data.get("advice")
    if isinstance(given, str):
        return given
    if isinstance(given, list):
        return "\n".join(f"- {_step(item)}" for item in given if item)
    return ""


def _step(item: Any) -> str:
    """One piece of advice: a sentence, or {action, why[, yaml]} as migration-report writes it."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        said = item.get("text") or ": ".join(str(item[k]) for k in ("action", "why") if item.get(k))
        if said:
            return str(said)
    return json.dumps(item, sort_keys=True, default=str)


def paragraphs(*parts: str | None) -> str:
    return "\n\n".join(part for part in parts if part)


# device-conflict: {kind (its category), device, resourceName, node, holder, blocked[], severity}
def device_summary(f: Finding) -> str:
    given = f.text("message", "summary")
    if given:
        return given
    device, resource, node = f.data.get("device"), f.data.get("resourceName"), f.data.get("node") or "its node"
    holder, blocked = f.data.get("holder"), ", ".join(names(f.data.get("blocked"))) or "another VM"
    category = f.data.get("kind")
    if category == "start-blocked":
        return f"VM {blocked} cannot start: {holder} holds {device} ({resource}) on {node}."
    if category == "double-assigned":
        return f"VMs {', '.join(filter(None, [holder, blocked]))} all name {device} ({resource}); only one can run."
    if holder:
        return f"{holder} holds {device} ({resource}) on {node}; {blocked} names it too and cannot start while it runs."
    return f"Host device {device} ({resource}) is in conflict ({category})."


def device_description(f: Finding) -> str:
    return paragraphs(advice(f), f"Holder: {f.data.get('holder') or '—'}; "
                                 f"blocked: {', '.join(names(f.data.get('blocked'))) or '—'}; "
                                 f"node: {f.data.get('node') or '—'}; resource: {f.data.get('resourceName') or '—'}.")


# migration-report: a structured report with at least vmi "ns/name", class and a summary sentence
def migration_summary(f: Finding) -> str:
    what = "failed" if f.type.endswith(".failed") else "succeeded close to its timeout"
    return f.text("summary", "message") or f"Migration of VMI {f.data.get('vmi')} {what} ({f.data.get('category')})."


def migration_description(f: Finding) -> str:
    return paragraphs(f"Category: {f.data.get('category') or 'unknown'}.", advice(f))


# io-pause-report: {vmi, volumes[{pvc, pv, longhornVolume, robustness, rebuilding, progress}], class, pauses, advice}
def io_summary(f: Finding) -> str:
    if f.type.endswith(".resolved"):
        return f.text("summary", "message") or f"VM {f.data.get('vmi')} no longer pauses on IO errors."
    pauses = f.data.get("pauses")
    times = f" {pauses} time(s)" if isinstance(pauses, int) else ""
    return (f.text("summary", "message")
            or f"VM {f.data.get('vmi')} paused{times} on IO errors ({f.data.get('category') or 'unknown'}).")


def io_description(f: Finding) -> str:
    listed = "; ".join(
        f"{v.get('pvc') or v.get('name')} → Longhorn volume {v.get('longhornVolume') or '—'} "
        f"(robustness {v.get('robustness') or '?'}"
        + (f", rebuilding {v.get('progress')}%" if v.get("rebuilding") else "") + ")"
        for v in volumes(f))
    return paragraphs(f"Category: {f.data.get('category') or 'unknown'}.", listed and f"Volumes: {listed}.", advice(f))


# vmi-cleanup: {vmi, vm, action, reason, previousRunStrategy, dryRun} (informational)
def cleanup_summary(f: Finding) -> str:
    return f"vmi-cleanup {f.data.get('action')} for VMI {f.data.get('vmi')}: {f.data.get('reason')}"


def cleanup_description(f: Finding) -> str:
    return (f"Previous run strategy: {f.data.get('previousRunStrategy') or '—'}; "
            f"dry run: {'yes' if f.data.get('dryRun') else 'no'}.")


# any other io.vmevents.<function>.<what>
def generic_summary(f: Finding) -> str:
    return f.text("summary", "message") or f"{f.type} about {f.subject or 'the cluster'}."


def generic_description(f: Finding) -> str:
    return clip(json.dumps(dict(f.data), sort_keys=True, default=str), 1000)


def identity(labels: Mapping[str, str]) -> str:
    """Which alert this is, in a few words: "ns/vm [device=…]"."""
    who = "/".join(part for part in (labels.get("namespace"), labels.get("vm")) if part) or "cluster"
    extra = [f"{k}={labels[k]}" for k in ("device", "volume", "migration") if labels.get(k)]
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

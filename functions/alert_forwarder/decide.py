"""alert-forwarder's pure part: which finding becomes which alert (the rule table), with which
severity, and whether it is forwarded or dropped. Every fact is an argument; nothing here does I/O.

Alertmanager does grouping, silencing, inhibition and routing; this function only turns a finding
into an alert with stable labels, so a repeat keeps the same alert alive and a `.resolved` finding
ends it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from functions.alert_forwarder import wording
from functions.alert_forwarder.finding import PREFIX, Finding, names, split_ref, volumes
from functions.alert_forwarder.settings import FUNCTION, SEVERITIES, Settings

_SEVERITY_ALIASES = {"informational": "info", "notice": "info", "warn": "warning", "error": "critical",
                     "high": "critical", "page": "critical"}


# -- the table: which finding becomes which alert --------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """How one finding type becomes an alert. `labels` gives the identity labels besides alertname,
    severity and cluster: the same finding again gives the same labels, so Alertmanager keeps one
    alert alive instead of adding another."""

    alertname: str
    severity: str                                   # used when the finding carries none
    labels: Callable[[Finding], dict[str, str]]
    summary: Callable[[Finding], str]
    description: Callable[[Finding], str]
    runbook: str                                    # the README anchor
    resolves: bool = False                          # a `.resolved` finding ends the alert


def _subject(finding: Finding) -> tuple[str, str]:
    """(namespace, name) from the event's subject, an API path like
    /apis/kubevirt.io/v1/namespaces/<ns>/<plural>/<name>."""
    parts = (finding.subject or "").strip("/").split("/")
    if "namespaces" in parts:
        at = parts.index("namespaces")
        rest = parts[at + 1:]
        return (rest[0] if rest else ""), (rest[2] if len(rest) > 2 else "")
    return "", ""


def _vm_labels(ref: Any, finding: Finding) -> dict[str, str]:
    namespace, name = split_ref(ref) if ref else _subject(finding)
    if not namespace:
        namespace = _subject(finding)[0]
    return {"namespace": namespace, "vm": name}


# device-conflict: {kind (its category), device, resourceName, node, holder, blocked[], severity}
def _device_labels(f: Finding) -> dict[str, str]:
    blocked = names(f.data.get("blocked"))
    return {**_vm_labels(f.data.get("holder") or (blocked[0] if blocked else None), f),
            "device": str(f.data.get("device") or ""), "conflict": str(f.data.get("kind") or "")}


# migration-report: a structured report with at least vmi "ns/name", class and a summary sentence
def _migration_labels(f: Finding) -> dict[str, str]:
    migration = f.data.get("migration") or f.data.get("vmim") or f.data.get("name")
    if isinstance(migration, Mapping):
        migration = migration.get("name")
    return {**_vm_labels(f.data.get("vmi") or f.data.get("vm"), f),
            "migration": split_ref(migration)[1] if migration else _subject(f)[1]}


# io-pause-report: {vmi, volumes[...], class, pauses, advice}
def _io_labels(f: Finding) -> dict[str, str]:
    pvcs = sorted({str(v.get("pvc") or v.get("longhornVolume") or v.get("name")) for v in volumes(f)
                   if v.get("pvc") or v.get("longhornVolume") or v.get("name")})
    return {**_vm_labels(f.data.get("vmi") or f.data.get("vm"), f), "volume": ",".join(pvcs)}


# vmi-cleanup: {vmi, vm, action, reason, previousRunStrategy, dryRun} (informational)
def _cleanup_labels(f: Finding) -> dict[str, str]:
    return _vm_labels(f.data.get("vm") or f.data.get("vmi"), f)


_DEVICE = Rule("VMHostDeviceConflict", "warning", _device_labels, wording.device_summary, wording.device_description,
               "vmhostdeviceconflict")
_MIGRATION = Rule("VMMigrationFailed", "warning", _migration_labels, wording.migration_summary,
                  wording.migration_description, "vmmigrationfailed")
_IO = Rule("VMPausedOnIOError", "critical", _io_labels, wording.io_summary, wording.io_description,
           "vmpausedonioerror")

TABLE: dict[str, Rule] = {
    "io.vmevents.device-conflict.detected": _DEVICE,
    "io.vmevents.device-conflict.resolved": dataclasses.replace(_DEVICE, resolves=True),
    "io.vmevents.migration-report.failed": _MIGRATION,
    "io.vmevents.migration-report.near-timeout": dataclasses.replace(_MIGRATION, alertname="VMMigrationNearTimeout",
                                                                     runbook="vmmigrationneartimeout"),
    "io.vmevents.io-pause-report.detected": _IO,
    "io.vmevents.io-pause-report.resolved": dataclasses.replace(_IO, resolves=True),
    "io.vmevents.vmi-cleanup.cleaned": Rule("VMICleanedUp", "info", _cleanup_labels, wording.cleanup_summary,
                                            wording.cleanup_description, "vmicleanedup"),
}


def _generic_labels(f: Finding) -> dict[str, str]:
    return _vm_labels(f.data.get("vm") or f.data.get("vmi"), f)


def generic_rule(event_type: str) -> Rule:
    """Any other io.vmevents.<function>.<what>: forwarded, so a new finding reaches operators
    before this table knows it. `<what>.resolved` ends the alert of `<what>.detected`."""
    function, _, what = event_type[len(PREFIX):].partition(".")
    resolves = what == "resolved"
    camel = "".join(word.capitalize() for word in re.split(r"[^A-Za-z0-9]+",
                                                           f"{function} {'detected' if resolves else what}") if word)
    return Rule(f"Vmevents{camel}", "warning", _generic_labels, wording.generic_summary, wording.generic_description,
                "other-findings", resolves)


def rule_for(event_type: str) -> Rule:
    return TABLE.get(event_type) or generic_rule(event_type)


def severity_of(finding: Finding, rule: Rule) -> str:
    given = str(finding.data.get("severity") or "").strip().lower()
    given = _SEVERITY_ALIASES.get(given, given)
    return given if given in SEVERITIES else rule.severity


def resolved_later(event_type: str) -> bool:
    """A `.detected` finding whose function also sends `.resolved`: it is not repeated while it lasts."""
    return event_type.endswith(".detected") and TABLE.get(event_type[:-len("detected")] + "resolved") is not None


# -- findings → alerts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    resolved: bool

    def postable(self) -> dict:
        """Alertmanager API v2 PostableAlert."""
        return {"labels": self.labels, "annotations": self.annotations,
                "startsAt": _rfc3339(self.starts_at), "endsAt": _rfc3339(self.ends_at)}

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode()).hexdigest()[:16]


def _rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Verdict:
    action: str                # "forward" or "drop"
    reason: str
    alerts: tuple[Alert, ...] = field(default=())


def to_alert(finding: Finding, settings: Settings, now: datetime) -> tuple[Alert, str]:
    """The alert for one finding and its severity. A firing alert lasts ALERT_TTL unless repeated
    (Alertmanager keeps the earliest startsAt and the latest endsAt of the same labels); a resolved
    one ends now."""
    rule = rule_for(finding.type)
    severity = severity_of(finding, rule)
    labels = {"alertname": rule.alertname, "severity": severity,
              **{k: v for k, v in rule.labels(finding).items() if v}}
    if settings.cluster:
        labels["cluster"] = settings.cluster
    annotations = {"summary": wording.clip(rule.summary(finding), 1000),
                   "description": wording.clip(rule.description(finding), 4000),
                   "runbook_url": f"{settings.runbook_base}#{rule.runbook}"}
    ends = now if rule.resolves else now + (settings.until_resolved_ttl if resolved_later(finding.type)
                                            else settings.alert_ttl)
    return Alert(labels, annotations, now, ends, rule.resolves), severity


def decide(event_type: str, found: list[Finding], settings: Settings, now: datetime) -> Verdict:
    """Which alerts to send for these findings."""
    if event_type.startswith(f"{PREFIX}{FUNCTION}."):
        return Verdict("drop", "alert-forwarder's own event (never forwarded: no loop)")
    floor = SEVERITIES.index(settings.min_severity)
    alerts: list[Alert] = []
    below: list[Alert] = []
    for finding in found:
        alert, severity = to_alert(finding, settings, now)
        (alerts if SEVERITIES.index(severity) >= floor else below).append(alert)
    if not alerts and not below:
        return Verdict("drop", "the event carries no finding")
    if not alerts:
        return Verdict("drop", f"severity {below[0].labels['severity']}, below MIN_SEVERITY={settings.min_severity}")
    state = "resolved" if all(a.resolved for a in alerts) else "firing"
    listed = ", ".join(sorted({f"{a.labels['alertname']} {wording.identity(a.labels)}" for a in alerts}))
    dropped = f" ({len(below)} below MIN_SEVERITY)" if below else ""
    if not settings.alertmanager and not settings.webhook:
        return Verdict("drop", f"no receiver configured (set ALERTMANAGER_URL or WEBHOOK_URL) for {state}: {listed}")
    return Verdict("forward", f"{state}: {listed}{dropped}", tuple(alerts))

"""alert-forwarder's pure part: which finding becomes which alert, with which severity, and whether it is
forwarded or dropped. Every fact is an argument; nothing here does I/O.

Alertmanager does grouping, silencing, inhibition and routing; this function only turns a finding into an
alert whose labels are the finding's identity (docs/findings.md), so a repeat keeps the same alert alive and
a resolved finding ends it. No code path per producer: a table says, per category, the alert's name, its
default severity and its runbook.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime

from functions.alert_forwarder import wording
from functions.alert_forwarder.categories import CATEGORIES
from functions.alert_forwarder.received import PREFIX, Received
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.declaration import SEVERITIES

_SEVERITY_ALIASES = {"informational": "info", "notice": "info", "warn": "warning", "error": "critical",
                     "high": "critical", "page": "critical"}


# -- the table: which category becomes which alert --------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """What an operator is told about one category of finding: the alert's name, the severity used when the
    finding carries none, and the README anchor of its runbook. The labels are always the finding's identity."""

    alertname: str
    severity: str
    runbook: str


# Every producer's declared alerts (functions/<name>/declaration.py), copied into categories.py by `make generate`:
# a function never imports another (docs/findings.md, "Which category becomes which alert").
TABLE: dict[str, Kind] = {category: Kind(*row) for category, row in CATEGORIES.items()}


def kind_of(finding: Received) -> Kind:
    """The table's row, or for a category it does not know (a new finding reaching operators before this
    table knows it) an alert named after its function and category, with the finding's own severity."""
    known = TABLE.get(finding.category)
    if known is not None:
        return known
    camel = "".join(word.capitalize() for word in re.split(r"[^A-Za-z0-9]+", f"{finding.function} "
                                                                                f"{finding.category}") if word)
    return Kind(f"Vmevents{camel}", "warning", "other-findings")


def severity_of(finding: Received, kind: Kind) -> str:
    return given_severity(finding.severity) or kind.severity


def given_severity(given: object) -> str | None:
    """The severity a finding names, as one of SEVERITIES (its aliases mapped), or None for none it names."""
    text = given.strip().lower() if isinstance(given, str) else ""
    text = _SEVERITY_ALIASES.get(text, text)
    return text if text in SEVERITIES else None


def below_threshold(severity: str, settings: Settings) -> str:
    """The reason of a drop whose findings are all below MIN_SEVERITY, the first of them `severity`."""
    return f"severity {severity}, below MIN_SEVERITY={settings.min_severity}"


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


def to_alert(finding: Received, settings: Settings, now: datetime) -> tuple[Alert, str]:
    """The alert for one finding and its severity. Its labels are the finding's identity (with the digest
    that makes it this finding's alone). A detected finding's alert ends ALERT_VALID_FOR from now: every tick
    re-posts it while its record is open (refresh), as Prometheus re-sends an active alert. A resolved one
    ended at its resolution, put ALERT_CLOCK_SKEW earlier: Alertmanager keeps the later end of two posts
    unless the newer one is resolved *by its own clock* (types.Alert.Merge), so an end in its future, for a
    clock behind ours, would leave the alert firing. A reported one (no episode) lasts ALERT_TTL."""
    kind = kind_of(finding)
    severity = severity_of(finding, kind)
    labels = {"alertname": kind.alertname, "severity": severity,
              **{k: v for k, v in finding.labels.items() if v and k not in ("alertname", "severity", "cluster")}}
    if settings.cluster:
        labels["cluster"] = settings.cluster
    annotations = {"summary": wording.clip(wording.summary(finding), 1000),
                   "description": wording.clip(wording.description(finding), 4000),
                   "runbook_url": f"{settings.runbook_base}#{kind.runbook}"}
    resolved = finding.state == "resolved"
    if resolved:
        ends = min(finding.resolved_at or now, now) - settings.clock_skew
    elif finding.state == "detected":
        ends = now + settings.valid_for
    else:
        ends = now + settings.alert_ttl
    # Alertmanager refuses an alert that ends before it starts ("start time must be before end time").
    starts = min(finding.opened_at or now, now, ends) if finding.state != "reported" else now
    return Alert(labels, annotations, starts, ends, resolved), severity


def one_per_labels(alerts: list[Alert]) -> tuple[Alert, ...]:
    """One alert per label set in one body to Alertmanager: a firing one over a resolved one. Alertmanager
    merges a body's alerts in order, the later winning, so a finding that ended and another that opened
    under the same labels, in one summary, would otherwise be posted as ended."""
    kept: dict[str, Alert] = {}
    for alert in alerts:
        held = kept.get(alert.fingerprint)
        if held is None or (held.resolved and not alert.resolved):
            kept[alert.fingerprint] = alert
    return tuple(kept.values())


def decide(event_type: str, found: list[Received], settings: Settings, now: datetime) -> Verdict:
    """Which alerts to send for these findings."""
    if event_type.startswith(f"{PREFIX}{FUNCTION}."):
        return Verdict("drop", "alert-forwarder's own event (never forwarded: no loop)")
    floor = SEVERITIES.index(settings.min_severity)
    alerts: list[Alert] = []
    below: list[str] = []  # the severities of the findings dropped (no alert is made for them: most are info)
    for finding in found:
        severity = severity_of(finding, kind_of(finding))
        if SEVERITIES.index(severity) >= floor:
            alerts.append(to_alert(finding, settings, now)[0])
        else:
            below.append(severity)
    if not alerts and not below:
        return Verdict("drop", "the event carries no finding")
    if not alerts:
        return Verdict("drop", below_threshold(below[0], settings))
    state = "resolved" if all(a.resolved for a in alerts) else "firing"
    listed = ", ".join(sorted({f"{a.labels['alertname']} {wording.identity(a.labels)}" for a in alerts}))
    dropped = f" ({len(below)} below MIN_SEVERITY)" if below else ""
    if not settings.alertmanager and not settings.webhook:
        return Verdict("drop", f"no receiver configured (set ALERTMANAGER_URL or WEBHOOK_URL) for {state}: {listed}")
    return Verdict("forward", f"{state}: {listed}{dropped}", tuple(alerts))


def refresh(on_record: list[Received], settings: Settings, now: datetime) -> Verdict:
    """A tick: what Alertmanager must hold, from the findings on record (the ledger is the truth). Every open
    one is re-posted firing; one resolved within ALERT_RESOLVED_FOR is re-posted resolved (Prometheus re-sends
    a resolved alert for 15 minutes: rules/alerting.go resolvedRetention), so an Alertmanager that restarted,
    or missed the notice, holds the right state within a tick. Only Alertmanager gets them: it deduplicates
    by labels, while a webhook would take every re-post for a new message."""
    if not settings.alertmanager:
        return Verdict("drop", "no ALERTMANAGER_URL: nothing to keep alive (webhooks get one message per notice)")
    floor = SEVERITIES.index(settings.min_severity)
    alerts: list[Alert] = []
    for finding in on_record:
        if finding.state == "resolved" and (finding.resolved_at is None
                                            or now - finding.resolved_at > settings.resolved_for):
            continue
        alert, severity = to_alert(finding, settings, now)
        if SEVERITIES.index(severity) >= floor:
            alerts.append(alert)
    kept = one_per_labels(alerts)
    firing = sum(not a.resolved for a in kept)
    reason = (f"{firing} firing and {len(kept) - firing} resolved alert(s) re-posted from {len(on_record)} "
              f"finding(s) on record")
    return Verdict("refresh" if kept else "drop", reason, kept)

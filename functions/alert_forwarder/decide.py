"""alert-forwarder's pure part: which finding becomes which alert, with which severity, and what each receiver
is sent of it: `decide(facts, settings, now) -> Verdict`. Every fact is an argument; nothing here does I/O, and
nothing here is worded (wording.py says it).

Alertmanager does grouping, silencing, inhibition and routing; this function only turns a finding into an
alert whose labels are the finding's identity (docs/findings.md), so a repeat keeps the same alert alive and
a resolved finding ends it. No code path per producer: a table says, per category, the alert's name, its
default severity and its runbook. What a receiver is sent of a notice depends on the finding's record (its
episode and state) and on what that receiver already accepted (receipts.py): docs/alert-forwarder.md,
"Exactly once, in order".
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property

from functions.alert_forwarder.categories import CATEGORIES
from functions.alert_forwarder.receipts import Claim, OnRecord, Position, firing, resolved
from functions.alert_forwarder.received import PREFIX, Received
from functions.alert_forwarder.settings import ALERTMANAGER, FUNCTION, Settings, Target
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


# -- findings → alerts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    """One finding's alert: its labels and its time span (wording.py gives its annotations)."""

    labels: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    resolved: bool
    finding: Received
    kind: Kind

    @cached_property
    def fingerprint(self) -> str:
        """The digest of its labels (the webhook's X-Vmevents-Alert: kept as it was, for receivers that dedupe)."""
        return hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode()).hexdigest()[:16]


def to_alert(finding: Received, settings: Settings, now: datetime) -> Alert:
    """The alert for one finding. Its labels are the finding's identity (with the digest that makes it this
    finding's alone). A detected finding's alert ends ALERT_VALID_FOR from now: every tick re-posts it while its
    record is open (refresh), as Prometheus re-sends an active alert. A resolved one ended at its resolution, put
    ALERT_CLOCK_SKEW earlier: of two posts Alertmanager keeps the later end unless the newer one has ended *by its
    own clock* (docs/facts.md §11), so an end in its future, for a clock behind ours, would leave the alert firing.
    A reported one (no episode) lasts ALERT_TTL."""
    kind = kind_of(finding)
    labels = {"alertname": kind.alertname, "severity": severity_of(finding, kind),
              **{k: v for k, v in finding.labels.items() if v and k not in ("alertname", "severity", "cluster")}}
    if settings.cluster:
        labels["cluster"] = settings.cluster
    resolved_ = finding.state == "resolved"
    if resolved_:
        ends = min(finding.resolved_at or now, now) - settings.clock_skew
    elif finding.state == "detected":
        ends = now + settings.valid_for
    else:
        ends = now + settings.alert_ttl
    # Alertmanager refuses an alert that ends before it starts ("start time must be before end time").
    starts = min(finding.opened_at or now, now, ends) if finding.state != "reported" else now
    return Alert(labels, starts, ends, resolved_, finding, kind)


def one_per_labels(alerts: Iterable[Alert]) -> tuple[Alert, ...]:
    """One alert per label set in one body to Alertmanager: a firing one over a resolved one. Alertmanager
    merges a body's alerts in order, the later winning, so a finding that ended and another that opened
    under the same labels, in one summary, would otherwise be posted as ended."""
    kept: dict[str, Alert] = {}
    for alert in alerts:
        held = kept.get(alert.fingerprint)
        if held is None or (held.resolved and not alert.resolved):
            kept[alert.fingerprint] = alert
    return tuple(kept.values())


# -- the decision ---------------------------------------------------------------------------------
DROP, FORWARD, REFRESH = "drop", "forward", "refresh"
# The reasons of a verdict, or of a finding's plan (wording.py words each).
OWN_EVENT, NO_FINDING, BELOW, NO_RECEIVER, NO_ALERTMANAGER = "own", "none", "below", "no-receiver", "no-alertmanager"
SEND, SENT, ENDED, OTHER_LIFE, BUSY, UNREAD = "send", "sent", "ended", "other-life", "busy", "unread"


@dataclass(frozen=True)
class Facts:
    """What one decision is made from: an event's findings, each with its record once read (a notice), or a page
    of the findings on record (a tick)."""

    event_type: str
    found: Sequence[Received] = ()
    # found[i]'s record, as read: () before any is read; None for a finding whose record is not there (any more).
    records: Sequence[OnRecord | None] = ()
    tick: bool = False


@dataclass(frozen=True)
class Send:
    """What one receiver is sent of one finding, in order, and its receipt once it accepted each (`steps`, one per
    alert; None: no receipt kept, for a finding without a record)."""

    target: Target
    alerts: tuple[Alert, ...]
    steps: tuple[Position | None, ...]

    @property
    def reaches(self) -> Position | None:
        return self.steps[-1]


@dataclass(frozen=True)
class Plan:
    """What becomes of one finding of a notice: its `reason` (SEND, or why nothing is sent), and the sends."""

    finding: Received
    reason: str
    sends: tuple[Send, ...] = ()
    record: OnRecord | None = None
    busy: Claim | None = None


@dataclass(frozen=True)
class Verdict:
    """What decide() says: what to do (`action`) and why (`reason`, a code: wording.py says it)."""

    action: str                        # DROP | FORWARD | REFRESH
    reason: str
    plans: tuple[Plan, ...] = ()       # a notice's: one per finding at or above MIN_SEVERITY
    alerts: tuple[Alert, ...] = ()     # a tick's: what Alertmanager must hold, from this page of records
    below: tuple[str, ...] = ()        # the severities of the findings dropped below MIN_SEVERITY
    resolved_skipped: int = 0          # a tick's: resolved records past ALERT_RESOLVED_FOR


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """What to send for these facts. A notice's findings first come without their records: a finding that names
    one is planned UNREAD (read it, then decide again with it); the others are planned as their notice says."""
    if facts.tick:
        return _refresh(facts.found, settings, now)
    if facts.event_type.startswith(f"{PREFIX}{FUNCTION}."):
        return Verdict(DROP, OWN_EVENT)
    floor = SEVERITIES.index(settings.min_severity)
    kept: list[tuple[Received, OnRecord | None]] = []
    below: list[str] = []  # the severities of the findings dropped (no alert is made for them: most are info)
    records = facts.records or (None,) * len(facts.found)
    for finding, record in zip(facts.found, records, strict=True):
        severity = severity_of(finding, kind_of(finding))
        if SEVERITIES.index(severity) >= floor:
            kept.append((finding, record))
        else:
            below.append(severity)
    if not kept:
        return Verdict(DROP, BELOW if below else NO_FINDING, below=tuple(below))
    if not settings.targets:
        return Verdict(DROP, NO_RECEIVER, alerts=tuple(to_alert(f, settings, now) for f, _ in kept),
                        below=tuple(below))
    plans = tuple(_plan(f, r, bool(facts.records), settings, now) for f, r in kept)
    return Verdict(FORWARD, SEND, plans, below=tuple(below))


def _plan(finding: Received, record: OnRecord | None, read: bool, settings: Settings, now: datetime) -> Plan:
    """One finding of a notice: what each receiver is sent of it."""
    episode = finding.episode if finding.state in ("detected", "resolved") else None
    if finding.record is None or episode is None:  # nothing to judge it by: sent as it says, at least once
        return _as_said(finding, settings, now)
    if not read:
        return Plan(finding, UNREAD)
    if record is not None and _identity(record.finding) != _identity(finding):
        record = None  # the Event it names is another finding's: nothing of this one is kept there, or read from it
    if record is None:  # its record is gone (deleted, or expired): sent as it says, at least once
        return _as_said(finding, settings, now)
    if record.episode < episode or (record.episode == episode and None not in (record.opened_at, finding.opened_at)
                                    and record.opened_at != finding.opened_at):
        return Plan(finding, OTHER_LIFE, record=record)  # of an Event that expired: its receipts went with it
    sends = []
    for target in settings.targets:
        accepted = record.accepted(target.id)
        if target.kind == ALERTMANAGER:  # a state, not a stream: it gets the record's, whatever the notice
            if accepted < record.position:
                sends.append(Send(target, (to_alert(record.finding, settings, now),), (record.position,)))
        elif finding.state == "detected":  # a stream of messages: one firing per episode while it is open ...
            if record.position == firing(episode) and accepted < firing(episode):
                sends.append(Send(target, (to_alert(finding, settings, now),), (firing(episode),)))
        elif accepted < resolved(episode):  # ... and its resolved, after the firing it never got, if it did not
            owed = accepted < firing(episode)
            alerts = (to_alert(replace(finding, state="detected"), settings, now),) if owed else ()
            sends.append(Send(target, (*alerts, to_alert(finding, settings, now)),
                              (firing(episode), resolved(episode)) if owed else (resolved(episode),)))
    # A firing notice of an episode that ended is never sent firing (docs/facts.md §11: Alertmanager would take its
    # later end for a new one and fire again, and a webhook would end on FIRING); Alertmanager still gets the record.
    ended = finding.state == "detected" and record.position != firing(episode)
    if not sends:
        return Plan(finding, ENDED if ended else SENT, record=record)
    if record.claim is not None and record.claim.until > now:
        return Plan(finding, BUSY, record=record, busy=record.claim)
    return Plan(finding, ENDED if ended else SEND, tuple(sends), record)


def _as_said(finding: Received, settings: Settings, now: datetime) -> Plan:
    """Sent to every receiver as the notice says, no receipt kept: at least once."""
    return Plan(finding, SEND, tuple(Send(t, (to_alert(finding, settings, now),), (None,)) for t in settings.targets))


def _identity(finding: Received) -> tuple[str, str, str | None, str]:
    return finding.function, finding.category, finding.subject, finding.key


def _refresh(on_record: Sequence[Received], settings: Settings, now: datetime) -> Verdict:
    """A tick's page: what Alertmanager must hold, from the findings on record (the ledger is the truth). Every
    open one is re-posted firing; one resolved within ALERT_RESOLVED_FOR is re-posted resolved (Prometheus re-sends
    a resolved alert for 15 minutes: rules/alerting.go resolvedRetention), so an Alertmanager that restarted, or
    missed the notice, holds the right state within a tick. Only Alertmanager gets them: it deduplicates by labels,
    while a webhook would take every re-post for a new message."""
    if not settings.alertmanager:
        return Verdict(DROP, NO_ALERTMANAGER)
    floor = SEVERITIES.index(settings.min_severity)
    alerts: list[Alert] = []
    below: list[str] = []
    skipped = 0
    for finding in on_record:
        if finding.state == "resolved" and (finding.resolved_at is None
                                            or now - finding.resolved_at > settings.resolved_for):
            skipped += 1
            continue
        alert = to_alert(finding, settings, now)
        if SEVERITIES.index(alert.labels["severity"]) >= floor:
            alerts.append(alert)
        else:
            below.append(alert.labels["severity"])
    return Verdict(REFRESH, SEND, alerts=one_per_labels(alerts), below=tuple(below), resolved_skipped=skipped)

"""alert-forwarder's I/O: deliver the other functions' findings to Alertmanager and webhooks, where
operators already look, and keep Alertmanager's alerts in step with the findings on record.

Reads top to bottom: parse (which findings a reply event carries; received.py) → decide (pure: the
alerts, or a drop with its reason) → act (POST to every configured receiver) → report (the log
line). A PingSource tick is a refresh: the findings on record (every function's finding Events, from
the watch cache: its one API call) are re-posted to Alertmanager, as Prometheus re-sends its alerts,
so that an Alertmanager that restarted or lost a post holds the right alerts again within a tick.

A receiver that is down or throttling answers 503, one that refuses the alert 502: the broker
retries and, after its retries, dead-letters the finding, so none is lost silently.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from functions.alert_forwarder import transport, wording
from functions.alert_forwarder.decide import Alert, below_threshold, decide, given_severity, one_per_labels, refresh
from functions.alert_forwarder.received import PREFIX, findings, on_record
from functions.alert_forwarder.settings import FUNCTION, Settings, read_headers, read_token
from functions.alert_forwarder.transport import ReceiverRefused
from shared import metrics
from shared.declaration import SEVERITIES
from shared.environ import environ_get
from shared.errors import TemporaryError, VmeventsError, longest_retry_after
from shared.finding import RESOLVED
from shared.intake import MAX_SUBJECT, Incoming
from shared.ledger import every_record
from shared.runtime import KubeContext, Outcome


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return tick(ctx)
    verdict = decide(event.type, findings(event), ctx.settings, ctx.clock())
    if verdict.action == "drop":
        return Outcome("drop", subject=event.subject, reason=verdict.reason)
    sent = deliver(verdict.alerts, event, ctx.settings)
    return Outcome("forward", effect="+".join(sent), subject=event.subject, reason=verdict.reason)


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool | Outcome:
    """The prefilter: a finding below MIN_SEVERITY (most of what arrives is info) answered with the drop the
    handler would come to, from its data decoded and nothing built from it (no event, no finding, no alert).
    Only an event the handler would certainly drop, with this reason, is answered here: a binary-mode reply of
    another function (application/json, specversion 1.0, id, source, a subject intake accepts) whose data is
    one finding, or a summary of findings, each naming a severity (decide.given_severity) below MIN_SEVERITY.
    Anything else, a finding without a severity (its category's default applies), a malformed or odd one
    included, is decoded and handled the long way, which says what is wrong with it. The severity is read from
    the data, never from a header: a header that said "info" would drop whatever the finding says it is."""
    floor = _RANK[settings.min_severity]
    get = environ_get(headers)  # each header a dict lookup in the WSGI environ, where the runtime gives one
    event_type = get("HTTP_CE_TYPE")
    if not floor or get("CONTENT_TYPE") != "application/json" or event_type is None \
            or not event_type.startswith(PREFIX) or event_type.startswith(_OWN) \
            or get("HTTP_CE_SPECVERSION") != "1.0" or not get("HTTP_CE_ID") or not get("HTTP_CE_SOURCE"):
        return True
    subject = get("HTTP_CE_SUBJECT")
    if subject is not None and (len(subject) > MAX_SUBJECT or not subject.isprintable()):
        return True
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True
    if data.__class__ is not dict:
        return True
    items = data.get("findings")
    if items is None:
        items = (data,)
    elif items.__class__ is not list or not items:
        return True
    first = ""
    for item in items:
        if item.__class__ is not dict:
            return True
        given = item.get("severity")
        severity = _GIVEN.get(given) if given.__class__ is str else None  # decide.given_severity, remembered
        if severity is None:
            severity = given_severity(given)
            if severity is None or _RANK[severity] >= floor:
                return True
            # The spellings seen (a sender's own are few); a flood of odd ones is not kept.
            if len(_GIVEN) < 64 and isinstance(given, str):
                _GIVEN[given] = severity
        elif _RANK[severity] >= floor:
            return True
        identity = item.get("identity")
        if identity.__class__ is dict:  # the handler makes labels of its values: a nested one is its to refuse
            for value in identity.values():
                if value.__class__ is dict or value.__class__ is list:
                    return True
        first = first or severity
    drop = _DROPS.get((first, settings.min_severity))
    if drop is None:  # one per severity and threshold: the log line takes the subject from the request
        drop = _DROPS[first, settings.min_severity] = Outcome("drop", reason=below_threshold(first, settings))
    return drop


_OWN = f"{PREFIX}{FUNCTION}."  # alert-forwarder's own replies: decide drops them for another reason
_DROPS: dict[tuple[str, str], Outcome] = {}
_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
_GIVEN: dict[str, str] = {}  # a severity as a finding writes it ("info", " INFO ", "notice") → given_severity's


def tick(ctx: KubeContext[Settings]) -> Outcome:
    """Re-post every finding on record to Alertmanager (decide.refresh says which, and how). Without
    ALERTMANAGER_URL nothing is read."""
    if not ctx.settings.alertmanager:
        return Outcome("drop", reason=refresh([], ctx.settings, ctx.clock()).reason)
    now = ctx.clock()
    records = [on_record(r.finding.data(r.state), "detected" if r.open else RESOLVED, r.opened_at, r.resolved_at)
               for r in every_record(ctx.kube)]
    verdict = refresh(records, ctx.settings, now)
    if verdict.action == "drop":
        return Outcome("refresh", effect="none", reason=verdict.reason)
    _send_alertmanager(verdict.alerts, ctx.settings)
    return Outcome("refresh", effect="alertmanager", reason=verdict.reason)


def deliver(alerts: tuple[Alert, ...], event: Incoming, settings: Settings) -> list[str]:
    """POST to every receiver; every one is tried even if another failed, and any failure makes the
    whole event fail so the broker redelivers it (Alertmanager merges a repeat into the same alert)."""
    sent: list[str] = []
    failures: list[VmeventsError] = []
    if settings.alertmanager:
        failures += _post_alertmanager(alerts, settings)
        sent.append("alertmanager")
    if settings.webhook:
        hook = settings.webhook
        headers = read_headers(hook.credentials_file) if hook.credentials_file else {}
        payload_of = wording.slack_message if settings.webhook_format == "slack" else wording.webhook_payload
        for alert in alerts:  # one message per finding, whatever the labels: each episode's own pair
            failures += _post("the webhook", hook.urls[0], payload_of(alert, event, settings),
                              {"X-Vmevents-Alert": alert.fingerprint, **headers}, hook.verify, settings.timeout,
                              credentials=tuple(headers), allowed=settings.redirect_origins)
        sent.append(f"webhook-{settings.webhook_format}")
    _raise(failures)
    return sent


def _send_alertmanager(alerts: tuple[Alert, ...], settings: Settings) -> None:
    _raise(_post_alertmanager(alerts, settings))


def _post_alertmanager(alerts: tuple[Alert, ...], settings: Settings) -> list[VmeventsError]:
    am = settings.alertmanager
    assert am is not None
    token = read_token(am.credentials_file) if am.credentials_file else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = [alert.postable() for alert in one_per_labels(list(alerts))]
    failures: list[VmeventsError] = []
    for url in am.urls:  # every replica: Alertmanager replicas do not share alerts
        failures += _post("Alertmanager", f"{url}/api/v2/alerts", body, headers, am.verify, settings.timeout,
                          allowed=settings.redirect_origins)
    return failures


def _post(name: str, *args: Any, **kwargs: Any) -> list[VmeventsError]:
    """transport.post, counted per receiver and result (docs/metrics.md)."""
    failures = transport.post(name, *args, **kwargs)
    result = "delivered" if not failures else "retried" if isinstance(failures[0], TemporaryError) else "refused"
    metrics.DELIVERIES.inc(FUNCTION, "alertmanager" if name == "Alertmanager" else "webhook", result)
    return failures


def _raise(failures: list[VmeventsError]) -> None:
    if failures:
        temporary = [f for f in failures if isinstance(f, TemporaryError)]
        message = "; ".join(f.message for f in failures)
        if temporary:
            raise TemporaryError(message, retry_after=longest_retry_after(temporary))
        raise ReceiverRefused(message)

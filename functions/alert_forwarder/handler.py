"""alert-forwarder's I/O: deliver the other functions' findings to Alertmanager and webhooks, where
operators already look, and keep Alertmanager's alerts in step with the findings on record.

Reads top to bottom: parse (which findings a reply event carries; finding.py) → decide (pure: the
alerts, or a drop with its reason) → act (POST to every configured receiver) → report (the log
line). A PingSource tick is a refresh: the findings on record (every function's finding Events, from
the watch cache: its one API call) are re-posted to Alertmanager, as Prometheus re-sends its alerts,
so that an Alertmanager that restarted or lost a post holds the right alerts again within a tick.

A receiver that is down or throttling answers 503, one that refuses the alert 502: the broker
retries and, after its retries, dead-letters the finding, so none is lost silently.
"""
from __future__ import annotations

from functions.alert_forwarder import wording
from functions.alert_forwarder.decide import Alert, decide, one_per_labels, refresh
from functions.alert_forwarder.finding import findings, on_record
from functions.alert_forwarder.settings import Settings, read_headers, read_token
from functions.alert_forwarder.transport import ReceiverRefused
from functions.alert_forwarder.transport import post as _post
from shared.errors import TemporaryError, VmeventsError, longest_retry_after
from shared.findings import RESOLVED, every_record
from shared.intake import Incoming
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


def _raise(failures: list[VmeventsError]) -> None:
    if failures:
        temporary = [f for f in failures if isinstance(f, TemporaryError)]
        message = "; ".join(f.message for f in failures)
        if temporary:
            raise TemporaryError(message, retry_after=longest_retry_after(temporary))
        raise ReceiverRefused(message)

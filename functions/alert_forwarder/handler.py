"""alert-forwarder's I/O: deliver the other functions' findings to Alertmanager and webhooks, where
operators already look.

Reads top to bottom: parse (which findings a reply event carries; finding.py) → decide (pure: the
alerts, or a drop with its reason) → act (POST to every configured receiver) → report (the log
line). It needs no Kubernetes API access at all.

A receiver that is down or throttling answers 503, one that refuses the alert 502: the broker
retries and, after its retries, dead-letters the finding, so none is lost silently.
"""
from __future__ import annotations

from functions.alert_forwarder import wording
from functions.alert_forwarder.decide import Alert, decide
from functions.alert_forwarder.finding import findings
from functions.alert_forwarder.settings import Settings, read_headers, read_token
from functions.alert_forwarder.transport import ReceiverRefused
from functions.alert_forwarder.transport import post as _post
from shared.errors import TemporaryError, VmeventsError, longest_retry_after
from shared.intake import Incoming
from shared.runtime import Context, Outcome


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: Context[Settings]) -> Outcome:
    verdict = decide(event.type, findings(event), ctx.settings, ctx.clock())
    if verdict.action == "drop":
        return Outcome("drop", subject=event.subject, reason=verdict.reason)
    sent = deliver(verdict.alerts, event, ctx.settings)
    return Outcome("forward", effect="+".join(sent), subject=event.subject, reason=verdict.reason)


def deliver(alerts: tuple[Alert, ...], event: Incoming, settings: Settings) -> list[str]:
    """POST to every receiver; every one is tried even if another failed, and any failure makes the
    whole event fail so the broker redelivers it (Alertmanager merges a repeat into the same alert)."""
    sent: list[str] = []
    failures: list[VmeventsError] = []
    if settings.alertmanager:
        am = settings.alertmanager
        token = read_token(am.credentials_file) if am.credentials_file else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = [alert.postable() for alert in alerts]
        for url in am.urls:  # every replica: Alertmanager replicas do not share alerts
            failures += _post("Alertmanager", f"{url}/api/v2/alerts", body, headers, am.verify, settings.timeout,
                              allowed=settings.redirect_origins)
        sent.append("alertmanager")
    if settings.webhook:
        hook = settings.webhook
        headers = read_headers(hook.credentials_file) if hook.credentials_file else {}
        payload_of = wording.slack_message if settings.webhook_format == "slack" else wording.webhook_payload
        for alert in alerts:
            failures += _post("the webhook", hook.urls[0], payload_of(alert, event, settings),
                              {"X-Vmevents-Alert": alert.fingerprint, **headers}, hook.verify, settings.timeout,
                              credentials=tuple(headers), allowed=settings.redirect_origins)
        sent.append(f"webhook-{settings.webhook_format}")
    if failures:
        temporary = [f for f in failures if isinstance(f, TemporaryError)]
        message = "; ".join(f.message for f in failures)
        if temporary:
            raise TemporaryError(message, retry_after=longest_retry_after(temporary))
        raise ReceiverRefused(message)
    return sent

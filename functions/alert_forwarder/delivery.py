"""A notice's delivery, once to each receiver: for each finding, read its record → decide → claim → send → confirm.

A finding that names its record (every notice of shared/ledger.py does: `record`) is judged by it: decide.py says
what each receiver is still owed of it, from the episode on record and what that receiver accepted (receipts.py).
Before anything is sent, this delivery's claim is written on the finding's Event with the resourceVersion it read as
precondition: of two deliveries at once (a redelivery after the broker's timeout, two replicas, the `.resolved`
overtaking its `.detected`), one claims and sends, and the other gets a Conflict, reads again and decides again (it
then sees the claim and answers 503, so the broker brings it back once the claim is over). After sending, the
receipts of the receivers that accepted are written, and the claim cleared, in one patch. A claim lapses after
`CLAIM_FOR`, so a delivery that died (a killed pod) holds nobody up for longer; a delivery killed between its send
and its receipt is the one case a receiver may get a message twice.

A finding without a record (vmi-cleanup's reported ones; a reply from a producer that keeps none), or whose record is
gone, is sent as the notice says, at least once (the broker's redeliveries may repeat it).

The findings of one event are delivered a few at once, within the delivery's budget (shared/rescan.py: below the
Trigger's 30 s): a summary carrying more than that finishes on the broker's redeliveries, each finding's receipts
saying what is done.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from functions.alert_forwarder import transport, wording
from functions.alert_forwarder.decide import BUSY, UNREAD, Alert, Facts, Plan, Send, decide, one_per_labels
from functions.alert_forwarder.receipts import (
    CLAIM,
    RECEIPTS,
    Claim,
    OnRecord,
    Position,
    advance,
    read_claim,
    read_receipts,
    write_claim,
    write_receipts,
)
from functions.alert_forwarder.received import Received, of_record
from functions.alert_forwarder.settings import ALERTMANAGER, FUNCTION, Settings, Target, read_headers, read_token
from functions.alert_forwarder.transport import ReceiverRefused
from shared import metrics, rescan
from shared.errors import TemporaryError, VmeventsError, longest_retry_after
from shared.finding import RESOLVED
from shared.intake import Incoming
from shared.kinds import EVENT
from shared.kube import Conflict, Kube
from shared.ledger import record_of
from shared.runtime import Context

ATTEMPTS = 8
# How long a claim holds a finding: the Trigger's delivery timeout twice. A delivery checks it before each send.
CLAIM_FOR = rescan.DELIVERY_TIMEOUT * 2
WORKERS = 4  # findings of one event delivered at once
CHUNK = 500  # alerts per body to Alertmanager (tick.py CHUNK_ALERTS)


@dataclass
class Delivered:
    """What one event's delivery did: per finding, its plan as last decided, what was accepted, what failed."""

    plans: list[Plan] = field(default_factory=list)
    sent: list[Alert] = field(default_factory=list)
    receivers: set[str] = field(default_factory=set)
    errors: list[VmeventsError] = field(default_factory=list)
    stopped: int = 0  # findings not reached within the budget

    def raise_errors(self) -> None:
        """Fail the event when a finding failed: 503 when any failure is temporary, else 502."""
        if not self.errors:
            return
        message = "; ".join(dict.fromkeys(e.message for e in self.errors))
        temporary = [e for e in self.errors if isinstance(e, TemporaryError)]
        if temporary:
            raise TemporaryError(message, retry_after=longest_retry_after(temporary))
        raise ReceiverRefused(message)


def deliver(event: Incoming, plans: Sequence[Plan], ctx: Context[Settings]) -> Delivered:
    done = Delivered()
    direct = [plan for plan in plans if plan.reason != UNREAD]
    if direct:
        _deliver_directly(event, direct, ctx.settings, done)
    unread = [plan for plan in plans if plan.reason == UNREAD]
    if not unread:
        return done
    kube: Kube = getattr(ctx, "kube")  # noqa: B009 - a finding with a record needs the function's client

    def visit(plan: Plan) -> tuple[Plan, list[Alert], set[str], list[VmeventsError]]:
        try:
            return _once(event, plan.finding, kube, ctx)
        except VmeventsError as exc:
            return plan, [], set(), [exc]

    scan = rescan.run(unread, visit, rescan.Settings(workers=WORKERS), subject=lambda p: p.finding.category)
    for plan, sent, receivers, errors in scan.results:
        done.plans.append(plan)
        done.sent += sent
        done.receivers |= receivers
        done.errors += errors
    if scan.failures:  # not a VmeventsError: a fault of ours, answered 500 (the broker retries it)
        raise RuntimeError("; ".join(f"{f.subject}: {f.message}" for f in scan.failures))
    if scan.stopped:
        done.stopped = len(unread) - scan.visited
        done.errors.append(TemporaryError(wording.unfinished(scan.visited, len(unread))))
    return done


def _deliver_directly(event: Incoming, plans: Sequence[Plan], settings: Settings, done: Delivered) -> None:
    """Findings with no record to judge them by, sent as their notices say: to each Alertmanager replica in bodies
    of one alert per label set (the firing one winning: decide.one_per_labels), to the webhook one message each."""
    done.plans += plans
    for target in settings.targets:
        alerts = [alert for plan in plans for send in plan.sends if send.target == target for alert in send.alerts]
        if not alerts:
            continue
        if target.kind == ALERTMANAGER:
            kept = one_per_labels(alerts)
            errors = [e for i in range(0, len(kept), CHUNK) for e in post_alertmanager(kept[i:i + CHUNK], target,
                                                                                        settings)]
            done.receivers.add(ALERTMANAGER)
        else:
            errors = [e for alert in alerts for e in _post_webhook((alert,), target, event, settings)[1]]
            done.receivers.add(f"webhook-{settings.webhook_format}")
        done.errors += errors
        if not errors:
            done.sent += alerts


def _once(event: Incoming, finding: Received, kube: Kube, ctx: Context[Settings]
          ) -> tuple[Plan, list[Alert], set[str], list[VmeventsError]]:
    """One finding with a record: read, decide, claim, send, confirm; a lost race reads again and decides again."""
    assert finding.record is not None
    namespace, name = finding.record
    for _ in range(ATTEMPTS):
        record = read(kube, namespace, name)
        now = ctx.clock()
        plan = decide(Facts(event.type, (finding,), (record,)), ctx.settings, now).plans[0]
        if plan.reason == BUSY:
            raise TemporaryError(wording.busy(plan), retry_after=_seconds(plan, now))
        if not plan.sends:
            return plan, [], set(), []
        if plan.record is None:  # gone, or another finding's: sent as the notice says, at least once
            taken, receivers, errors = _send(event, plan.sends, ctx.settings, None)
            return plan, _accepted(plan.sends, taken), receivers, errors
        claim = Claim(secrets.token_hex(8), now + CLAIM_FOR)
        try:
            claimed = _claim(kube, plan.record, claim)
        except Conflict:
            continue  # someone else wrote it first (a producer's sighting, another delivery's claim): again
        deadline = time.monotonic() + (CLAIM_FOR - rescan.DELIVERY_TIMEOUT).total_seconds()
        taken, receivers, errors = _send(event, plan.sends, ctx.settings, deadline)
        _confirm(kube, claimed, claim, _reached(plan.sends, taken))
        return plan, _accepted(plan.sends, taken), receivers, errors
    raise Conflict(wording.kept_changing(namespace, name))


def _seconds(plan: Plan, now: datetime) -> float | None:
    return max(1.0, (plan.busy.until - now).total_seconds()) if plan.busy else None


# -- the record ------------------------------------------------------------------------------------
def read(kube: Kube, namespace: str, name: str) -> OnRecord | None:
    """The finding's Event as a delivery judges it (a quorum read: never older than the notice), or None."""
    event = kube.get(EVENT, namespace, name)
    return on_record_of(event) if event else None


def on_record_of(event: dict[str, Any]) -> OnRecord | None:
    record = record_of(event)
    if record is None:
        return None
    notes = (event.get("metadata") or {}).get("annotations") or {}
    finding = of_record(record.finding, "detected" if record.open else RESOLVED, record.opened_at,
                        record.resolved_at, record.episode, (record.namespace, record.name))
    return OnRecord(record.namespace, record.name, record.resource_version, finding, record.episode, record.open,
                    record.opened_at, read_receipts(notes.get(RECEIPTS)), read_claim(notes.get(CLAIM)))


def _claim(kube: Kube, record: OnRecord, claim: Claim) -> OnRecord:
    """Write this delivery's claim at the version read: a Conflict when anyone wrote the Event since."""
    written = kube.merge_patch(EVENT, record.namespace, record.name, {"metadata": {
        "resourceVersion": record.resource_version, "annotations": {CLAIM: write_claim(claim)}}})
    found = on_record_of(written)
    if found is None:
        raise Conflict(wording.not_a_finding(record.namespace, record.name))
    return found


def _confirm(kube: Kube, record: OnRecord, claim: Claim, reached: dict[str, Any]) -> None:
    """The receipts of what was accepted, and the claim cleared, at the version last read. A producer's write in
    between (a sighting) is a Conflict: read again and write again, while the claim is still this one's; a claim
    that lapsed and was taken meanwhile is cleared by its new holder, and the receipts only ever move forward."""
    for _ in range(ATTEMPTS):
        notes: dict[str, Any] = {RECEIPTS: write_receipts(advance(record.receipts, reached))}
        if record.claim is not None and record.claim.by == claim.by:
            notes[CLAIM] = None
        try:
            kube.merge_patch(EVENT, record.namespace, record.name, {"metadata": {
                "resourceVersion": record.resource_version, "annotations": notes}})
            return
        except Conflict:
            again = read(kube, record.namespace, record.name)
            if again is None:
                return
            record = again
    raise Conflict(wording.receipts_unwritten(record.namespace, record.name))


# -- sending --------------------------------------------------------------------------------------
def _send(event: Incoming, sends: Sequence[Send], settings: Settings, deadline: float | None
          ) -> tuple[dict[str, int], set[str], list[VmeventsError]]:
    """POST each send's alerts to its receiver, in order; every receiver is tried even if another failed. How many of
    its alerts each target accepted (a webhook that took the firing message it was owed and failed on the resolved
    one took one), the kinds of receiver posted to, and the failures."""
    taken: dict[str, int] = {}
    receivers: set[str] = set()
    failures: list[VmeventsError] = []
    for send in sends:
        if deadline is not None and time.monotonic() > deadline:
            failures.append(TemporaryError(wording.claim_ran_out(send.target.kind)))
            continue
        if send.target.kind == ALERTMANAGER:
            errors = post_alertmanager(send.alerts, send.target, settings)
            count = 0 if errors else len(send.alerts)
            receivers.add(ALERTMANAGER)
        else:
            count, errors = _post_webhook(send.alerts, send.target, event, settings)
            receivers.add(f"webhook-{settings.webhook_format}")
        failures += errors
        if count:
            taken[send.target.id] = count
    return taken, receivers, failures


def _reached(sends: Sequence[Send], taken: dict[str, int]) -> dict[str, Position]:
    """Each target's receipt once it accepted `taken` of its alerts."""
    steps = {send.target.id: send.steps[taken[send.target.id] - 1] for send in sends if send.target.id in taken}
    return {target: step for target, step in steps.items() if step is not None}


def _accepted(sends: Sequence[Send], taken: dict[str, int]) -> list[Alert]:
    """The alerts the receivers accepted (for the log line)."""
    return [alert for send in sends for alert in send.alerts[:taken.get(send.target.id, 0)]]


def _post_webhook(alerts: Sequence[Alert], target: Target, event: Incoming, settings: Settings
                  ) -> tuple[int, list[VmeventsError]]:
    """One message per alert, in order (a firing the webhook never got, then its resolved); the first failure
    stops the rest, so a resolved message never goes without its firing one. How many it accepted, and the error."""
    hook = settings.webhook
    assert hook is not None
    headers = read_headers(hook.credentials_file) if hook.credentials_file else {}
    payload_of = wording.slack_message if settings.webhook_format == "slack" else wording.webhook_payload
    for taken, alert in enumerate(alerts):
        errors = _post("the webhook", target.url, payload_of(alert, event, settings),
                       {"X-Vmevents-Alert": alert.fingerprint, **headers}, hook.verify, settings.timeout,
                       credentials=tuple(headers), allowed=settings.redirect_origins)
        if errors:
            return taken, errors
    return len(alerts), []


def post_alertmanager(alerts: Sequence[Alert] | bytes, target: Target, settings: Settings) -> list[VmeventsError]:
    """One body to one Alertmanager replica: alerts, or a body already encoded (a tick's chunk)."""
    am = settings.alertmanager
    assert am is not None
    token = read_token(am.credentials_file) if am.credentials_file else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = alerts if isinstance(alerts, bytes) else [wording.postable(a, settings) for a in alerts]
    return _post("Alertmanager", f"{target.url}/api/v2/alerts", body, headers, am.verify, settings.timeout,
                 allowed=settings.redirect_origins)


def _post(name: str, *args: Any, **kwargs: Any) -> list[VmeventsError]:
    """transport.post, counted per receiver and result (docs/metrics.md): every post of an event's delivery and of a
    tick's pages goes through here."""
    failures = transport.post(name, *args, **kwargs)
    result = "delivered" if not failures else "retried" if isinstance(failures[0], TemporaryError) else "refused"
    metrics.DELIVERIES.inc(FUNCTION, ALERTMANAGER if name == "Alertmanager" else "webhook", result)
    return failures

"""migration-report's I/O: explain every failed or nearly timed-out live migration, once, with KubeVirt's numbers.

KubeVirt says little when a live migration fails (harvester#3429, #8539, #8617) and no KubeVirt alert
covers it (docs/facts.md §4). This function re-reads the objects KubeVirt used — the migration, the VMI,
the VM, the KubeVirt CR, the MigrationPolicies, KubeVirt's own Events — decides (decide.py, with analysis.py:
the policy it chose, the effective configuration, the data size rounded up to decimal GB, the completion budget
and the progress timeout, the category), and reports once: a Kubernetes Event on the VMI and its VM, and a reply
CloudEvent with the whole report (wording.py). The flow: on_event and rescan → converge → read → decide →
report; the helpers follow in that order.

"Once" is the finding's life (shared/ledger.py): a reported migration is a finding kept in one Event on
the VMIM. Before reading anything else, one LIST of that VMIM's finding Events tells whether it was reported;
a duplicate or a re-scan finds it and stays quiet, and a redelivery of the event that reported it gets the
same reply. The re-scan ends the finding (`.resolved`) when a later migration of the VMI has ended, the VMI
is gone or restarted, or MIGRATION_RESOLVED_AFTER has passed (decide.ended), and renews it until then. Only
migrations that ended within MIGRATION_REPORT_WITHIN (default 30m) are considered at all.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from functions.migration_report import cursor
from functions.migration_report.analysis import VMIM_KIND, migration_state
from functions.migration_report.decide import Action, Facts, Verdict, decide, ended, precheck
from functions.migration_report.settings import Settings
from functions.migration_report.wording import finding, reply_data, resolved_message
from shared import kubevirt as kv
from shared import metrics
from shared import objects as o
from shared import rescan as rescans
from shared.finding import summary
from shared.intake import Incoming, about, may_concern
from shared.kinds import EVENT, KUBEVIRT, MIGRATION_POLICY, NAMESPACE, VM, VMI, VMIM
from shared.ledger import Ledger, Notice, Record
from shared.replies import Reply
from shared.runtime import KubeContext, Outcome
from shared.settings import format_duration

FUNCTION = "migration-report"
REASON_FAILED = "MigrationFailed"            # vmevents' own reasons: KubeVirt has none called so (docs/facts.md §4)
REASON_NEAR_TIMEOUT = "MigrationNearTimeout"
REASON_FINDING = "MigrationReport"           # the finding's own Event, on the VMIM
REASON_RESOLVED = "MigrationReportResolved"


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    vmim = ctx.kube.get(VMIM, found.namespace, found.name)
    if vmim is None:
        return Outcome("gone", subject=event.subject, reason="the migration no longer exists")
    return converge(vmim, ctx, event.id)


def rescan(ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """The VMIMs that changed since the last tick (a watch from the cursor), or without a cursor every VMIM's
    Table row (from the watch cache), and this function's findings on record; a final migration not on record
    that precheck cannot rule out is read in full and converged (a final one missed by its events is reported
    now, once); then every reported migration that still stands: ended (resolved, judged from what was seen),
    or renewed so that its Event outlives the TTL. Visits run through shared/rescan.py: a few at once, within
    the re-scan's budget, each one's failure its own (the re-scan still answers and lists it). The cursor
    advances only after a tick without failures (cursor.py). With a cursor, a tick whose changes need no look
    reads the findings only every MIGRATION_SETTLE_EVERY (cursor.settle_due). Why the cheap reads miss nothing:
    docs/api-cost.md."""
    began, now = rescans.begin(), ctx.clock()
    stored = cursor.read(ctx.kube, ctx.settings.cursor)
    namespaces: list[str | None] = [*sorted(ctx.settings.namespaces)] or [None]  # None: every namespace
    since = {namespace: (stored.data.get(cursor.key(namespace)) if stored else None) for namespace in namespaces}
    parts = rescans.gather(namespaces, lambda namespace: cursor.scan(ctx.kube, namespace, since[namespace],
                                                                     ctx.settings, now), ctx.settings.rescan)
    ruled_in = [found for part in parts for found in part.candidates]
    why: str | None = "listed"  # why this tick settles the findings on record; None: it need not
    if ctx.settings.cursor is not None and not any(part.listed for part in parts):
        why = "a change to look at" if ruled_in else cursor.settle_due(stored, ctx.settings, now, delivery)
    if why is None:  # nothing changed that matters, and the findings were settled a moment ago
        cursor.save(ctx.kube, ctx.settings.cursor, stored, parts)
        return Outcome("rescan", reason=f"{_seen(parts)}, none to look at; the findings on record were settled "
                                        f"within MIGRATION_SETTLE_EVERY={format_duration(ctx.settings.settle_every)}")
    ledger = _ledger(ctx)
    before = list(ledger.records(state=None, cached=True))  # stale is safe: see Ledger.records, converge
    known = {record.finding.key for record in before}
    listed = [b for part in parts for b in part.briefs]
    # A reported migration no longer on record (its Event lost) is a candidate again, changed or not.
    lost = [where for uid, where in cursor.remembered(stored).items() if uid not in known]
    wheres = {(namespace, name) for namespace, name, uid in ruled_in if uid not in known} | set(lost)
    candidates = sorted((Target(*where) for where in wheres), key=lambda found: (found.namespace, found.name))
    rotation = rescans.tick_number(now)
    scan = rescans.run(candidates, lambda found: _visit(found, ctx, delivery), ctx.settings.rescan,
                       started=began, rotation=rotation)
    replies = list(scan.results)
    on_record = list(ledger.records(state=None)) if scan.visited else before  # an event may have reported one
    # Listed, every VMIM is known: a record of one not listed (deleted since) stays quiet.
    here = {uid for part in parts for uid in part.uids} if all(part.listed for part in parts) else None

    def resolve(record: Record) -> Reply | None:
        if not record.open:  # a redelivered tick answers as it did
            replayed = ledger.replay(record, delivery)
            return replayed.reply() if replayed is not None else None
        notice = _maybe_resolve(record, listed, ledger, ctx, delivery)
        return notice.reply() if notice is not None else None

    # A redelivery of the tick that reported a migration answers with that report again (its VMIM, on
    # record now, is no candidate); one this run reported is among the visits' replies already.
    replies += [replayed.reply() for record in on_record if record.open and record.finding.key in known
                and (here is None or record.finding.key in here)
                and (replayed := ledger.replay(record, delivery)) is not None]
    settled = rescans.run(sorted(on_record, key=lambda r: (r.namespace, r.name)), resolve, ctx.settings.rescan,
                          subject=lambda r: f"{r.namespace}/{r.name}", started=began, rotation=rotation)
    replies += settled.results
    ledger.renew_stale(on_record, ctx.clock())
    done = not (scan.failures or scan.stopped or settled.failures or settled.stopped)
    if done:
        cursor.save(ctx.kube, ctx.settings.cursor, stored, parts, reported=cursor.recent(on_record, ctx.settings, now),
                    settled_at=now, replied_by=delivery if replies else None)
    reason = f"{_seen(parts)}, {len(replies)} finding(s) reported or resolved; {scan.progress()}"
    if why != "listed":
        reason += f"; settled the findings on record ({why})"
    if settled.failures or settled.stopped:
        reason += f"; findings on record: {settled.progress()}"
    if not done and ctx.settings.cursor is not None:
        reason += "; the cursor stays, the next tick sees these changes again"
    reply = summary(FUNCTION, "scanned", "/vmevents/migration-report/rescan", replies, reason,
                    {"migrations": sum(part.count for part in parts)})
    if reply is None:
        return Outcome("rescan", reason=reason)
    return Outcome("rescan", effect=f"reported-{len(replies)}", reason=reason, reply=reply)


def _seen(parts: list[cursor.Seen]) -> str:
    listed = sum(part.count for part in parts if part.listed)
    changed = sum(part.count for part in parts if not part.listed)
    said = [f"listed {listed} migration(s)"] if any(part.listed for part in parts) else []
    said += [f"{changed} change(s) since the cursor"] if not all(part.listed for part in parts) else []
    said += [part.why_listed for part in parts if part.why_listed]
    return ", ".join(said)


def _visit(found: Target, ctx: KubeContext[Settings], delivery: str) -> Reply | None:
    """One candidate of the re-scan: the VMIM read in full (its row may be stale), then converged."""
    vmim = ctx.kube.get(VMIM, found.namespace, found.name)
    return None if vmim is None else converge(vmim, ctx, delivery).reply


def converge(vmim: dict, ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    subject = kv.api_path(vmim)
    skip = precheck(vmim, ctx.settings, ctx.clock())
    if skip:
        metrics.DECISIONS.inc(FUNCTION, "skip", "precheck", metrics.trigger())
        return Outcome("skip", subject=subject, reason=skip)
    reported = already_reported(ctx, vmim)
    if reported is not None:
        replayed = Ledger.replay(reported, delivery)  # the event that reported it, delivered again
        if replayed is not None:
            return Outcome("replay", effect=f"replayed-{replayed.transition}", subject=subject,
                           reason="a redelivery of the event that reported it: the same reply", reply=replayed.reply())
        metrics.DECISIONS.inc(FUNCTION, "skip", "already-reported", metrics.trigger())
        return Outcome("skip", subject=subject, reason="already reported")
    vmi, vm = read_vmi_and_vm(vmim, ctx)
    recipients = [obj for obj in (vmi, vm) if obj is not None] or [vmim]
    facts = gather(vmim, vmi, vm, ctx)
    verdict = decide(facts, ctx.settings, ctx.clock())
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value, str(verdict.report.get("category") or ""),
                          metrics.trigger())
    if verdict.action is Action.SKIP:
        return Outcome("skip", subject=subject, reason=verdict.reason)
    return report(verdict, facts, recipients, ctx, delivery)


# -- parse: which migration is this event about? (no API calls) -----------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str


def target(event: Incoming, settings: Settings) -> Target | None:
    """The VMIM worth a fresh look, or None when the event cannot concern a report."""
    found = about(event, (VMIM_KIND,), FUNCTION)
    namespace = found.ref.namespace or "default"  # about() already defaults it so
    if found.deleted or not settings.in_scope(namespace):
        return None
    if found.obj is not None and kv.phase(found.obj) not in kv.FINAL_PHASES:
        return None
    return Target(namespace, found.ref.name)


_FINAL_TOKENS = (b'"Failed"', b'"Succeeded"')


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode VMIM event whose JSON names no final phase anywhere is a migration still under way:
    answered without decoding it. It can only err towards decoding; the re-scan catches anything missed."""
    return may_concern(headers, body, (VMIM_KIND,), _FINAL_TOKENS)


# -- read: fresh, everything KubeVirt used ----------------------------------------------------------
def read_vmi_and_vm(vmim: dict, ctx: KubeContext[Settings]) -> tuple[dict | None, dict | None]:
    """The migrated VMI (None when gone, or when it is a newer VMI of the same name: a restart since) and its VM."""
    namespace, vmi_name = kv.meta(vmim)["namespace"], o.string(vmim, "spec", "vmiName")
    if not vmi_name:
        return None, None
    vmi = ctx.kube.get(VMI, namespace, vmi_name)
    if vmi is not None and _newer(vmi, vmim):
        vmi = None
    owner = kv.controller_owner(vmi, "VirtualMachine") if vmi is not None else None
    if vmi is not None and owner is None:
        return vmi, None  # a standalone VMI
    return vmi, ctx.kube.get(VM, namespace, owner["name"] if owner else vmi_name)


def already_reported(ctx: KubeContext[Settings], vmim: dict) -> Record | None:
    """The finding this migration was reported as, if any (open or resolved): one LIST of its Events."""
    meta = kv.meta(vmim)
    found = _ledger(ctx).records(meta.get("namespace") or "default", state=None,
                                 field_selector=f"involvedObject.uid={meta.get('uid')}")
    return next(iter(found), None)


def gather(vmim: dict, vmi: dict | None, vm: dict | None, ctx: KubeContext[Settings]) -> Facts:
    """Fresh reads of everything else KubeVirt used for this migration."""
    kubevirt = next(iter(ctx.kube.list(KUBEVIRT)), None)
    policies = tuple(ctx.kube.list(MIGRATION_POLICY))
    state = migration_state(vmim, vmi)
    needs_match = policies and not state.get("migrationPolicyName") and state.get("migrationConfiguration") is None
    ns = ctx.kube.get(NAMESPACE, None, kv.meta(vmim)["namespace"]) \
        if needs_match and vmi is not None and kv.meta(vmi).get("labels") else None
    events = _kubevirt_events(ctx, vmim, vmi, state) if kv.phase(vmim) == "Failed" else ()
    return Facts(vmim, vmi, vm, kubevirt, policies, ns, events)


def _newer(vmi: dict, vmim: dict) -> bool:
    created, asked = kv.parse_time(kv.meta(vmi).get("creationTimestamp")), \
        kv.parse_time(kv.meta(vmim).get("creationTimestamp"))
    return bool(created and asked and created > asked)


def _kubevirt_events(ctx: KubeContext[Settings], vmim: dict, vmi: dict | None, state: dict) -> tuple[dict, ...]:
    """KubeVirt's own Events, read only when migrationState has no failureReason (KubeVirt < 1.3, or a
    failure the controller saw rather than libvirt): on the VMIM, on the VMI, and the scheduler's on the
    target pods when KubeVirt said the target was unschedulable."""
    if state.get("failureReason"):
        return ()
    namespace = kv.meta(vmim)["namespace"]
    found = list(ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.uid={kv.meta(vmim)['uid']}"))
    if vmi is not None:
        found += ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.uid={kv.meta(vmi)['uid']}")
    if any(e.get("reason") == "migrationTargetPodUnschedulable" for e in found):
        prefix = f"virt-launcher-{(vmim.get('spec') or {}).get('vmiName')}-"
        source_pod = state.get("sourcePod")
        scheduled = ctx.kube.list(EVENT, namespace, field_selector="reason=FailedScheduling,involvedObject.kind=Pod")
        found += [e for e in scheduled if e["involvedObject"].get("name", "").startswith(prefix)
                  and e["involvedObject"]["name"] != source_pod]
    return tuple(e for e in found if (e.get("source") or {}).get("component") != FUNCTION)


# -- report: the finding (on the VMIM), an Event on each recipient, and the reply --------------------
def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASON_FINDING, REASON_RESOLVED)


def report(verdict: Verdict, facts: Facts, recipients: list[dict], ctx: KubeContext[Settings],
           delivery: str = "") -> Outcome:
    notice = verdict.notice
    assert notice is not None, "a REPORT verdict names its notice"
    data = reply_data(verdict, facts, ctx.settings)
    message = data["message"]
    reason = REASON_FAILED if notice == "failed" else REASON_NEAR_TIMEOUT
    subject = kv.api_path(facts.vmim)
    found = _ledger(ctx).sighted(finding(data, facts, notice), facts.vmim, delivery, ctx.clock(), message=message)
    if found is None:  # another delivery of it reported it a moment ago
        return Outcome("skip", subject=subject, reason="already reported")
    for obj in recipients:  # for people: on the VMI and its VM, where they look
        ctx.recorder.record(obj, "Warning", reason, message, ctx.clock())
    return Outcome(f"report-{notice}", effect=f"reported-{data['category']}", subject=subject, reason=message,
                   reply=found.reply())


def _maybe_resolve(record: Record, listed: list[dict], ledger: Ledger, ctx: KubeContext[Settings],
                   delivery: str) -> Notice | None:
    details = record.finding.details
    namespace, _, name = str(details.get("vmi") or "").partition("/")
    # Gone? Restarted? Its uid says. From the watch cache, which lags but loses nothing: a VMI it does not show is
    # gone or too new to be the migrated one (either ends the finding); a stale one only resolves a little later.
    vmi = ctx.kube.get_metadata(VMI, namespace or record.namespace, name, cached=True) if name else None
    why = ended(details, vmi, listed, record.opened_at, ctx.settings, ctx.clock())
    if why is None:
        return None
    message = resolved_message(details, why)
    notice = ledger.resolve(record, delivery, ctx.clock(), summary=message, details={"because": why},
                            message=message)
    if notice is not None and vmi is not None:
        ctx.recorder.record(vmi, "Normal", REASON_RESOLVED, message, ctx.clock())
    return notice

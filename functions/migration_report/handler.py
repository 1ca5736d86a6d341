"""migration-report's I/O: explain every failed or nearly timed-out live migration, once, with KubeVirt's numbers.

KubeVirt says little when a live migration fails (harvester#3429, #8539, #8617) and no KubeVirt alert
covers it (docs/facts.md §4). This function re-reads the objects KubeVirt used — the migration, the VMI,
the VM, the KubeVirt CR, the MigrationPolicies, KubeVirt's own Events — decides (decide.py: the policy it
chose, the effective configuration, the data size rounded up to decimal GB, the completion budget and the
progress timeout, the category), and reports once: a Kubernetes Event on the VMI and its VM, and a reply
CloudEvent with the whole report (wording.py). The flow: on_event and rescan → converge → read → decide →
report; the helpers follow in that order.

"Once" keeps no memory of its own: the Event this function records on the VMI *is* the record. Before
reporting it looks for its own Event naming the migration's uid; a duplicate or re-scan finds it and
stays quiet. Events expire (kube-apiserver --event-ttl, 1h by default), so only migrations that ended
within MIGRATION_REPORT_WITHIN (default 30m, keep it under the TTL) are considered at all.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from functions.migration_report.decide import VMIM_KIND, Action, Facts, Verdict, decide, migration_state, precheck
from functions.migration_report.settings import Settings
from functions.migration_report.wording import reply_data
from shared import kubevirt as kv
from shared import objects as o
from shared import rescan as rescans
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, KUBEVIRT, MIGRATION_POLICY, NAMESPACE, VM, VMI, VMIM
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome

FUNCTION = "migration-report"
REASON_FAILED = "MigrationFailed"            # vmevents' own reasons: KubeVirt has none called so (docs/facts.md §4)
REASON_NEAR_TIMEOUT = "MigrationNearTimeout"


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    vmim = ctx.kube.get(VMIM, found.namespace, found.name)
    if vmim is None:
        return Outcome("gone", subject=event.subject, reason="the migration no longer exists")
    return converge(vmim, ctx)


def rescan(ctx: KubeContext[Settings]) -> Outcome:
    """Every VMIM's phase and metadata (Table rows, from the watch cache): one that is final and may have
    ended within MIGRATION_REPORT_WITHIN is read in full and converged, a few at once within the re-scan's
    budget (shared/rescan.py): a final one missed by its events is reported now (once). docs/api-cost.md."""
    began, now, scanned, candidates = rescans.begin(), ctx.clock(), 0, []
    namespaces: list[str | None] = [*sorted(ctx.settings.namespaces)] or [None]  # None: every namespace
    for namespace in namespaces:
        for row in ctx.kube.list_rows(VMIM, namespace, cached=True):
            scanned += 1
            if row["cells"].get("phase") in kv.FINAL_PHASES and may_have_ended_within(row["metadata"], ctx.settings,
                                                                                      now):
                candidates.append(Target(row["metadata"].get("namespace") or "default", row["metadata"]["name"]))

    def visit(found: Target) -> dict | None:
        vmim = ctx.kube.get(VMIM, found.namespace, found.name)
        if vmim is None or precheck(vmim, ctx.settings, now):
            return None
        reply = converge(vmim, ctx).reply
        return None if reply is None else {"type": reply.type, **reply.data}

    scan = rescans.run(candidates, visit, ctx.settings.rescan, rotation=rescans.tick_number(now), started=began)
    reported = sorted(scan.results, key=lambda r: r["uid"])
    reason = f"scanned {scanned} migration(s), reported {len(reported)}; {scan.progress()}"
    if not reported:
        return Outcome("rescan", reason=reason)
    reply = Reply(reply_type(FUNCTION, "scanned"), "/vmevents/migration-report/rescan",
                  {"scanned": scanned, "reported": reported}, key="|".join(r["uid"] for r in reported))
    return Outcome("rescan", effect=f"reported-{len(reported)}", reason=reason, reply=reply)


def may_have_ended_within(meta: dict, settings: Settings, now: datetime) -> bool:
    """From a VMIM's metadata alone: in scope, and not written since before MIGRATION_REPORT_WITHIN. Every
    write stamps managedFields[].time (second precision), and the final phase is a write, so a migration
    last written before the window ended before it too; without managedFields, it may have."""
    if not settings.in_scope(meta.get("namespace") or "default"):
        return False
    times = [kv.parse_time(entry.get("time")) for entry in meta.get("managedFields") or () if isinstance(entry, dict)]
    known = [t for t in times if t is not None]
    return not known or len(known) < len(times) or now - max(known) <= settings.within + timedelta(seconds=1)


def converge(vmim: dict, ctx: KubeContext[Settings]) -> Outcome:
    subject = kv.api_path(vmim)
    skip = precheck(vmim, ctx.settings, ctx.clock())
    if skip:
        return Outcome("skip", subject=subject, reason=skip)
    vmi, vm = read_vmi_and_vm(vmim, ctx)
    recipients = [obj for obj in (vmi, vm) if obj is not None] or [vmim]
    if already_reported(ctx, recipients[0], vmim):
        return Outcome("skip", subject=subject, reason="already reported")
    facts = gather(vmim, vmi, vm, ctx)
    verdict = decide(facts, ctx.settings, ctx.clock())
    if verdict.action is Action.SKIP:
        return Outcome("skip", subject=subject, reason=verdict.reason)
    return report(verdict, facts, recipients, ctx)


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


def already_reported(ctx: KubeContext[Settings], recipient: dict, vmim: dict) -> bool:
    """Our own Event on the first recipient names this migration's uid: it was reported. (A Failed
    migration is only ever reported as MigrationFailed, a Succeeded one as MigrationNearTimeout.)"""
    meta = kv.meta(recipient)
    reason = REASON_FAILED if kv.phase(vmim) == "Failed" else REASON_NEAR_TIMEOUT
    events = ctx.kube.list(EVENT, meta.get("namespace") or "default",
                           field_selector=f"involvedObject.uid={meta.get('uid')},reason={reason}")
    uid = f"(uid {kv.meta(vmim)['uid']})"
    return any((e.get("source") or {}).get("component") == FUNCTION and uid in (e.get("message") or "")
               for e in events)


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


# -- report: an Event on each recipient, and the reply ----------------------------------------------
def report(verdict: Verdict, facts: Facts, recipients: list[dict], ctx: KubeContext[Settings]) -> Outcome:
    notice = verdict.notice
    assert notice is not None, "a REPORT verdict names its notice"
    data = reply_data(verdict, facts, ctx.settings)
    message = data["message"]
    reason = REASON_FAILED if notice == "failed" else REASON_NEAR_TIMEOUT
    for obj in recipients:
        ctx.recorder.record(obj, "Warning", reason, message, ctx.clock())
    subject = kv.api_path(facts.vmim)
    reply = Reply(reply_type(FUNCTION, notice), subject, data, key=f"{kv.meta(facts.vmim)['uid']}/{notice}")
    return Outcome(f"report-{notice}", effect=f"reported-{data['category']}", subject=subject, reason=message,
                   reply=reply)

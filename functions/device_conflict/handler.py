"""device-conflict's I/O: tell the operator when a VM's passthrough device was taken by another VM.

This function never changes a VM: it reports, with a Warning Event on each VM involved and a reply
CloudEvent. Reads top to bottom: an event → parse (is it worth a look, with no API call) → fetch
(one paginated LIST of VMs, and of VMIs when needed, folded into the small index of index.py) →
decide (pure) → report (the finding's life, shared/findings.py: a reply only when a conflict opens or
ends). A PingSource tick is a re-scan: every VM and VMI, and the conflicts still open, so that a
conflict that ended is said to have ended and one that lasts outlives its Event's TTL.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from functions.device_conflict import wording
from functions.device_conflict.decide import DeviceConflict, decide, find_conflicts
from functions.device_conflict.index import (
    ALLOCATION_ANNOTATION,
    FINAL,
    Index,
    Ref,
    Workload,
    allocated_devices,
    spec_devices,
    unschedulable,
    vm_devices,
)
from functions.device_conflict.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared.findings import Ledger, Notice, Record, one_or_summary, summary
from shared.intake import Incoming, about, may_concern
from shared.kube import VM, VMI
from shared.runtime import KubeContext, Outcome

REASON = "HostDeviceConflict"
RESOLVED_REASON = "HostDeviceConflictResolved"
CATEGORY = "vmevents.io/finding-category"  # on the plain Events: which category of conflict they are about


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event, ctx.settings, ctx.clock())
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return check(found, event.subject, ctx, event.id)


def rescan(ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """Every VM and VMI, page by page: catches missed events, keeps what is open from expiring, and is
    where a conflict ends. `delivery`: the tick's id (a redelivered tick answers as it did)."""
    index = Index()
    for vm in ctx.kube.list(VM):
        index.add_vm(vm)
    for vmi in ctx.kube.list(VMI):
        index.add_vmi(vmi)
    workloads = index.workloads()
    current = find_conflicts(workloads)
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None))  # the resolved ones too: a redelivered tick answers as it did
    still_open = [r for r in on_record if r.open]
    replayed = [n for r in on_record if not r.open and (n := ledger.replay(r, delivery))]
    # A conflict seen now is a sighting that raises no count: it opens a finding the events missed (or one
    # whose Event expired while nobody ran), and renews an open one whose last write is getting old.
    notices = [n for c in current if (n := _sighted(c, ledger, ctx, delivery, count=False))]
    detected = len(notices)
    by_id = {w.ref.id: w for w in workloads}
    keys = {c.key for c in current}
    for record in still_open:
        if record.finding.key not in keys and (n := _resolve(record, current, by_id, ledger, ctx, delivery)):
            notices.append(n)
    notices += replayed
    reason = (f"scanned {index.vms_seen} VM(s) and {index.vmis_seen} VMI(s): {len(current)} conflict(s), "
              f"{detected} new, {len(notices) - detected} resolved")
    reply = summary(FUNCTION, "scanned", f"/vmevents/{FUNCTION}/rescan", [n.reply() for n in notices], reason,
                    {"vms": index.vms_seen, "vmis": index.vmis_seen})
    return Outcome("rescan", effect="reported" if reply else "none", reason=reason, reply=reply)


def check(found: Target, subject: str | None, ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """One VM's conflicts: one LIST of VMs, and one of VMIs only if another VM shares a device."""
    index = Index()
    for vm in ctx.kube.list(VM):
        index.add_vm(vm)
    if found.devices is not None and not index.touches_others(found.id, found.devices):
        return Outcome("no-conflict", subject=subject,
                       reason=f"no other VM names or holds a device of {found.id}")
    for vmi in ctx.kube.list(VMI):
        index.add_vmi(vmi)
    verdict = decide(found.id, index.workloads())
    if not verdict.conflicts:
        return Outcome(verdict.action, subject=subject, reason=verdict.reason)
    ledger = _ledger(ctx)
    notices = [n for c in verdict.conflicts if (n := _sighted(c, ledger, ctx, delivery, count=True))]
    if not notices:  # seen again: its Event's count rose, and nothing is announced
        return Outcome(verdict.action, effect="seen-again", subject=subject, reason=verdict.reason)
    reply = one_or_summary(FUNCTION, subject or f"/vmevents/{FUNCTION}", [n.reply() for n in notices],
                           verdict.reason)
    return Outcome(verdict.action, effect="reported", subject=subject, reason=verdict.reason, reply=reply)


# -- parse: is this event worth a look? (no API calls) -------------------------------------------
_DEVICE_TOKENS = (b'"hostDevices"', b'"gpus"', ALLOCATION_ANNOTATION.encode())
_KINDS = ("VirtualMachine", "VirtualMachineInstance")


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """The cheap pre-check on raw bytes: a Resource-mode VM or VMI event whose JSON has no
    hostDevices, gpus or allocation annotation anywhere names no device, so it cannot concern a
    conflict and is not decoded. It can only err towards decoding."""
    return may_concern(headers, body, _KINDS, _DEVICE_TOKENS)


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str                             # the VM's name (a VMI's VM has the same name)
    devices: frozenset[str] | None = None  # device names the payload mentions (a hint)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


def target(event: Incoming, settings: Settings, now: datetime) -> Target | None:
    """The VM worth a conflict check, or None when the event cannot concern one."""
    found = about(event, _KINDS, FUNCTION)
    if found.deleted:
        return None  # what a deletion ends, the next re-scan reports
    if found.obj is None:  # Reference mode: look at it in any case
        return Target(found.ref.namespace or "default", found.ref.name)
    obj, meta = found.obj, kv.meta(found.obj)
    if obj["kind"] == "VirtualMachine":
        devices = vm_devices(obj) | (allocated_devices(obj) or frozenset())
    else:
        devices = spec_devices(obj.get("spec")) if _vmi_worth_a_look(obj, settings, now) else frozenset()
    if not devices:
        return None
    return Target(meta.get("namespace") or "default", meta["name"], frozenset(d.name for d in devices))


def _vmi_worth_a_look(vmi: dict, settings: Settings, now: datetime) -> bool:
    """A VMI that may just have taken a device (starting, just bound or just running), or that
    cannot be scheduled for want of a device."""
    phase = kv.phase(vmi)
    if phase in FINAL:
        return False
    if "Insufficient " in (unschedulable(vmi) or ""):
        return True
    if phase in ("", "Pending", "Scheduling", "Scheduled"):
        return True
    since = kv.phase_since(vmi, phase)
    return since is None or now - since <= settings.recent_start


# -- report: the finding's life (shared/findings.py), Events for people --------------------------------
def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASON)


def _sighted(conflict: DeviceConflict, ledger: Ledger, ctx: KubeContext[Settings], delivery: str, *,
             count: bool) -> Notice | None:
    """The conflict is there: its finding lives on the first VM it keeps from starting; the other VMs
    involved get a plain Event when it opens or is seen again by an event."""
    now = ctx.clock()
    notice = ledger.sighted(wording.finding(conflict), conflict.blocked[0].involved(), delivery, now, count=count)
    if notice is not None or count:
        for ref in conflict.involved[1:] if conflict.holder is None else (conflict.holder,):
            ctx.recorder.record(ref.involved(), "Warning", REASON, wording.conflict_message(conflict), now,
                                annotations={CATEGORY: conflict.category.value})
    return notice


def _resolve(record: Record, current: tuple[DeviceConflict, ...], workloads: Mapping[str, Workload],
             ledger: Ledger, ctx: KubeContext[Settings], delivery: str) -> Notice | None:
    """Resolve a conflict that is no longer seen, and say why on every VM involved."""
    data = record.finding.details
    because = wording.why_resolved(data, current, workloads)
    message = wording.resolved_message(data, because)
    notice = ledger.resolve(record, delivery, ctx.clock(), summary=message, details={"because": because})
    if notice is not None:
        people = sorted(set(data.get("blocked") or ()) | ({data["holder"]} if data.get("holder") else set()))
        for vm in people:
            ctx.recorder.record(_ref(vm, workloads).involved(), "Normal", RESOLVED_REASON, message, ctx.clock())
    return notice


def _ref(vm: str, workloads: Mapping[str, Workload]) -> Ref:
    """The VM "namespace/name", with its uid when it still exists (a deleted one keeps an Event without one)."""
    known = workloads.get(vm)
    namespace, name = vm.split("/", 1)
    return Ref(namespace, name, uid=(known.ref.uid if known else None) or "")


"""device-conflict's I/O: tell the operator when a VM's passthrough device was taken by another VM.

This function never changes a VM: it reports, with a Warning Event on each VM involved and a reply
CloudEvent. Reads top to bottom: an event → parse (is it worth a look, with no API call) → fetch
(the VMs that share a device with the event's VM, and their VMIs, one GET each, folded into the small
index of index.py) →
decide (pure) → report (Events, reply). A PingSource tick is a re-scan: every VM and VMI, and the
HostDeviceConflict Events on record, so that a conflict that ended is said to have ended.
Both keep the parameter object current (which VM each device is assigned to, assignment.py), which
the ValidatingAdmissionPolicy of deploy/components/prevent reads, and which tells an event which few
VMs to read (reads.py).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from functions.device_conflict import reads, wording
from functions.device_conflict.decide import (
    CONFLICT_ANNOTATION,
    RESOLVED_AT_ANNOTATION,
    DeviceConflict,
    Recorded,
    decide,
    find_conflicts,
    plan,
    recorded_from,
)
from functions.device_conflict.index import (
    ALLOCATION_ANNOTATION,
    FINAL,
    Ref,
    Workload,
    allocated_devices,
    spec_devices,
    unschedulable,
    vm_devices,
)
from functions.device_conflict.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, Conflict
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome

REASON = "HostDeviceConflict"
RESOLVED_REASON = "HostDeviceConflictResolved"
BATCH = "batch"  # one answer carries one reply: several changes at once go out as one batch reply


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings, ctx.clock())
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return check(found, event.subject, ctx)


def rescan(ctx: KubeContext[Settings]) -> Outcome:
    """Every VM and VMI, page by page: catches missed events, repairs the parameter object (read before the
    LISTs, so that what events wrote meanwhile is kept) and is where a conflict ends."""
    where = ctx.settings.assignments
    base = reads.read(ctx.kube, where)
    index = reads.scan(ctx.kube)
    workloads = index.workloads()
    reads.keep_all(ctx.kube, where, base, workloads)
    current = find_conflicts(workloads)
    recorded = [r for r in map(recorded_from, ctx.kube.list(EVENT, field_selector=f"reason={REASON}")) if r]
    todo = plan(current, recorded)
    for conflict, ref in todo.record:
        _record(conflict, ref, ctx)
    by_id = {w.ref.id: w for w in workloads}
    resolved = [r for events in todo.resolved if (r := _resolve(events, current, by_id, ctx))]
    reason = (f"scanned {index.vms_seen} VM(s) and {index.vmis_seen} VMI(s): {len(current)} conflict(s), "
              f"{len(todo.detected)} new, {len(resolved)} resolved")
    reply = _reply([_detected(c) for c in todo.detected], resolved, f"/vmevents/{FUNCTION}/rescan")
    return Outcome("rescan", effect="reported" if reply else "none", reason=reason, reply=reply)


def check(found: Target, subject: str | None, ctx: KubeContext[Settings]) -> Outcome:
    """One VM's conflicts, among the VMs the parameter object says share a device with it (read fresh, one
    GET each); the object's entries for its devices are written back when they changed."""
    seen = reads.around(ctx.kube, ctx.settings.assignments, found.id)
    if not seen.sharing:
        return Outcome("no-conflict", subject=subject,
                       reason=f"no other VM names or holds a device of {found.id}")
    verdict = decide(found.id, seen.workloads)
    if not verdict.conflicts:
        return Outcome(verdict.action, subject=subject, reason=verdict.reason)
    for conflict in verdict.conflicts:
        for ref in conflict.involved:
            _record(conflict, ref, ctx)
    return Outcome(verdict.action, effect="reported", subject=subject, reason=verdict.reason,
                   reply=_reply([_detected(c) for c in verdict.conflicts], [], subject or f"/vmevents/{FUNCTION}"))


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


# -- report ---------------------------------------------------------------------------------------
def _record(conflict: DeviceConflict, ref: Ref, ctx: KubeContext[Settings]) -> None:
    stored = json.dumps({"key": conflict.key, "conflict": wording.reply_data(conflict)}, sort_keys=True)
    ctx.recorder.record(ref.involved(), "Warning", REASON, wording.conflict_message(conflict), ctx.clock(),
                        annotations={CONFLICT_ANNOTATION: stored})


def _resolve(events: tuple[Recorded, ...], current: tuple[DeviceConflict, ...], workloads: Mapping[str, Workload],
             ctx: KubeContext[Settings]) -> Reply | None:
    """Mark a conflict's open Events resolved (at their current count) and say so. An Event that
    changed meanwhile (the conflict was seen again) is left open: the next re-scan decides."""
    marked = []
    for event in events:
        try:
            ctx.kube.merge_patch(EVENT, event.namespace, event.name, {"metadata": {
                "resourceVersion": event.resource_version,
                "annotations": {RESOLVED_AT_ANNOTATION: str(event.count)}}})
        except Conflict:
            continue
        marked.append(event)
    if not marked:
        return None
    data = dict(marked[0].data, because=wording.why_resolved(marked[0].data, current, workloads))
    for ref in sorted({e.involved for e in marked}):
        ctx.recorder.record(ref.involved(), "Normal", RESOLVED_REASON, wording.resolved_message(data), ctx.clock())
    blocked = data.get("blocked") or [data.get("holder")]
    return Reply(reply_type(FUNCTION, "resolved"), _path(blocked[0]), data, key=marked[0].key)


def _detected(conflict: DeviceConflict) -> Reply:
    return Reply(reply_type(FUNCTION, "detected"), conflict.blocked[0].api_path(), wording.reply_data(conflict),
                 key=conflict.key)


def _path(vm: str) -> str:
    namespace, name = vm.split("/", 1)
    return Ref(namespace, name).api_path()


def _reply(detected: list[Reply], resolved: list[Reply], subject: str) -> Reply | None:
    """One answer carries one reply: a single change as itself, several as one batch."""
    changes = detected + resolved
    if not changes:
        return None
    if len(changes) == 1:
        return changes[0]
    return Reply(reply_type(FUNCTION, BATCH), subject, wording.batch_data(detected, resolved),
                 key="|".join(sorted(r.id for r in changes)))

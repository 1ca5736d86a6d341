"""device-conflict: tell the operator when a VM's passthrough device was taken by another VM.

Nothing on the API path stops two VMs naming the same PCI device or vGPU; only Harvester's UI does
(FACTS.md §3, harvester#5253). The seed (../shared/seeds/harvester-issue-auto-clean-vmi.txt, last
comments) shows the result: vm1 powers itself off, its pod completes and frees the device, vm2 is
created naming the same device and starts, and vm1 can no longer start ("0/1 nodes are available:
1 Insufficient intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"). This function never changes a
VM: it reports, with a Warning Event on each VM involved and a reply CloudEvent.

Reads top to bottom: settings → parse (is this event worth a look, with no API call) → fetch (one
paginated LIST of VMs, and of VMIs when needed, folded into a small index of the VMs that have
devices) → decide (pure: `find_conflicts`, and for a re-scan `plan`) → act/report (Events, reply).

"Resolved" needs no memory: every HostDeviceConflict Event carries its conflict in the annotation
`vmevents.io/device-conflict`. A re-scan lists those Events, compares them with the conflicts it
finds now, and a conflict on record that is gone is resolved: it says so (reply, Normal Event) and
writes the Event's `count` into `vmevents.io/device-conflict-resolved-at`, so the next re-scan does
not say it again, while the same conflict coming back raises the count above that mark: open again.
"""
from __future__ import annotations

import enum
import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared import kubevirt as kv
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, VM, VMI
from shared.kube import Conflict as KubeConflict
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome
from shared.settings import Env

FUNCTION = "device-conflict"
REASON = "HostDeviceConflict"
RESOLVED_REASON = "HostDeviceConflictResolved"
CONFLICT_ANNOTATION = "vmevents.io/device-conflict"
RESOLVED_AT_ANNOTATION = "vmevents.io/device-conflict-resolved-at"
# harvester/pcidevices ≥ v0.4.0 writes the devices kubelet really gave a running VM's launcher pod
# onto the VM (pkg/controller/virtualmachine/virtualmachine.go reconcileVMResourceAllocationAnnotation;
# pkg/apis/devices.harvesterhci.io/v1beta1 AllocationDetails). It is left in place after the VM
# stops, so it is only believed for a running VM.
ALLOCATION_ANNOTATION = "harvesterhci.io/deviceAllocationDetails"
# A Harvester PCIDevice is named <node>-<PCI address without ':' and '.'> (FACTS.md §3), e.g.
# harvester-ktmg4-000004102 is 0000:04:10.2 on node harvester-ktmg4.
_PCIDEVICE_NAME = re.compile(r"^(?P<node>[a-z0-9][-a-z0-9.]*)-[0-9a-f]{9}$")

TAKEN, BLOCKED, DOUBLE = "taken-while-stopped", "start-blocked", "double-assigned"
SEVERITY = {TAKEN: "warning", BLOCKED: "critical", DOUBLE: "warning"}
BATCH = "batch"  # one answer carries one reply: several changes at once go out as one batch reply

log = logging.getLogger("vmevents.device-conflict")


# -- settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    # How long after a VMI starts running its updates are still worth a look: a conflict it causes
    # is found at once (it took the device when it started); later updates of a long-running VMI
    # (guest agent, interfaces) cannot start one, and the re-scan covers any event that was missed.
    recent_start: timedelta = timedelta(minutes=5)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return cls(recent_start=Env(environ).duration("CONFLICT_RECENT_START", "5m"))


# -- reading VMs and VMIs (pure) ------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Device:
    name: str      # hostDevices[].name / gpus[].name: for Harvester the PCIDevice (or vGPU) object name
    resource: str  # deviceName: the device-plugin resource kubelet counts


@dataclass(frozen=True, order=True)
class Ref:
    """The object Events go on: the VM (or a standalone VMI)."""

    namespace: str
    name: str
    kind: str = "VirtualMachine"
    uid: str | None = field(default=None, compare=False)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    def involved(self) -> dict:
        return {"apiVersion": "kubevirt.io/v1", "kind": self.kind,
                "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}

    def api_path(self) -> str:
        return kv.api_path(self.involved())


class State(str, enum.Enum):
    STOPPED = "stopped"    # no VMI, or a final one
    STARTING = "starting"  # a VMI not yet bound to a node (and not unschedulable)
    RUNNING = "running"    # bound: its launcher pod holds the devices
    BLOCKED = "blocked"    # PodScheduled=False, reason Unschedulable


FINAL = frozenset(kv.FINAL_PHASES)
BOUND = frozenset({"Scheduled", "Running", "Unknown"})


def spec_devices(spec: Mapping | None) -> frozenset[Device]:
    """hostDevices[] and gpus[] of a VMI spec (or a VM's template spec)."""
    devices = (((spec or {}).get("domain") or {}).get("devices") or {})
    found = set()
    for entry in list(devices.get("hostDevices") or ()) + list(devices.get("gpus") or ()):
        if isinstance(entry, Mapping) and entry.get("name") and entry.get("deviceName"):
            found.add(Device(str(entry["name"]), str(entry["deviceName"])))
    return frozenset(found)


def vm_devices(vm: Mapping) -> frozenset[Device]:
    return spec_devices(((vm.get("spec") or {}).get("template") or {}).get("spec"))


def allocated_devices(vm: Mapping | None) -> frozenset[Device] | None:
    """The real allocation from harvesterhci.io/deviceAllocationDetails; None when absent or unreadable."""
    text = kv.annotations_of(vm).get(ALLOCATION_ANNOTATION)
    if not text:
        return None
    try:
        details = json.loads(text)
    except ValueError:
        return None
    if not isinstance(details, dict):
        return None
    found = set()
    for group in ("hostdevices", "gpus"):
        for resource, names in (details.get(group) or {}).items():
            for name in names if isinstance(names, list) else ():
                if isinstance(name, str) and name:
                    found.add(Device(name, resource))
    return frozenset(found)


def unschedulable(vmi: Mapping | None) -> str | None:
    """The scheduler's message when the VMI's pod cannot be scheduled (FACTS.md §1), else None."""
    for cond in ((vmi or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return cond.get("message") or ""
    return None


def vmi_state(vmi: Mapping | None) -> State:
    phase = kv.phase(vmi) if vmi else ""
    if vmi is None or phase in FINAL:
        return State.STOPPED
    if unschedulable(vmi) is not None:
        return State.BLOCKED
    return State.RUNNING if phase in BOUND else State.STARTING


def node_of(device: str) -> str | None:
    match = _PCIDEVICE_NAME.match(device)
    return match.group("node") if match else None


@dataclass(frozen=True)
class Workload:
    """One VM (or standalone VMI) that names or holds devices, as one scan sees it."""

    ref: Ref
    state: State
    named: frozenset[Device]    # what its spec names (the VM's template; the VMI's for a standalone VMI)
    devices: frozenset[Device]  # what it holds (running/starting) or asks for (blocked) or would ask for (stopped)
    node: str | None = None
    scheduler_message: str | None = None

    @property
    def active(self) -> bool:
        return self.state in (State.STARTING, State.RUNNING)


class Index:
    """VMs and VMIs folded, page by page, into Workloads: only objects with devices are kept, a few
    hundred bytes each, so memory follows the number of device VMs, not of all VMs."""

    def __init__(self):
        self._vms: dict[str, tuple[Ref, frozenset[Device], frozenset[Device] | None]] = {}
        self._vmis: dict[str, dict] = {}
        self.vms_seen = 0
        self.vmis_seen = 0

    def add_vm(self, vm: Mapping) -> None:
        self.vms_seen += 1
        named, allocated = vm_devices(vm), allocated_devices(vm)
        if not named and not allocated:
            return
        meta = kv.meta(vm)
        ref = Ref(meta.get("namespace") or "default", meta["name"], "VirtualMachine", meta.get("uid"))
        self._vms[ref.id] = (ref, named, allocated)

    def add_vmi(self, vmi: Mapping) -> None:
        self.vmis_seen += 1
        meta = kv.meta(vmi)
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        devices = spec_devices(vmi.get("spec"))
        if key not in self._vms and not devices:
            return
        self._vmis[key] = {"state": vmi_state(vmi), "devices": devices,
                           "node": (vmi.get("status") or {}).get("nodeName") or None,
                           "message": unschedulable(vmi), "owner": kv.controller_owner(vmi, "VirtualMachine"),
                           "uid": meta.get("uid")}

    def touches_others(self, target: str, devices: frozenset[str]) -> bool:
        """Does any other VM name or hold one of these devices (by its spec or allocation)?"""
        own = self._vms.get(target)
        wanted = set(devices) | ({d.name for d in own[1] | (own[2] or frozenset())} if own else set())
        return any(key != target and wanted & {d.name for d in named | (allocated or frozenset())}
                   for key, (_, named, allocated) in self._vms.items())

    def workloads(self) -> list[Workload]:
        found = []
        for key in sorted(set(self._vms) | set(self._vmis)):
            vm, vmi = self._vms.get(key), self._vmis.get(key)
            found.append(_workload(key, vm, vmi))
        return found


def _workload(key: str, vm, vmi: dict | None) -> Workload:
    namespace, name = key.split("/", 1)
    if vm is not None:
        ref, named, allocated = vm
    else:  # a VMI with devices whose VM names none (or which has no VM)
        owner = (vmi or {}).get("owner")
        ref = (Ref(namespace, name, "VirtualMachine", owner.get("uid")) if owner
               else Ref(namespace, name, "VirtualMachineInstance", vmi.get("uid")))
        named, allocated = (frozenset() if owner else vmi["devices"]), None
    state = vmi["state"] if vmi else State.STOPPED
    if state is State.STOPPED:
        devices = named
    elif state is State.RUNNING and allocated is not None:
        devices = allocated  # the real allocation wins over the spec for a running VM (FACTS.md §3)
    else:
        devices = vmi["devices"]
    return Workload(ref, state, named, devices, node=vmi["node"] if vmi else None,
                    scheduler_message=vmi["message"] if vmi else None)


# -- decide (pure) --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conflict:
    kind: str
    device: str
    resource: str
    node: str | None
    holder: Ref | None
    blocked: tuple[Ref, ...]

    @property
    def key(self) -> str:
        """The conflict's identity: the same kind, device, holder and blocked VMs are the same conflict."""
        return "|".join((self.kind, self.device, self.holder.id if self.holder else "",
                         ",".join(b.id for b in self.blocked)))

    @property
    def involved(self) -> tuple[Ref, ...]:
        return ((self.holder,) if self.holder else ()) + self.blocked

    @property
    def severity(self) -> str:
        return SEVERITY[self.kind]

    def data(self) -> dict:
        return {"kind": self.kind, "device": self.device, "resourceName": self.resource, "node": self.node,
                "holder": self.holder.id if self.holder else None, "blocked": [b.id for b in self.blocked],
                "severity": self.severity}

    def message(self) -> str:
        """One sentence per situation, stable for the same conflict so its Events deduplicate."""
        on = f" on {self.node}" if self.node else ""
        device = f"{self.device} ({self.resource}){on}"
        if self.kind == TAKEN:
            holder, other = self.holder.id, self.blocked[0].id
            return (f"{holder} holds {device}; stopped VM {other} names it too and cannot start "
                    f"while {holder} runs.")
        if self.kind == BLOCKED:
            holder, other = self.holder.id, self.blocked[0].id
            return (f"{other} cannot start (Insufficient {self.resource}): {holder} holds {device}, which "
                    f"{other} names too. Stop {holder}, or edit {other} to name another free "
                    f"{self.resource} device, and {other} can start.")
        names = [b.id for b in self.blocked]
        both = "both" if len(names) == 2 else "all"
        listed = ", ".join(names[:-1]) + f" and {names[-1]}"
        return (f"{listed} {both} name {device} and none of them runs yet: only one can run at a time. "
                f"Edit the others to name another {self.resource} device.")


def find_conflicts(workloads: Iterable[Workload]) -> tuple[Conflict, ...]:
    """Every conflict among these workloads, in a stable order. Pure."""
    workloads = list(workloads)
    by_device: dict[str, list[Workload]] = defaultdict(list)
    for w in workloads:
        for name in {d.name for d in w.devices | w.named}:
            by_device[name].append(w)
    found: list[Conflict] = []
    for device in sorted(by_device):
        found += _conflicts_over(device, by_device[device])
    return tuple(found)


def _conflicts_over(device: str, workloads: list[Workload]) -> list[Conflict]:
    def has(w: Workload, which: frozenset[Device]) -> Device | None:
        return next((d for d in sorted(which) if d.name == device), None)

    holders = [w for w in workloads if w.active and has(w, w.devices)]
    found = []
    for holder in holders:
        held = has(holder, holder.devices)
        node = holder.node or node_of(device)
        for other in workloads:
            if other.ref == holder.ref or not has(other, other.devices):
                continue
            if other.state is State.STOPPED:
                found.append(Conflict(TAKEN, device, held.resource, node, holder.ref, (other.ref,)))
            elif (other.state is State.BLOCKED and holder.state is State.RUNNING
                  and f"Insufficient {held.resource}" in (other.scheduler_message or "")):
                found.append(Conflict(BLOCKED, device, held.resource, node, holder.ref, (other.ref,)))
    if holders:
        return found
    namers = [w for w in workloads if has(w, w.named)]
    if len(namers) >= 2 and not any(w.active for w in namers):
        resource = has(namers[0], namers[0].named).resource
        return [Conflict(DOUBLE, device, resource, node_of(device), None, tuple(sorted(w.ref for w in namers)))]
    return []


@dataclass(frozen=True)
class Recorded:
    """One HostDeviceConflict Event, read back."""

    name: str
    namespace: str
    resource_version: str
    count: int
    resolved_at: int | None
    involved: Ref
    key: str
    data: dict

    @property
    def open(self) -> bool:
        return self.resolved_at is None or self.count > self.resolved_at


def recorded_from(event: Mapping) -> Recorded | None:
    """The conflict an Event of ours carries; None for an Event that is not ours or unreadable."""
    meta = event.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        stored = json.loads(notes[CONFLICT_ANNOTATION])
        key, data = stored["key"], stored["conflict"]
        resolved_at = int(notes[RESOLVED_AT_ANNOTATION]) if RESOLVED_AT_ANNOTATION in notes else None
    except (KeyError, ValueError, TypeError):
        return None
    obj = event.get("involvedObject") or {}
    involved = Ref(obj.get("namespace") or meta.get("namespace") or "default", obj.get("name") or "",
                   obj.get("kind") or "VirtualMachine", obj.get("uid"))
    return Recorded(meta["name"], meta.get("namespace") or "default", meta.get("resourceVersion") or "",
                    int(event.get("count") or 1), resolved_at, involved, key, data)


@dataclass(frozen=True)
class Plan:
    """What a re-scan does: record what has no open Event yet, say what is new and what ended."""

    record: tuple[tuple[Conflict, Ref], ...]   # (conflict, VM) pairs with no open Event yet
    detected: tuple[Conflict, ...]             # conflicts with no open Event at all: news
    resolved: tuple[tuple[Recorded, ...], ...]  # per ended conflict, its open Events


def plan(current: Iterable[Conflict], recorded: Iterable[Recorded]) -> Plan:
    current = tuple(current)
    open_events = [r for r in recorded if r.open]
    open_pairs = {(r.key, r.involved.id) for r in open_events}
    open_keys = {r.key for r in open_events}
    current_keys = {c.key for c in current}
    ended: dict[str, list[Recorded]] = defaultdict(list)
    for r in open_events:
        if r.key not in current_keys:
            ended[r.key].append(r)
    return Plan(record=tuple((c, ref) for c in current for ref in c.involved if (c.key, ref.id) not in open_pairs),
                detected=tuple(c for c in current if c.key not in open_keys),
                resolved=tuple(tuple(ended[key]) for key in sorted(ended)))


def why_resolved(data: Mapping, current: Iterable[Conflict], workloads: Mapping[str, Workload]) -> str:
    """A short reason a recorded conflict ended, from what the re-scan sees now. Pure."""
    device, holder, blocked = data.get("device"), data.get("holder"), list(data.get("blocked") or ())
    people = set(blocked) | ({holder} if holder else set())
    for c in current:
        if c.device == device and {r.id for r in c.involved} == people:
            return f"it is now {c.kind}"
    for vm in sorted(people):
        w = workloads.get(vm)
        if w is None or not any(d.name == device for d in w.devices | w.named):
            return f"{vm} no longer names or holds {device}"
    if holder and not workloads[holder].active:
        return f"{holder} no longer runs"
    started = [b for b in blocked if workloads[b].active]
    if started:
        return f"{started[0]} runs now"
    return "the conflict is no longer seen"


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
        return Target(found.ref.namespace, found.ref.name)
    obj, meta = found.obj, kv.meta(found.obj)
    if obj["kind"] == "VirtualMachine":
        devices = vm_devices(obj) | (allocated_devices(obj) or frozenset())
    else:
        devices = spec_devices(obj.get("spec")) if _vmi_worth_a_look(obj, settings, now) else frozenset()
    if not devices:
        return None
    return Target(meta.get("namespace") or "default", meta["name"], frozenset(d.name for d in devices))


def _vmi_worth_a_look(vmi: Mapping, settings: Settings, now: datetime) -> bool:
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


# -- fetch, decide, report ------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings, ctx.clock())
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return check(found, event.subject, ctx)


def check(found: Target, subject: str | None, ctx: KubeContext) -> Outcome:
    """One VM's conflicts: one LIST of VMs, and one of VMIs only if another VM shares a device."""
    index = Index()
    for vm in ctx.kube.list(VM):
        index.add_vm(vm)
    if found.devices is not None and not index.touches_others(found.id, found.devices):
        return Outcome("no-conflict", subject=subject,
                       reason=f"no other VM names or holds a device of {found.id}")
    for vmi in ctx.kube.list(VMI):
        index.add_vmi(vmi)
    conflicts = [c for c in find_conflicts(index.workloads()) if found.id in {r.id for r in c.involved}]
    if not conflicts:
        return Outcome("no-conflict", subject=subject, reason=f"{found.id} shares a device with no conflict")
    for conflict in conflicts:
        for ref in conflict.involved:
            _record(conflict, ref, ctx)
    return Outcome("conflict", effect="reported", subject=subject,
                   reason="; ".join(f"{c.kind} over {c.device}" for c in conflicts),
                   reply=_reply([_detected(c) for c in conflicts], [], subject or f"/vmevents/{FUNCTION}"))


def rescan(ctx: KubeContext) -> Outcome:
    """Every VM and VMI, page by page: catches missed events and is where a conflict ends."""
    index = Index()
    for vm in ctx.kube.list(VM):
        index.add_vm(vm)
    for vmi in ctx.kube.list(VMI):
        index.add_vmi(vmi)
    workloads = index.workloads()
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


def _record(conflict: Conflict, ref: Ref, ctx: KubeContext) -> None:
    stored = json.dumps({"key": conflict.key, "conflict": conflict.data()}, sort_keys=True)
    ctx.recorder.record(ref.involved(), "Warning", REASON, conflict.message(), ctx.clock(),
                        annotations={CONFLICT_ANNOTATION: stored})


def _resolve(events: tuple[Recorded, ...], current: tuple[Conflict, ...], workloads: Mapping[str, Workload],
             ctx: KubeContext) -> Reply | None:
    """Mark a conflict's open Events resolved (at their current count) and say so. An Event that
    changed meanwhile (the conflict was seen again) is left open: the next re-scan decides."""
    marked = []
    for event in events:
        try:
            ctx.kube.merge_patch(EVENT, event.namespace, event.name, {"metadata": {
                "resourceVersion": event.resource_version,
                "annotations": {RESOLVED_AT_ANNOTATION: str(event.count)}}})
        except KubeConflict:
            continue
        marked.append(event)
    if not marked:
        return None
    data = dict(marked[0].data, because=why_resolved(marked[0].data, current, workloads))
    for ref in sorted({e.involved for e in marked}):
        ctx.recorder.record(ref.involved(), "Normal", RESOLVED_REASON,
                            f"No longer in conflict over {data['device']} ({data['kind']}): {data['because']}.",
                            ctx.clock())
    blocked = data.get("blocked") or [data.get("holder")]
    return Reply(reply_type(FUNCTION, "resolved"), _path(blocked[0]), data, key=marked[0].key)


def _detected(conflict: Conflict) -> Reply:
    return Reply(reply_type(FUNCTION, "detected"), conflict.blocked[0].api_path(), conflict.data(), key=conflict.key)


def _path(vm: str) -> str:
    namespace, name = vm.split("/", 1)
    return Ref(namespace, name).api_path()


def _reply(detected: list[Reply], resolved: list[Reply], subject: str) -> Reply | None:
    """One answer carries one reply: a single change as itself, several as one batch whose items
    carry the id their own reply would have had."""
    changes = detected + resolved
    if not changes:
        return None
    if len(changes) == 1:
        return changes[0]
    return Reply(reply_type(FUNCTION, BATCH), subject,
                 {"detected": [dict(r.data, id=r.id) for r in detected],
                  "resolved": [dict(r.data, id=r.id) for r in resolved]},
                 key="|".join(sorted(r.id for r in changes)))

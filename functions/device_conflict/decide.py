"""device-conflict's pure part: the conflicts among the workloads of the device index (index.py),
and what a re-scan records and resolves. Everything it needs is passed in; nothing here does I/O.

Nothing on the API path stops two VMs naming the same PCI device or vGPU; only Harvester's UI does
(docs/facts.md §3, harvester#5253). The last comments of Harvester issue #5081 show the result: vm1
powers itself off, its pod completes and frees the device, vm2 is created naming the same device
and starts, and vm1 can no longer start ("0/1 nodes are available: 1 Insufficient
intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION").

"Resolved" needs no memory: every HostDeviceConflict Event carries its conflict in the annotation
`vmevents.io/device-conflict`. A re-scan lists those Events, compares them with the conflicts it
finds now (`plan`), and a conflict on record that is gone is resolved: the handler says so and
writes the Event's `count` into `vmevents.io/device-conflict-resolved-at`, so the next re-scan does
not say it again, while the same conflict coming back raises the count above that mark: open again.
"""
from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from functions.device_conflict.index import Device, Ref, State, Workload, node_of

CONFLICT_ANNOTATION = "vmevents.io/device-conflict"
RESOLVED_AT_ANNOTATION = "vmevents.io/device-conflict-resolved-at"


class Category(enum.StrEnum):
    """The situations a device conflict can be in: the finding's category."""

    TAKEN = "taken-while-stopped"  # a running VM holds a device a stopped VM names
    BLOCKED = "start-blocked"      # ...and the stopped VM tried to start: Insufficient <resource>
    DOUBLE = "double-assigned"     # several stopped VMs name one device


SEVERITY = {Category.TAKEN: "warning", Category.BLOCKED: "critical", Category.DOUBLE: "warning"}


# -- finding conflicts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceConflict:
    """One device conflict: a finding of the category TAKEN or BLOCKED (a holder and the VM it
    keeps from starting) or DOUBLE (no holder, several VMs naming the device)."""

    category: Category
    device: str
    resource: str
    node: str | None
    holder: Ref | None
    blocked: tuple[Ref, ...]

    @property
    def key(self) -> str:
        """The conflict's identity: the same category, device, holder and blocked VMs are the same conflict."""
        return "|".join((self.category, self.device, self.holder.id if self.holder else "",
                         ",".join(b.id for b in self.blocked)))

    @property
    def involved(self) -> tuple[Ref, ...]:
        return ((self.holder,) if self.holder else ()) + self.blocked

    @property
    def severity(self) -> str:
        return SEVERITY[self.category]


def find_conflicts(workloads: Iterable[Workload]) -> tuple[DeviceConflict, ...]:
    """Every conflict among these workloads, in a stable order."""
    by_device: dict[str, list[Workload]] = defaultdict(list)
    for w in workloads:
        for name in {d.name for d in w.devices | w.named}:
            by_device[name].append(w)
    found: list[DeviceConflict] = []
    for device in sorted(by_device):
        found += _conflicts_over(device, by_device[device])
    return tuple(found)


def _conflicts_over(device: str, workloads: list[Workload]) -> list[DeviceConflict]:
    def entry(which: frozenset[Device]) -> Device | None:
        return next((d for d in sorted(which) if d.name == device), None)

    holders = [(w, held) for w in workloads if w.active and (held := entry(w.devices))]
    found = []
    for holder, held in holders:
        node = holder.node or node_of(device)
        for other in workloads:
            if other.ref == holder.ref or not entry(other.devices):
                continue
            if other.state is State.STOPPED:
                found.append(DeviceConflict(Category.TAKEN, device, held.resource, node, holder.ref, (other.ref,)))
            elif (other.state is State.BLOCKED and holder.state is State.RUNNING
                  and f"Insufficient {held.resource}" in (other.scheduler_message or "")):
                found.append(DeviceConflict(Category.BLOCKED, device, held.resource, node, holder.ref, (other.ref,)))
    if holders:
        return found
    namers = [(w, named) for w in workloads if (named := entry(w.named))]
    if len(namers) >= 2 and not any(w.active for w, _ in namers):
        return [DeviceConflict(Category.DOUBLE, device, namers[0][1].resource, node_of(device), None,
                               tuple(sorted(w.ref for w, _ in namers)))]
    return []


@dataclass(frozen=True)
class Verdict:
    """What one VM's check decides: report the conflicts it is part of, or nothing."""

    action: str  # "conflict" or "no-conflict"
    reason: str
    conflicts: tuple[DeviceConflict, ...] = ()


def decide(vm: str, workloads: Iterable[Workload]) -> Verdict:
    """The conflicts the VM `vm` ("namespace/name") is part of, among these workloads."""
    conflicts = tuple(c for c in find_conflicts(workloads) if vm in {r.id for r in c.involved})
    if not conflicts:
        return Verdict("no-conflict", f"{vm} shares a device with no conflict")
    return Verdict("conflict", "; ".join(f"{c.category} over {c.device}" for c in conflicts), conflicts)


# -- the re-scan: conflicts now versus conflicts on record -----------------------------------------
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
    """The verdict of a re-scan: record what has no open Event yet, say what is new and what ended."""

    record: tuple[tuple[DeviceConflict, Ref], ...]  # (conflict, VM) pairs with no open Event yet
    detected: tuple[DeviceConflict, ...]            # conflicts with no open Event at all: news
    resolved: tuple[tuple[Recorded, ...], ...]      # per ended conflict, its open Events


def plan(current: Iterable[DeviceConflict], recorded: Iterable[Recorded]) -> Plan:
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

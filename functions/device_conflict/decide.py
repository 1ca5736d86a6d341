"""device-conflict's pure part: the conflicts among the workloads of the device index (index.py),
and what a re-scan records and resolves. Everything it needs is passed in; nothing here does I/O.

Nothing on the API path stops two VMs naming the same PCI device or vGPU; only Harvester's UI does
(docs/facts.md §3, harvester#5253). The last comments of Harvester issue #5081 show the result: vm1
powers itself off, its pod completes and frees the device, vm2 is created naming the same device
and starts, and vm1 can no longer start ("0/1 nodes are available: 1 Insufficient
intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION").

A conflict is a finding (shared/ledger.py keeps its life in the cluster): its identity is its
category, the first VM it keeps from starting, and its key. A re-scan compares the conflicts it finds
now with the findings still open; one that is gone is resolved.
"""
from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from functions.device_conflict.index import Device, Ref, State, Workload, node_of
from functions.device_conflict.settings import Settings


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


# -- one VM's check -------------------------------------------------------------------------------
class Action(enum.StrEnum):
    CONFLICT = "conflict"          # report the conflicts the VM is part of (each a finding)
    NO_CONFLICT = "no-conflict"    # nothing to report


@dataclass(frozen=True)
class Facts:
    """What one VM's check read fresh: the VM ("namespace/name") and every workload that names or holds a
    device it names (reads.around: the parameter object's entries, each VM and VMI read by GET)."""

    vm: str
    workloads: tuple[Workload, ...]


@dataclass(frozen=True)
class Verdict:
    """What one VM's check decides: report the conflicts it is part of, or nothing."""

    action: Action
    reason: str
    conflicts: tuple[DeviceConflict, ...] = ()


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """The conflicts the VM is part of, among the workloads it shares a device with. Pure: every fact is an
    argument (a conflict is a fact of the present: neither the settings nor the time change it)."""
    conflicts = tuple(c for c in find_conflicts(facts.workloads) if facts.vm in {r.id for r in c.involved})
    if not conflicts:
        return Verdict(Action.NO_CONFLICT, f"{facts.vm} shares a device with no conflict")
    return Verdict(Action.CONFLICT, "; ".join(f"{c.category} over {c.device}" for c in conflicts), conflicts)

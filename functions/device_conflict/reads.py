"""What device-conflict reads and the one object it writes besides Events: the parameter object (assignment.py).

A re-scan reads every VM and VMI, page by page. An event reads the parameter object, then only the VMs (and
their VMIs) that it says share a device with the event's VM: a handful of GETs instead of a LIST of every
VM and VMI, at any cluster size. It is safe because every write of the object is a read-modify-write with a
resourceVersion precondition: two events about VMs that name one device cannot both write without the
second one reading the first one's entry (its write fails with 409, it reads again, and GETs the VM it now
sees). What the object can miss (an event that was never delivered) the next re-scan repairs, and until then
an event falls back to the LISTs whenever the object is missing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from functions.device_conflict import assignment
from functions.device_conflict.index import Index, Workload
from shared.kube import VM, VMI, Conflict, Kind, Kube

CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
ATTEMPTS = 4  # read-modify-write rounds before the event is answered 503 and redelivered


@dataclass(frozen=True)
class Stored:
    """The parameter object as read: its data and the resourceVersion a write must name."""

    data: dict[str, str]
    resource_version: str


def scan(kube: Kube) -> Index:
    """Every VM and VMI, page by page, folded into the index."""
    index = Index()
    for vm in kube.list(VM):
        index.add_vm(vm)
    for vmi in kube.list(VMI):
        index.add_vmi(vmi)
    return index


def fetch(kube: Kube, vms: Iterable[str], index: Index | None = None) -> Index:
    """These VMs ("namespace/name") and their VMIs (a VMI has its VM's name), one GET each."""
    index = index if index is not None else Index()
    for vm_id in sorted(set(vms)):
        namespace, name = vm_id.split("/", 1)
        vm = kube.get(VM, namespace, name)
        if vm is not None:
            index.add_vm(vm)
        vmi = kube.get(VMI, namespace, name)
        if vmi is not None:
            index.add_vmi(vmi)
    return index


def read(kube: Kube, where: tuple[str, str]) -> Stored | None:
    found = kube.get(CONFIG_MAP, *where)
    if found is None:
        return None
    return Stored(dict(found.get("data") or {}), (found.get("metadata") or {}).get("resourceVersion") or "")


def write(kube: Kube, where: tuple[str, str], stored: Stored | None, data: Mapping[str, str]) -> bool:
    """Create the object, or replace its data at exactly the version read. False when nothing changed (no
    write at all); Conflict when it changed meanwhile (or was created by someone else first)."""
    if stored is not None and dict(data) == stored.data:
        return False
    namespace, name = where
    metadata: dict = {"name": name, "namespace": namespace, "labels": {
        "app.kubernetes.io/part-of": "vmevents", "app.kubernetes.io/managed-by": "device-conflict"}}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}
    if stored is None:
        kube.create(CONFIG_MAP, namespace, body)
    else:
        metadata["resourceVersion"] = stored.resource_version  # a replace at exactly this version, or 409
        kube.request("PUT", CONFIG_MAP.path(namespace, name), body=body)
    return True


def keep_all(kube: Kube, where: tuple[str, str], base: Stored | None, workloads: Iterable[Workload]) -> int:
    """A re-scan's repair: the whole object from what the LISTs showed, merged over what events wrote since
    `base` was read (assignment.merged). Returns the number of writes (0 when it was right already)."""
    mine = assignment.data_of(assignment.entries(workloads))
    stored, writes = base, 0
    for _ in range(ATTEMPTS):
        data = assignment.merged(base.data if base else {}, stored.data if stored else {}, mine)
        try:
            return writes + int(write(kube, where, stored, data))
        except Conflict:
            stored = read(kube, where)
    raise Conflict(f"the parameter object {'/'.join(where)} kept changing")


@dataclass(frozen=True)
class Around:
    """What an event's check read: the workloads that matter to one VM, and the parameter object's writes."""

    workloads: list[Workload]
    sharing: bool  # does another VM name or hold a device of this one?
    writes: int
    listed: bool   # the parameter object was missing: everything was listed


def around(kube: Kube, where: tuple[str, str], vm: str) -> Around:
    """The VM `vm` and every VM that shares a device with it, read fresh; its devices' entries written back."""
    for _ in range(ATTEMPTS):
        stored = read(kube, where)
        try:
            if stored is None:
                return _listed(kube, where, vm)
            entries = assignment.read(stored.data)
            index = fetch(kube, [vm])
            own = _devices(index.workloads(), vm)
            if not all(assignment.is_key(d) for d in own):
                return _listed(kube, where, vm, stored)  # a device the object cannot hold: only a LIST knows
            concerned = own | assignment.devices_of(entries, vm)
            others = {c for d in concerned if d in entries for c in entries[d].claimants} - {vm}
            workloads = fetch(kube, others, index).workloads()
            fresh = assignment.entries(workloads, only=concerned)
            writes = int(write(kube, where, stored, assignment.updated(stored.data, fresh, concerned)))
        except Conflict:
            continue
        return Around(workloads, _shares(workloads, vm, own), writes, listed=False)
    raise Conflict(f"the parameter object {'/'.join(where)} kept changing")


def _listed(kube: Kube, where: tuple[str, str], vm: str, stored: Stored | None = None) -> Around:
    """The fallback: every VM and VMI, and the whole object written from them."""
    workloads = scan(kube).workloads()
    writes = keep_all(kube, where, stored, workloads)
    return Around(workloads, _shares(workloads, vm, _devices(workloads, vm)), writes, listed=True)


def _devices(workloads: Iterable[Workload], vm: str) -> set[str]:
    return {d.name for w in workloads if w.ref.id == vm for d in w.devices | w.named}


def _shares(workloads: Iterable[Workload], vm: str, devices: set[str]) -> bool:
    return any(w.ref.id != vm and devices & {d.name for d in w.devices | w.named} for w in workloads)

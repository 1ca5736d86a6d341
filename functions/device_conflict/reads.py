"""What device-conflict reads and the one object it writes besides Events: the parameter object (assignment.py).

A re-scan reads every VM and VMI, page by page. An event reads the parameter object, then only the VMs (and
their VMIs) that it says share a device with the event's VM: a handful of GETs instead of a LIST of every
VM and VMI, at any cluster size. It is safe because every write of the object is a read-modify-write with a
resourceVersion precondition: two events about VMs that name one device cannot both write without the
second one reading the first one's entry (its write fails with 409, it reads again, and GETs the VM it now
sees). What the object can miss (an event that was never delivered) the next re-scan repairs, and until then
an event falls back to the LISTs whenever the object is missing.

A tick between repairs (`light`) reads the object and GETs only the VMs its contested entries name, the VMs of
open findings and whoever else the object says shares their devices: a few GETs, where the repair's LISTs read
every VM and VMI (80 MB at 10,000 VMs, docs/api-cost.md). The repair's LISTs are not served from the watch
cache (`cached=True`): `keep_all` lets an entry of the LISTs win over the object as read before them, so a
LIST older than that read would undo an event's newer entry; and kube-apiserver ≥ 1.31 serves a LIST without
resourceVersion from its watch cache anyway once the cache has caught up (ConsistentListFromCache).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from functions.device_conflict import assignment, instancetypes
from functions.device_conflict.index import Index, Workload
from functions.device_conflict.instancetypes import Given, Source
from shared import configmaps
from shared import rescan as visits
from shared.configmaps import Stored, read
from shared.kinds import VM, VMI, Kind
from shared.kube import Conflict, Kube, NotFound

ATTEMPTS = 4  # read-modify-write rounds before the event is answered 503 and redelivered
# Whether hostDevices[].name and gpus[].name are physical devices here (docs/facts.md §3), as the last full repair
# found it, on the parameter object: "harvester" (the API serves harvester/pcidevices' devices.harvesterhci.io:
# its webhook makes every hostDevices[].name a PCIDevice or USBDevice) or "aliases" (plain KubeVirt: a name is
# the VM's own label for a device of its deviceName resource, and two VMs calling a GPU `gpu1` share nothing).
DEVICE_NAMES = "vmevents.io/device-names"
HARVESTER, ALIASES = "harvester", "aliases"
_PCIDEVICES = "/apis/devices.harvesterhci.io/v1beta1"  # discovery: any authenticated user may read it
# The cluster's vGPUs (harvester/pcidevices, cluster-scoped; charts/templates/crds.yaml). A gpus[].name is a
# device only when one of them has that name (index.spec_devices). The last full repair's LIST of their names is
# kept on the parameter object (a JSON list), so that events and light ticks decide as it did without a LIST.
VGPU = Kind("devices.harvesterhci.io/v1beta1", "VGPUDevice", "vgpudevices", namespaced=False)
VGPU_NAMES = "vmevents.io/vgpu-names"
# What an instancetype gives a VM (instancetypes.py): read only for VMs that name one. A full repair LISTs the three
# kinds once, at its first such VM; an event or a light tick GETs the revision (else the object) of each one it reads.
INSTANCETYPE = Kind(f"{instancetypes.GROUP}/v1beta1", "VirtualMachineInstancetype", "virtualmachineinstancetypes")
CLUSTER_INSTANCETYPE = Kind(f"{instancetypes.GROUP}/v1beta1", "VirtualMachineClusterInstancetype",
                            "virtualmachineclusterinstancetypes", namespaced=False)
REVISION = Kind("apps/v1", "ControllerRevision", "controllerrevisions")
_OF_INSTANCETYPES = f"{instancetypes.OBJECT_KIND_LABEL} in ({','.join(instancetypes.KINDS)})"
_KINDS = {instancetypes.REVISION: REVISION, instancetypes.NAMESPACED: INSTANCETYPE,
          instancetypes.CLUSTER: CLUSTER_INSTANCETYPE}
# When the last full repair wrote the object (ISO 8601, UTC): a tick repairs when it is older than
# DEVICE_REPAIR_EVERY, or absent.
REPAIRED_AT = "vmevents.io/repaired-at"
_PARALLEL = visits.Settings()  # GETs of a light tick: a few at once (shared/rescan.py's workers)


def repaired_at(stored: Stored) -> datetime | None:
    """When the last full repair wrote the object, if it says so readably."""
    try:
        return datetime.fromisoformat(stored.annotations.get(REPAIRED_AT) or "")
    except ValueError:
        return None


def discover(kube: Kube) -> tuple[str, frozenset[str]]:
    """The platform: HARVESTER when the API serves PCIDevices (devices.harvesterhci.io/v1beta1, harvester/pcidevices),
    else ALIASES; and, on HARVESTER, the names of its VGPUDevices: one discovery GET, and one
    LIST of VGPUDevice metadata when the API serves them (pcidevices before vGPU support did not: no vGPU)."""
    try:
        served = kube.request("GET", _PCIDEVICES)
    except NotFound:
        return ALIASES, frozenset()
    resources = {str(r.get("name")) for r in served.get("resources") or () if isinstance(r, dict)}
    if "pcidevices" not in resources:
        return ALIASES, frozenset()
    if VGPU.plural not in resources:
        return HARVESTER, frozenset()
    return HARVESTER, frozenset(str(v["metadata"]["name"]) for v in kube.list_metadata(VGPU))


def vgpus_of(stored: Stored | None) -> frozenset[str] | None:
    """The VGPUDevice names the last repair found, as the object keeps them; None when it keeps none readable (an
    object from before VGPU_NAMES: every gpus[].name counts, as it did, until the next repair writes them)."""
    try:
        names = json.loads(stored.annotations[VGPU_NAMES]) if stored is not None else None
    except (KeyError, ValueError):
        return None
    return frozenset(str(n) for n in names) if isinstance(names, list) else None


def names_devices(stored: Stored | None) -> bool:
    """Does the object say device names are devices here? An object from before DEVICE_NAMES counts as yes
    (what it held then); the next repair writes the annotation."""
    return stored is None or stored.annotations.get(DEVICE_NAMES, HARVESTER) != ALIASES


def listed_instancetypes(kube: Kube) -> Given:
    """A full repair's instancetype specs: at the first VM that names an instancetype, one LIST each of the
    ControllerRevisions KubeVirt stored of instancetypes (by their label), the instancetypes and the cluster
    instancetypes, each item trimmed to its devices. A kind the API does not serve has none."""
    everything: dict[Source, dict] = {}

    def listed(kind: Kind, source_kind: str, label_selector: str | None = None) -> None:
        try:
            for item in kube.list(kind, label_selector=label_selector):
                meta = item.get("metadata") or {}
                where = meta.get("namespace") if kind.namespaced else None
                everything[Source(source_kind, where, str(meta.get("name")))] = instancetypes.trimmed(item)
        except NotFound:
            pass

    loaded = False

    def load(sources: Iterable[Source]) -> dict[Source, dict | None]:
        nonlocal loaded
        if not loaded:
            loaded = True
            listed(REVISION, instancetypes.REVISION, _OF_INSTANCETYPES)
            listed(INSTANCETYPE, instancetypes.NAMESPACED)
            listed(CLUSTER_INSTANCETYPE, instancetypes.CLUSTER)
        return {s: everything.get(s) for s in sources}
    return Given(load)


def got_instancetypes(kube: Kube) -> Given:
    """An event's or a light tick's instancetype specs: one GET per object, a few at once, each read once."""
    def load(sources: Iterable[Source]) -> dict[Source, dict | None]:
        wanted = list(sources)
        found = visits.gather(wanted, lambda s: kube.get(_KINDS[s.kind], s.namespace, s.name), _PARALLEL)
        return dict(zip(wanted, found, strict=True))
    return Given(load)


def scan(kube: Kube, vgpus: frozenset[str] | None = None, with_instancetypes: bool = True) -> Index:
    """Every VM and VMI, page by page, folded into the index; with the devices instancetypes give (listed once,
    listed_instancetypes) unless `with_instancetypes` is False (plain KubeVirt: no name is a device anyway)."""
    index = Index(vgpus, listed_instancetypes(kube) if with_instancetypes else None)
    for vm in kube.list(VM):
        index.add_vm(vm)
    for vmi in kube.list(VMI):
        index.add_vmi(vmi)
    return index


def fetch(kube: Kube, vms: Iterable[str], index: Index | None = None, vgpus: frozenset[str] | None = None) -> Index:
    """These VMs ("namespace/name") and their VMIs (a VMI has its VM's name), one GET each, a few at once."""
    index = index if index is not None else Index(vgpus, got_instancetypes(kube))
    wanted: list[tuple[Kind, str, str]] = []
    for vm_id in sorted(set(vms)):
        namespace, name = vm_id.split("/", 1)
        wanted += [(VM, namespace, name), (VMI, namespace, name)]
    found = visits.gather(wanted, lambda one: kube.get(one[0], one[1], one[2]), _PARALLEL)
    if index.given is not None:  # the instancetype specs of the VMs that name one, in one batch
        index.given.prefetch(obj for (kind, _, _), obj in zip(wanted, found, strict=True) if kind is VM and obj)
    for (kind, _, _), obj in zip(wanted, found, strict=True):  # in order: each VM before its VMI
        if obj is not None:
            (index.add_vm if kind is VM else index.add_vmi)(obj)
    return index


def names(kube: Kube, where: tuple[str, str], vm: str) -> bool:
    """Does the parameter object name this VM in any entry (a missing object names nobody: the repair builds it)?"""
    stored = read(kube, where)
    return stored is not None and bool(assignment.devices_of(assignment.read(stored.data), vm))


def write(kube: Kube, where: tuple[str, str], stored: Stored | None, data: Mapping[str, str],
          stamp: str | None = None, names: str | None = None, vgpus: frozenset[str] | None = None) -> bool:
    """Create the object, or replace its data at exactly the version read. False when nothing changed (no
    write at all); Conflict when it changed meanwhile (or was created by someone else first). `stamp`: the
    repair's time, written as REPAIRED_AT (always a write), with `names` as DEVICE_NAMES and `vgpus` as
    VGPU_NAMES; otherwise the annotations read are kept."""
    if stored is not None and dict(data) == stored.data and stamp is None:
        return False
    annotations = dict(stored.annotations) if stored is not None else {}
    if stamp is not None:
        annotations[REPAIRED_AT] = stamp
    if names is not None:
        annotations[DEVICE_NAMES] = names
    if vgpus is not None:
        annotations[VGPU_NAMES] = json.dumps(sorted(vgpus), separators=(",", ":"))
    configmaps.put(kube, where, stored, data, annotations, managed_by="device-conflict")
    return True


def keep_all(kube: Kube, where: tuple[str, str], base: Stored | None, workloads: Iterable[Workload],
             stamp: str | None = None, names: str = HARVESTER, vgpus: frozenset[str] = frozenset()) -> int:
    """A re-scan's repair: the whole object from what the LISTs showed, merged over what events wrote since
    `base` was read (assignment.merged). Returns the number of writes (0 when it was right already; with a
    `stamp`, the repair's time for REPAIRED_AT, always 1). `names` ALIASES: names are no devices here, and
    the object holds no entry at all (the admission policy then passes everything)."""
    mine = assignment.data_of(assignment.entries(workloads)) if names == HARVESTER else {}
    stored, writes = base, 0
    for _ in range(ATTEMPTS):
        data = (assignment.merged(base.data if base else {}, stored.data if stored else {}, mine)
                if names == HARVESTER else {})
        try:
            fresh = bool(stamp) or stored is None
            return writes + int(write(kube, where, stored, data, stamp, names if fresh else None,
                                      vgpus if fresh else None))
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
            if not names_devices(stored):  # plain KubeVirt: a device name is the VM's own alias
                return Around([], sharing=False, writes=0, listed=False)
            entries = assignment.read(stored.data)
            index = fetch(kube, [vm], vgpus=vgpus_of(stored))
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


@dataclass(frozen=True)
class Light:
    """What a light tick read: the VMs it looked at, the devices whose claimants it knows all of, its writes."""

    workloads: list[Workload]
    devices: frozenset[str]  # the devices of the object's entries that it read every claimant of
    writes: int


def light(kube: Kube, where: tuple[str, str], vms: Iterable[str], devices: Iterable[str] = ()) -> Light | None:
    """A tick between repairs: every VM that a contested entry names (more than the assigned VM), the VMs
    `vms` (the open findings'), and every other claimant the object knows of the devices they name or hold
    and of `devices`, read fresh; those devices' entries written back, no other entry touched (a partial
    view cannot tell that another entry is wrong). None when the object is missing (the caller repairs)."""
    for _ in range(ATTEMPTS):
        stored = read(kube, where)
        if stored is None:
            return None
        entries = assignment.read(stored.data)
        first = {vm for entry in entries.values() if entry.others for vm in entry.claimants} | set(vms)
        index = fetch(kube, first, vgpus=vgpus_of(stored))
        concerned = ({d.name for w in index.workloads() for d in w.devices | w.named} | set(devices)
                     | {d for vm in first for d in assignment.devices_of(entries, vm)})
        concerned = {d for d in concerned if assignment.is_key(d)}
        others = {c for d in concerned if d in entries for c in entries[d].claimants} - first
        workloads = fetch(kube, others, index).workloads()
        fresh = assignment.entries(workloads, only=concerned)
        try:
            writes = int(write(kube, where, stored, assignment.updated(stored.data, fresh, concerned)))
        except Conflict:
            continue
        return Light(workloads, frozenset(concerned), writes)
    raise Conflict(f"the parameter object {'/'.join(where)} kept changing")


def _listed(kube: Kube, where: tuple[str, str], vm: str, stored: Stored | None = None) -> Around:
    """The fallback: every VM and VMI, and the whole object written from them."""
    names, vgpus = discover(kube)
    if names == ALIASES:
        return Around([], sharing=False, writes=keep_all(kube, where, stored, [], names=ALIASES), listed=True)
    workloads = scan(kube, vgpus).workloads()
    writes = keep_all(kube, where, stored, workloads, vgpus=vgpus)
    return Around(workloads, _shares(workloads, vm, _devices(workloads, vm)), writes, listed=True)


def _devices(workloads: Iterable[Workload], vm: str) -> set[str]:
    return {d.name for w in workloads if w.ref.id == vm for d in w.devices | w.named}


def _shares(workloads: Iterable[Workload], vm: str, devices: set[str]) -> bool:
    return any(w.ref.id != vm and devices & {d.name for d in w.devices | w.named} for w in workloads)

"""The device index: the VMs and VMIs of one scan, folded into what each of them names and holds.

Pure, like decide.py: the handler feeds it the objects of its LIST pages.
"""
from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from functions.device_conflict import instancetypes
from shared import kubevirt as kv
from shared import objects as o

# harvester/pcidevices ≥ v0.4.0 writes the devices kubelet really gave a running VM's launcher pod
# onto the VM (pkg/controller/virtualmachine/virtualmachine.go reconcileVMResourceAllocationAnnotation;
# pkg/apis/devices.harvesterhci.io/v1beta1 AllocationDetails). It is left in place after the VM
# stops, so it is only believed for a running VM.
ALLOCATION_ANNOTATION = "harvesterhci.io/deviceAllocationDetails"
# A Harvester PCIDevice is named <node>-<PCI address without ':' and '.'> (docs/facts.md §3), e.g.
# harvester-ktmg4-000004102 is 0000:04:10.2 on node harvester-ktmg4.
_PCIDEVICE_NAME = re.compile(r"^(?P<node>[a-z0-9][-a-z0-9.]*)-[0-9a-f]{9}$")


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


class State(enum.StrEnum):
    STOPPED = "stopped"    # no VMI, or a final one
    STARTING = "starting"  # a VMI not yet bound to a node (and not unschedulable)
    RUNNING = "running"    # bound: its launcher pod holds the devices
    BLOCKED = "blocked"    # PodScheduled=False, reason Unschedulable


FINAL = frozenset(kv.FINAL_PHASES)
BOUND = frozenset({"Scheduled", "Running", "Unknown"})


def spec_devices(spec: Mapping | None, vgpus: frozenset[str] | None = None) -> frozenset[Device]:
    """hostDevices[] and gpus[] of a VMI spec (or a VM's template spec). `vgpus`: the cluster's VGPUDevice names;
    a gpus[].name that is none of them is the VM's own alias for a GPU of its deviceName (harvester/pcidevices'
    webhook never checks a GPU's name, docs/facts.md §3), not a device. None: every gpus[].name counts (a
    parameter object from before the repair listed them)."""
    devices = o.mapping(spec, "domain", "devices")
    found = set()
    gpus = [g for g in o.objects(devices, "gpus") if vgpus is None or str(g.get("name")) in vgpus]
    for entry in [*o.objects(devices, "hostDevices"), *gpus]:
        if entry.get("name") and entry.get("deviceName"):
            found.add(Device(str(entry["name"]), str(entry["deviceName"])))
    return frozenset(found)


def vm_devices(vm: Mapping, vgpus: frozenset[str] | None = None,
               given: instancetypes.Given | None = None) -> frozenset[Device]:
    """What a VM names: its template's devices, plus (with `given`) those its instancetype gives it."""
    own = spec_devices(o.mapping(vm, "spec", "template", "spec"), vgpus)
    if given is None:
        return own
    return own | spec_devices(instancetypes.devices_spec(given.spec_for(vm)), vgpus)


def allocated_devices(vm: dict | None) -> frozenset[Device] | None:
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
        for resource, names in o.mapping(details, group).items():
            for name in names if isinstance(names, list) else ():
                if isinstance(name, str) and name:
                    found.add(Device(name, resource))
    return frozenset(found)


def unschedulable(vmi: Mapping | None) -> str | None:
    """The scheduler's message when the VMI's pod cannot be scheduled (docs/facts.md §1), else None."""
    for cond in kv.conditions_of(vmi):
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            return o.string(cond, "message")
    return None


def vmi_state(vmi: dict | None) -> State:
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
    created: str = ""  # creationTimestamp of the VM (or standalone VMI): who named a device first

    @property
    def active(self) -> bool:
        return self.state in (State.STARTING, State.RUNNING)


@dataclass(frozen=True)
class _Vm:
    ref: Ref
    named: frozenset[Device]
    allocated: frozenset[Device] | None
    created: str = ""
    starting: bool = False   # no VMI yet, but KubeVirt is about to create it (about_to_start)


_STARTS = ("Always", "RerunOnFailure", "Once")
_NOT_YET = ("", "Provisioning", "Starting", "WaitingForVolumeBinding")


def about_to_start(vm: Mapping) -> bool:
    """A VM whose VMI KubeVirt's VM controller is about to create: one read from the API server (it has a
    creationTimestamp) with a run strategy that starts a VMI (docs/facts.md §2) and a printableStatus that says
    it has not run yet (none at all: KubeVirt has not reconciled it; a halted or powered-off VM reads Stopped).
    Without this, the moment between a VM's creation and its VMI's counts it as stopped, and a VM created naming
    a device another stopped VM names is announced as double-assigned for that moment (Harvester issue #5081's
    vm2): one more notice and its end, for a conflict that never was."""
    status = (vm.get("status") or {}).get("printableStatus") or ""
    created = bool(kv.meta(dict(vm)).get("creationTimestamp"))
    return created and kv.run_strategy(dict(vm)) in _STARTS and status in _NOT_YET


@dataclass(frozen=True)
class _Vmi:
    state: State
    devices: frozenset[Device]
    node: str | None
    message: str | None
    owner: dict | None
    uid: str | None
    created: str = ""


class Index:
    """VMs and VMIs folded, page by page, into Workloads: only objects with devices are kept, a few
    hundred bytes each, so memory follows the number of device VMs, not of all VMs."""

    def __init__(self, vgpus: frozenset[str] | None = None, given: instancetypes.Given | None = None) -> None:
        self.vgpus = vgpus  # the cluster's VGPUDevice names (spec_devices); None: every gpus[].name counts
        self.given = given  # the instancetype specs (instancetypes.py); None: only the templates' devices count
        self._vms: dict[str, _Vm] = {}
        self._vmis: dict[str, _Vmi] = {}
        self.vms_seen = 0
        self.vmis_seen = 0

    def add_vm(self, vm: dict) -> None:
        self.vms_seen += 1
        named, allocated = vm_devices(vm, self.vgpus, self.given), allocated_devices(vm)
        if not named and not allocated:
            return
        meta = kv.meta(vm)
        ref = Ref(meta.get("namespace") or "default", meta["name"], "VirtualMachine", meta.get("uid"))
        self._vms[ref.id] = _Vm(ref, named, allocated, created=o.string(meta, "creationTimestamp"),
                                starting=about_to_start(vm))

    def add_vmi(self, vmi: dict) -> None:
        self.vmis_seen += 1
        meta = kv.meta(vmi)
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        devices = spec_devices(vmi.get("spec"), self.vgpus)
        if key not in self._vms and not devices:
            return
        self._vmis[key] = _Vmi(vmi_state(vmi), devices, (vmi.get("status") or {}).get("nodeName") or None,
                               unschedulable(vmi), kv.controller_owner(vmi, "VirtualMachine"), meta.get("uid"),
                               o.string(meta, "creationTimestamp"))

    def touches_others(self, target: str, devices: frozenset[str]) -> bool:
        """Does any other VM name or hold one of these devices (by its spec or allocation)?"""
        own = self._vms.get(target)
        wanted = set(devices) | ({d.name for d in own.named | (own.allocated or frozenset())} if own else set())
        return any(key != target and wanted & {d.name for d in vm.named | (vm.allocated or frozenset())}
                   for key, vm in self._vms.items())

    def workloads(self) -> list[Workload]:
        return [_workload(key, self._vms.get(key), self._vmis.get(key))
                for key in sorted(set(self._vms) | set(self._vmis))]


def _workload(key: str, vm: _Vm | None, vmi: _Vmi | None) -> Workload:
    namespace, name = key.split("/", 1)
    if vm is not None:
        ref, named, allocated, created = vm.ref, vm.named, vm.allocated, vm.created
    else:  # a VMI with devices whose VM names none (or which has no VM)
        assert vmi is not None, key  # the key came from one of the two
        owner = vmi.owner
        ref = (Ref(namespace, name, "VirtualMachine", owner.get("uid")) if owner
               else Ref(namespace, name, "VirtualMachineInstance", vmi.uid))
        named, allocated, created = (frozenset() if owner else vmi.devices), None, vmi.created
    if vmi is None:
        return Workload(ref, State.STARTING if vm is not None and vm.starting else State.STOPPED, named, named,
                        created=created)
    if vmi.state is State.STOPPED:
        devices = named
    elif vmi.state is State.RUNNING and allocated is not None:
        devices = allocated  # the real allocation wins over the spec for a running VM (docs/facts.md §3)
    else:
        devices = vmi.devices
    return Workload(ref, vmi.state, named, devices, node=vmi.node, scheduler_message=vmi.message, created=created)

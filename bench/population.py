"""A realistic cluster of N VMs for the API-cost benchmark: the seed's VM and VMI shapes, with status.

Each VM is the seed's vm1 or vm2 (Harvester issue #5081, simcluster/builders/devices.py) with its own
name; one in 20 names a host device. Most run (a VMI with the status virt-handler writes: conditions,
interfaces, node, volume status, guest OS), one in 10 is stopped (no VMI), one in 200 left a Succeeded
VMI behind (vmi-cleanup's candidates), one in 500 is paused on an IO error (io-pause-report's), one in
1000 is stuck ErrorUnschedulable (vm-stuck-report's), and one in 20 has a migration (most Succeeded long
ago, a few Failed recently: migration-report's). Objects are
created in parallel over keep-alive connections, so 10,000 VMs load in a few minutes on 2 cores.
"""
from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shared.kinds import EVENT, VM, VMI, VMIM
from shared.kube import Kube
from simcluster.builders.devices import host_device, seed_vm1, seed_vm2
from simcluster.builders.io_pause import kubevirt_event
from simcluster.kubevirt.vm_controller import vmi_from_vm

NAMESPACES = 10
NODES = 50
# One node in Harvester's maintenance mode with its VMs still on it (evacuation-report's candidate): cordoned,
# maintain-status running (docs/facts.md §10).
MAINTAINED = "harvester-node-7"


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Plan:
    """Which VM gets what; `expected` counts the candidates each function should find."""

    vms: int
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    expected: dict[str, int] = field(default_factory=dict)

    def namespace(self, i: int) -> str:
        return f"tenant-{i % NAMESPACES}"

    def shape(self, i: int) -> str:
        if i % 1000 == 17:
            return "stuck"
        if i % 200 == 7:
            return "succeeded"
        if i % 500 == 11:
            return "io-paused"
        if i % 10 == 3:
            return "stopped"
        return "running"


def _vm(plan: Plan, i: int) -> dict:
    name = f"vm-{i:05d}"
    devices = [host_device(f"node{i % 50}-{i:06d}")] if i % 20 == 0 else []
    vm = (seed_vm1 if i % 2 else seed_vm2)(name, plan.namespace(i), host_devices=devices)
    vm["spec"]["runStrategy"] = "Halted" if plan.shape(i) == "stopped" else "RerunOnFailure"
    vm["metadata"]["annotations"]["harvesterhci.io/vmRunStrategy"] = vm["spec"]["runStrategy"]
    return vm


def _vmi(plan: Plan, i: int, vm: dict) -> dict:
    """The VMI virt-controller makes from the VM, with the status virt-handler writes for a running guest."""
    vmi = vmi_from_vm(vm)
    started = plan.now - timedelta(days=3, minutes=i % 1440)
    node = f"harvester-node-{i % 50}"
    shape = plan.shape(i)
    phase = {"succeeded": "Succeeded", "stuck": "Scheduling"}.get(shape, "Running")
    conditions = [
        {"type": "Ready", "status": "False" if phase == "Succeeded" else "True",
         "lastProbeTime": None, "lastTransitionTime": stamp(started)},
        {"type": "LiveMigratable", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp(started)},
        {"type": "AgentConnected", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp(started)}]
    if shape == "stuck":  # its launcher pod is unschedulable (docs/facts.md §1): ErrorUnschedulable
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                       "lastTransitionTime": stamp(plan.now),
                       "message": "0/50 nodes are available: 50 Insufficient memory."}]
    if shape == "io-paused":
        conditions.append({"type": "Paused", "status": "True", "reason": "PausedIOError",
                           "message": "VMI was paused, low-level IO error detected", "lastProbeTime": None,
                           "lastTransitionTime": stamp(plan.now - timedelta(minutes=3))})
    transitions = [{"phase": p, "phaseTransitionTimestamp": stamp(started + timedelta(seconds=s))}
                   for p, s in (("Pending", 0), ("Scheduling", 1), ("Scheduled", 4), ("Running", 9))]
    if phase == "Succeeded":
        transitions.append({"phase": "Succeeded", "phaseTransitionTimestamp": stamp(plan.now - timedelta(hours=1))})
    mac = hashlib.sha1(vmi["metadata"]["name"].encode()).hexdigest()
    vmi["status"] = {
        "phase": phase, "nodeName": node, "qosClass": "Burstable", "guestOSInfo": {
            "id": "ubuntu", "kernelRelease": "5.15.0-91-generic", "kernelVersion": "#101-Ubuntu SMP",
            "name": "Ubuntu", "prettyName": "Ubuntu 22.04.3 LTS", "version": "22.04", "versionId": "22.04"},
        "conditions": conditions, "phaseTransitionTimestamps": transitions,
        "activePods": {str(uuid.uuid5(uuid.NAMESPACE_URL, vmi["metadata"]["name"])): node},
        "interfaces": [{"infoSource": "domain, guest-agent", "interfaceName": "enp1s0",
                        "ipAddress": f"10.52.{i // 250 % 250}.{i % 250 + 2}",
                        "ipAddresses": [f"10.52.{i // 250 % 250}.{i % 250 + 2}"],
                        "mac": ":".join(mac[k:k + 2] for k in range(0, 12, 2)), "name": "default",
                        "queueCount": 1}],
        "launcherContainerImageVersion": "registry.suse.com/suse/sles/15.5/virt-launcher:1.3.1-150500.8.15.1",
        "machine": {"type": "pc-q35-7.1"}, "migrationMethod": "BlockMigration", "migrationTransport": "Unix",
        "currentCPUTopology": {"cores": 2, "sockets": 1, "threads": 1},
        "memory": {"guestAtBoot": "1948Mi", "guestCurrent": "1948Mi", "guestRequested": "1948Mi"},
        "volumeStatus": [{"name": v["name"], "target": f"vd{'ab'[k]}",
                          **({"persistentVolumeClaimInfo": {
                              "accessModes": ["ReadWriteMany"], "capacity": {"storage": "10Gi"},
                              "filesystemOverhead": "0.055", "requests": {"storage": "10Gi"},
                              "volumeMode": "Block"}} if "persistentVolumeClaim" in v else {})}
                         for k, v in enumerate(vmi["spec"].get("volumes") or [])],
        "selinuxContext": "none", "runtimeUser": 107,
    }
    vmi["metadata"]["labels"].update({"kubevirt.io/nodeName": node, "kubevirt.io/created-by": vm["metadata"]["uid"]})
    vmi["metadata"]["creationTimestamp"] = stamp(started)
    return vmi


def _node(name: str, now: datetime) -> dict:
    """A Harvester node as its kubelet registers it (Ready); MAINTAINED as Harvester's maintenance leaves it."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "250", "ephemeral-storage": "500Gi"}
    maintained = name == MAINTAINED
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubevirt.io/schedulable": "true"},
                         "annotations": {"harvesterhci.io/maintain-status": "running"} if maintained else {}},
            "spec": {"unschedulable": True} if maintained else {},
            "status": {"capacity": resources, "allocatable": resources, "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp(now),
                 "lastTransitionTime": stamp(now)}]}}


def _vmim(plan: Plan, i: int) -> dict:
    """A migration of vm-i: most Succeeded days ago (outside any report window), a few Failed just now."""
    recent = i % 400 == 0
    ended = plan.now - (timedelta(minutes=5) if recent else timedelta(days=2, minutes=i % 600))
    phase = "Failed" if recent else "Succeeded"
    started = ended - timedelta(seconds=40)
    name = f"vm-{i:05d}"
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"vmim-{i}"))
    state = {"migrationUid": uid, "startTimestamp": stamp(started), "endTimestamp": stamp(ended),
             "sourceNode": f"harvester-node-{i % 50}", "targetNode": f"harvester-node-{(i + 1) % 50}",
             "targetPod": f"virt-launcher-{name}-{uid[:5]}", "completed": True, "failed": recent,
             "mode": "PreCopy"}
    if recent:
        state["failureReason"] = "Live migration failed: operation failed: migration out job: unexpectedly failed"
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": f"{name}-mig-{uid[:5]}", "namespace": plan.namespace(i),
                         "labels": {"kubevirt.io/vmi-name": name}},
            "spec": {"vmiName": name},
            "status": {"phase": phase, "migrationState": state, "phaseTransitionTimestamps": [
                {"phase": p, "phaseTransitionTimestamp": stamp(t)}
                for p, t in (("Pending", started), ("Scheduling", started), ("Scheduled", started),
                             ("PreparingTarget", started), ("TargetReady", started), ("Running", started),
                             (phase, ended))]}}


def populate(kube: Kube, plan: Plan, *, start: int = 0, workers: int = 16,
             say: Callable[[str], None] = lambda text: None) -> Plan:
    """Create VMs `start`..`plan.vms` of the plan, with their VMIs and migrations, through `kube` (the
    admin), in parallel; a larger plan after a smaller one adds to it."""
    if start == 0:
        for ns in sorted({plan.namespace(i) for i in range(min(plan.vms, NAMESPACES))}):
            kube.request("POST", "/api/v1/namespaces",
                         body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for k in range(NODES):
            kube.request("POST", "/api/v1/nodes", body=_node(f"harvester-node-{k}", plan.now))

    def one(i: int) -> None:
        vm = _vm(plan, i)
        created = kube.create(VM, vm["metadata"]["namespace"], vm)
        if plan.shape(i) != "stopped":
            vmi = _vmi(plan, i, created)
            vmi["metadata"].pop("creationTimestamp")  # the server sets it
            stored_vmi = kube.create(VMI, vmi["metadata"]["namespace"], vmi)
            if plan.shape(i) == "stuck":  # the VM controller's status for it (VM has a status subresource)
                kube.request("PUT", VM.path(vm["metadata"]["namespace"], vm["metadata"]["name"]) + "/status",
                             body={**created, "status": {"printableStatus": "ErrorUnschedulable"}})
            if plan.shape(i) == "io-paused":  # virt-handler's Event for the pause (docs/facts.md §5)
                kube.create(EVENT, vmi["metadata"]["namespace"], kubevirt_event(stored_vmi, last=plan.now))
        if i % 20 == 5 or i % 400 == 0:
            vmim = _vmim(plan, i)
            stored = kube.create(VMIM, vmim["metadata"]["namespace"], copy.deepcopy(vmim))
            # VMIM has a status subresource: the status is written as virt-controller writes it.
            path = VMIM.path(vmim["metadata"]["namespace"], stored["metadata"]["name"])
            stored = kube.request("PUT", path + "/status", body={**stored, "status": vmim["status"]})
            # As virt-controller wrote it, last when it ended: the server keeps managedFields a client sets.
            for entry in stored["metadata"].get("managedFields") or ():
                entry.update(manager="virt-controller", time=vmim["status"]["migrationState"]["endTimestamp"])
            kube.request("PUT", path, body=stored)

    with ThreadPoolExecutor(workers) as pool:
        for done, _ in enumerate(pool.map(one, range(start, plan.vms)), start + 1):
            if done % 2000 == 0:
                say(f"  created {done}/{plan.vms} VMs")
    shapes = [plan.shape(i) for i in range(plan.vms)]
    plan.expected = {"succeeded": shapes.count("succeeded"), "io-paused": shapes.count("io-paused"),
                     "stuck": shapes.count("stuck"),
                     "stopped": shapes.count("stopped"),
                     "vmims": sum(1 for i in range(plan.vms) if i % 20 == 5 or i % 400 == 0),
                     "recent-failed-vmims": sum(1 for i in range(plan.vms) if i % 400 == 0)}
    return plan

"""Builders for device-conflict's tests: the seed's vm1 and vm2, and small VMs/VMIs with devices.

`seed_vm1()` and `seed_vm2()` follow the two manifests in the last comments of Harvester issue
#5081 (WebberHuang1118's steps), field for field,
without what the API server sets itself (uid, resourceVersion, creationTimestamp, generation) and
without the UI's own fields in vm2 (`type: kubevirt.io.virtualmachine`, `__clone: true`).
"""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

VF = "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"
SEED_DEVICE = "harvester-ktmg4-000004102"
SEED_NODE = "harvester-ktmg4"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def prerequisites(manifest: dict) -> list[dict]:
    """What a Harvester cluster has for this VM to start, and KubeVirt waits for: the PVC of each disk
    (FailedPvcNotFound without it) and the NetworkAttachmentDefinition of each Multus network (no launcher pod
    without it). Bound PVCs, bridge NADs."""
    namespace = manifest["metadata"].get("namespace", "default")
    spec = manifest["spec"]["template"]["spec"]
    objs: list[dict] = []
    for network in spec.get("networks") or []:
        nad_ns, _, nad = (network.get("multus") or {}).get("networkName", "").rpartition("/")
        if nad:
            objs.append({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                         "metadata": {"name": nad, "namespace": nad_ns or namespace},
                         "spec": {"config": json.dumps({"cniVersion": "0.3.1", "name": nad, "type": "bridge"})}})
    for volume in spec.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            objs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": claim, "namespace": namespace},
                         "spec": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block",
                                  "storageClassName": "harvester-longhorn", "volumeName": f"pvc-{claim}",
                                  "resources": {"requests": {"storage": "10Gi"}}},
                         "status": {"phase": "Bound"}})
    return objs


def host_device(name: str = SEED_DEVICE, resource: str = VF) -> dict:
    return {"deviceName": resource, "name": name}


def _seed_devices(host_devices: list[dict] | None) -> list[dict]:
    return [host_device()] if host_devices is None else host_devices


def seed_vm1(name: str = "vm1", namespace: str = "default", *, host_devices: list[dict] | None = None) -> dict:
    """The seed's vm1: Harvester-made, runStrategy RerunOnFailure, PCI device harvester-ktmg4-000004102."""
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {
            "name": name, "namespace": namespace,
            "annotations": {
                "harvesterhci.io/vmRunStrategy": "RerunOnFailure",
                "harvesterhci.io/volumeClaimTemplates": json.dumps([{
                    "metadata": {"name": f"{name}-disk-0-poe6b",
                                 "annotations": {"harvesterhci.io/imageId": "default/image-sgj9r"}},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}},
                             "volumeMode": "Block", "storageClassName": "longhorn-image-sgj9r"}}]),
                "kubevirt.io/latest-observed-api-version": "v1",
                "kubevirt.io/storage-observed-api-version": "v1alpha3",
                "network.harvesterhci.io/ips": "[]"},
            "finalizers": ["harvesterhci.io/VMController.UnsetOwnerOfPVCs"],
            "labels": {"harvesterhci.io/creator": "harvester", "harvesterhci.io/os": "ubuntu"},
        },
        "spec": {"runStrategy": "RerunOnFailure", "template": {
            "metadata": {"annotations": {"harvesterhci.io/sshNames": "[]"}, "creationTimestamp": None,
                         "labels": {"harvesterhci.io/vmName": name}},
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "network.harvesterhci.io/mgmt", "operator": "In", "values": ["true"]}]}]}}},
                "domain": {
                    "cpu": {"cores": 2, "sockets": 1, "threads": 1},
                    "devices": {
                        "disks": [{"bootOrder": 1, "disk": {"bus": "virtio"}, "name": "disk-0"},
                                  {"disk": {"bus": "virtio"}, "name": "cloudinitdisk"}],
                        "hostDevices": _seed_devices(host_devices),
                        "inputs": [{"bus": "usb", "name": "tablet", "type": "tablet"}],
                        "interfaces": [{"bridge": {}, "macAddress": "8e:ea:e6:44:71:a4", "model": "virtio",
                                        "name": "default"}]},
                    "features": {"acpi": {"enabled": True}},
                    "machine": {"type": "q35"},
                    "memory": {"guest": "1948Mi"},
                    "resources": {"limits": {"cpu": "2", "memory": "2Gi"},
                                  "requests": {"cpu": "125m", "memory": "1365Mi"}}},
                "evictionStrategy": "LiveMigrate",
                "hostname": "vm",
                "networks": [{"multus": {"networkName": "default/mgmt-vlan1"}, "name": "default"}],
                "terminationGracePeriodSeconds": 20,
                "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0-poe6b"}},
                            {"cloudInitNoCloud": {"networkDataSecretRef": {"name": f"{name}-pq07v"},
                                                  "secretRef": {"name": f"{name}-pq07v"}},
                             "name": "cloudinitdisk"}]}}},
    }


def seed_vm2(name: str = "vm2", namespace: str = "default", *, host_devices: list[dict] | None = None) -> dict:
    """The seed's vm2, created "by editing VM manifest" naming vm1's device (the UI would refuse)."""
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {
            "name": name, "namespace": namespace,
            "annotations": {
                "harvesterhci.io/volumeClaimTemplates": json.dumps([{
                    "metadata": {"name": f"{name}-disk-0-nwcnt",
                                 "annotations": {"harvesterhci.io/imageId": "default/image-sgj9r"}},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}},
                             "volumeMode": "Block", "storageClassName": "longhorn-image-sgj9r"}}]),
                "network.harvesterhci.io/ips": "[]"},
            "labels": {"harvesterhci.io/creator": "harvester", "harvesterhci.io/os": "ubuntu"},
        },
        "spec": {"runStrategy": "RerunOnFailure", "template": {
            "metadata": {"annotations": {"harvesterhci.io/sshNames": "[]"}, "creationTimestamp": None,
                         "labels": {"harvesterhci.io/vmName": name}},
            "spec": {
                "affinity": {},
                "domain": {
                    "cpu": {"cores": 2, "sockets": 1, "threads": 1},
                    "devices": {
                        "disks": [{"name": "disk-0", "disk": {"bus": "virtio"}, "bootOrder": 1},
                                  {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}],
                        "hostDevices": _seed_devices(host_devices),
                        "inputs": [{"bus": "usb", "name": "tablet", "type": "tablet"}],
                        "interfaces": [{"bridge": {}, "model": "virtio", "name": "default"}]},
                    "features": {"acpi": {"enabled": True}},
                    "machine": {},
                    "resources": {"limits": {"cpu": "2", "memory": "2Gi"}}},
                "evictionStrategy": "LiveMigrate",
                "networks": [{"name": "default", "multus": {"networkName": "default/mgmt-vlan1"}}],
                "terminationGracePeriodSeconds": 20,
                "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0-nwcnt"}},
                            {"name": "cloudinitdisk", "cloudInitNoCloud": {
                                "secretRef": {"name": f"{name}-y6ly6"},
                                "networkDataSecretRef": {"name": f"{name}-y6ly6"}}}],
                "accessCredentials": []}}},
    }


# -- small objects for the decision table ---------------------------------------------------------
def _devices(devices: tuple[dict, ...]) -> dict:
    return {"hostDevices": list(devices)} if devices else {}


def vm(name: str, *devices: dict, namespace: str = "default", allocation: dict | None = None) -> dict:
    """A VM naming `devices` (host_device(...) dicts); `allocation` is deviceAllocationDetails."""
    obj = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
           "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name))},
           "spec": {"runStrategy": "RerunOnFailure",
                    "template": {"spec": {"domain": {"devices": _devices(devices)}}}}}
    if allocation is not None:
        obj["metadata"]["annotations"] = {"harvesterhci.io/deviceAllocationDetails": json.dumps(allocation)}
    return obj


def vmi(name: str, *devices: dict, phase: str = "Running", node: str | None = SEED_NODE, namespace: str = "default",
        unschedulable: str | None = None, owned: bool = True, since: datetime = NOW - timedelta(hours=1),
        migration: dict | None = None) -> dict:
    """A VMI of VM `name` (same name) in `phase`; `unschedulable` is the scheduler's message."""
    obj = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
           "spec": {"domain": {"devices": _devices(devices)}},
           "status": {"phase": phase, "phaseTransitionTimestamps": [
               {"phase": phase, "phaseTransitionTimestamp": stamp(since)}]}}
    if owned:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
                                               "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "controller": True}]
    if node and phase in ("Scheduled", "Running"):
        obj["status"]["nodeName"] = node
    if unschedulable:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": unschedulable}]
    if migration:
        obj["status"]["migrationState"] = migration
    return obj


def insufficient(resource: str = VF, nodes: int = 1) -> str:
    """kube-scheduler's FitError, as in the seed."""
    return f"0/{nodes} nodes are available: {nodes} Insufficient {resource}."

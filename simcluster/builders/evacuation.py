"""Builders for evacuation-report's test objects, as KubeVirt, Harvester and Kubernetes write them (docs/facts.md
§10): a Node (cordoned, tainted, in Harvester's maintenance, NotReady), a running VM and its VMI on a node (eviction
strategy, LiveMigratable, Harvester's maintenance label), an evacuation VMIM, Harvester's Settings and Upgrade, a
VolumeAttachment."""
from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from shared import nodes as n

NOT_SHARED = ("cannot migrate VMI: PVC {} is not shared, live migration requires that all PVCs must be shared "
              "(using ReadWriteMany access mode)")  # virt-handler's DisksNotLiveMigratable message (vm.go)


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, *, ready: str = "True", since: datetime | None = None, cordoned: bool = False,
         taints: Sequence[tuple[str, str, str]] = (), annotations: Mapping[str, str] | None = None) -> dict:
    reason = {"True": "KubeletReady", "False": "KubeletNotReady", "Unknown": "NodeStatusUnknown"}[ready]
    when = stamp(since or datetime.now(UTC))
    resources = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "500Gi", "pods": "250",
                 "devices.kubevirt.io/kvm": "1000", "devices.kubevirt.io/tun": "1000",
                 "devices.kubevirt.io/vhost-net": "1000"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubevirt.io/schedulable": "true"},
                         "annotations": dict(annotations or {})},
            "spec": {**({"unschedulable": True} if cordoned else {}),
                     **({"taints": [{"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in taints]}
                        if taints else {})},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": ready, "reason": reason, "lastHeartbeatTime": when,
                                       "lastTransitionTime": when}]}}


def drain_taint() -> tuple[str, str, str]:
    return n.DRAIN_TAINT, "draining", "NoSchedule"  # upgrade_node.sh's `kubectl taint … kubevirt.io/drain=draining`


def maintenance(forced: bool = False) -> dict[str, str]:
    """What Harvester's node-drain controller leaves once it drained (maintain-status running)."""
    return {n.MAINTAIN_STATUS: "running", **({n.DRAIN_FORCED: "true"} if forced else {})}


def vm(name: str, namespace: str = "default", *, run_strategy: str = "RerunOnFailure",
       eviction: str | None = "LiveMigrateIfPossible", memory: str = "2Gi", claims: Sequence[str] = (),
       cdrom: bool = False, labels: Mapping[str, str] | None = None) -> dict:
    """A VM as Harvester's UI makes one (evictionStrategy LiveMigrateIfPossible, pkg/data/template.go)."""
    disks = [{"name": f"disk-{i}", "disk": {"bus": "virtio"}} for i, _ in enumerate(claims)]
    volumes = [{"name": f"disk-{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]
    if cdrom:
        disks.append({"name": "cdrom", "cdrom": {"bus": "sata"}})
        volumes.append({"name": "cdrom", "containerDisk": {"image": "registry.example/iso:1"}})
    spec: dict = {"domain": {"devices": {"disks": disks}, "resources": {"requests": {"memory": memory}}},
                  "volumes": volumes}
    if eviction:
        spec["evictionStrategy"] = eviction
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": dict(labels or {})},
            "spec": {"runStrategy": run_strategy,
                     "template": {"metadata": {"labels": dict(labels or {})}, "spec": spec}},
            "status": {"printableStatus": "Running"}}


def vmi(of: dict, node_name: str, *, migratable: tuple[str, str, str] | None = ("True", "", ""),
        phase: str = "Running", evacuation_node: str | None = None) -> dict:
    """The VMI of `of` running on `node_name`, as virt-controller and virt-handler leave it."""
    meta = of["metadata"]
    status: dict = {"phase": phase, "nodeName": node_name, "conditions": []}
    if migratable is not None:
        status["conditions"].append({"type": "LiveMigratable", "status": migratable[0], "reason": migratable[1] or None,
                                     "message": migratable[2] or None})
    if evacuation_node:
        status["evacuationNodeName"] = evacuation_node
    labels = {**(of["spec"]["template"]["metadata"].get("labels") or {}), "kubevirt.io/nodeName": node_name}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": str(uuid.uuid4()),
                         "labels": labels,
                         "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                              "name": meta["name"], "uid": meta["uid"], "controller": True}]},
            "spec": json.loads(json.dumps(of["spec"]["template"]["spec"])), "status": status}


def evacuation(of_vmi: dict, node_name: str, *, name: str | None = None, phase: str = "Pending") -> dict:
    """The VMIM KubeVirt's evacuation controller creates (evacuation.go GenerateNewMigration)."""
    meta = of_vmi["metadata"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": name or f"kubevirt-evacuation-{uuid.uuid4().hex[:5]}", "namespace": meta["namespace"],
                         "annotations": {"kubevirt.io/evacuationMigration": node_name}},
            "spec": {"vmiName": meta["name"]}, "status": {"phase": phase}}


def setting(name: str, value: str = "", default: str = "") -> dict:
    return {"apiVersion": "harvesterhci.io/v1beta1", "kind": "Setting", "metadata": {"name": name},
            "default": default, "value": value}


def reset_policy(period: int, migration_timeout: int | None = None, enable: bool = True) -> dict:
    policy: dict = {"enable": enable, "period": period}
    if migration_timeout is not None:
        policy["vmMigrationTimeout"] = migration_timeout
    return setting("vm-force-reset-policy", default=json.dumps(policy, separators=(",", ":")))


def upgrade(name: str, node_states: Mapping[str, str], *, state: str = "UpgradingNodes",
            namespace: str = "harvester-system") -> dict:
    return {"apiVersion": "harvesterhci.io/v1beta1", "kind": "Upgrade",
            "metadata": {"name": name, "namespace": namespace, "labels": {"harvesterhci.io/upgradeState": state}},
            "spec": {"version": "v1.7.1"},
            "status": {"nodeStatuses": {k: {"state": v} for k, v in node_states.items()}}}

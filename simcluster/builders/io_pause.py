"""Small builders for io-pause-report's test objects: a VMI paused on an IO error, its PVC, PV,
Longhorn Volume and Engine (longhorn.io/v1beta2, shaped by upstream/longhorn/v1.10.0/crds.yaml),
and the Events KubeVirt and the function record (docs/facts.md §5)."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from shared.finding import Finding

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
LONGHORN_NS = "longhorn-system"
GIB = 2**30


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def paused_condition(reason: str = "PausedIOError", since: datetime = NOW) -> dict:
    messages = {"PausedIOError": "VMI was paused, low-level IO error detected",
                "PausedByUser": "VMI was paused by user",
                "PausedByMigrationMonitor": "VMI was paused by the migration monitor"}
    return {"type": "Paused", "status": "True", "reason": reason, "message": messages.get(reason, ""),
            "lastProbeTime": None, "lastTransitionTime": stamp(since)}


def make_vmi(name: str = "vm1", namespace: str = "default", *, paused: str | None = "PausedIOError",
             since: datetime = NOW, vm_uid: str | None = "vm-uid-1", uid: str = "vmi-uid-1",
             volumes: list[dict] | None = None, phase: str = "Running", created: datetime | None = None) -> dict:
    """A Running VMI of VM `name`; `paused` is the Paused condition's reason (None = not paused)."""
    vols = volumes if volumes is not None else [
        {"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}},
        {"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": "#cloud-config"}}]
    conditions = [{"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp(NOW)}]
    if paused:
        conditions.append(paused_condition(paused, since))
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "300",
                        "creationTimestamp": stamp(created or NOW - timedelta(days=1))},
           "spec": {"domain": {"devices": {"disks": [{"name": v["name"], "disk": {"bus": "virtio"}} for v in vols]}},
                    "volumes": vols},
           "status": {"phase": phase, "conditions": conditions}}
    if vm_uid:
        vmi["metadata"]["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                               "name": name, "uid": vm_uid, "controller": True,
                                               "blockOwnerDeletion": True}]
    return vmi


def make_pvc(claim: str, pv: str | None, namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace,
                         "annotations": {"volume.kubernetes.io/storage-provisioner": "driver.longhorn.io"}},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block", "storageClassName": "harvester-longhorn",
                     "resources": {"requests": {"storage": "10Gi"}}, **({"volumeName": pv} if pv else {})},
            "status": {"phase": "Bound" if pv else "Pending"}}


def make_pv(name: str, claim: str, namespace: str = "default", *, driver: str = "driver.longhorn.io") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "volumeMode": "Block",
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "harvester-longhorn",
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim},
                     "csi": {"driver": driver, "volumeHandle": name, "fsType": "ext4"}},
            "status": {"phase": "Bound"}}


def make_volume(name: str, *, robustness: str = "degraded", state: str = "attached", size: int = 10 * GIB,
                actual_size: int = 3 * GIB, last_degraded_at: datetime | None = None,
                conditions: list[dict] | None = None) -> dict:
    """A Longhorn Volume (longhorn.io/v1beta2) named after its PV."""
    status = {"state": state, "robustness": robustness, "actualSize": actual_size, "currentNodeID": "harvester-node-0",
              "conditions": conditions or [{"type": "Scheduled", "status": "True", "reason": "", "message": "",
                                            "lastProbeTime": "", "lastTransitionTime": stamp(NOW)}]}
    if last_degraded_at:
        status["lastDegradedAt"] = stamp(last_degraded_at)
    return {"apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
            "metadata": {"name": name, "namespace": LONGHORN_NS, "labels": {"longhornvolume": name}},
            "spec": {"size": str(size), "numberOfReplicas": 3, "frontend": "blockdev", "dataEngine": "v1",
                     "accessMode": "rwx", "migratable": True},
            "status": status}


def make_engine(volume: str, *, rebuilding: int | None = None, error: str = "") -> dict:
    """The volume's Engine; `rebuilding` is the progress of a replica being rebuilt (None = none)."""
    rebuild = {}
    if rebuilding is not None or error:
        rebuild["tcp://10.52.1.12:10010"] = {"isRebuilding": rebuilding is not None, "progress": rebuilding or 0,
                                             "state": "in_progress" if rebuilding is not None else "error",
                                             "error": error, "fromReplicaAddress": "tcp://10.52.0.9:10000"}
    return {"apiVersion": "longhorn.io/v1beta2", "kind": "Engine",
            "metadata": {"name": f"{volume}-e-0", "namespace": LONGHORN_NS, "labels": {"longhornvolume": volume}},
            "spec": {"volumeName": volume, "nodeID": "harvester-node-0", "dataEngine": "v1", "frontend": "blockdev",
                     "active": True},
            "status": {"currentState": "running", "rebuildStatus": rebuild}}


def kubevirt_event(vmi: dict, *, volume: str = "disk-0", count: int = 1, last: datetime = NOW,
                   no_space: bool = False) -> dict:
    """KubeVirt's Warning IOerror Event on the VMI (its count rises with each pause)."""
    message = (f"VM Paused due to not enough space on volume: {volume}" if no_space
               else f"VM Paused due to IO error at the volume: {volume}")
    meta = vmi["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": "Warning", "reason": "IOerror", "message": message, "source": {"component": "virt-handler"},
            "firstTimestamp": stamp(last), "lastTimestamp": stamp(last), "count": count}


def episode_event(vmi: dict, *, start: datetime = NOW, count: int = 1, last: datetime = NOW,
                  category: str = "rebuild-related", reason: str = "IOErrorPause", baseline: int = 0,
                  final_count: int | None = None, message: str = "first report") -> dict:
    """The finding Event io-pause-report keeps an episode in (shared/ledger.py): the episode's facts are in
    the finding's details. reason="IOErrorPauseResolved" gives a resolved episode's Event."""
    meta = vmi["metadata"]
    resolved = reason != "IOErrorPause"
    details = {"vmi": f"{meta['namespace']}/{meta['name']}", "episodeStart": stamp(start), "vmiUid": meta["uid"],
               "baseline": baseline, "reportedCategories": [category], "volumes": []}
    if final_count is not None:
        details["kubevirtCount"] = final_count
    finding = Finding("io-pause-report", category, f"/apis/kubevirt.io/v1/namespaces/{meta['namespace']}/"
                      f"virtualmachineinstances/{meta['name']}", meta["uid"],
                      {"namespace": meta["namespace"], "vm": meta["name"], "volume": ""}, "critical", message,
                      details=details)
    state = "resolved" if resolved else "open"
    notes = {"vmevents.io/finding": json.dumps(finding.data(state)), "vmevents.io/finding-episode": "1",
             "vmevents.io/finding-opened-by": "ce-1", "vmevents.io/finding-opened-at": stamp(start),
             "vmevents.io/finding-written-at": stamp(last)}
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.f{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"],
                         "labels": {"vmevents.io/finding": "io-pause-report", "vmevents.io/finding-state": state},
                         "annotations": notes},
            "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": "vm-uid-1"},
            "type": "Normal" if resolved else "Warning", "reason": "IOErrorPause", "message": message,
            "source": {"component": "io-pause-report"},
            "firstTimestamp": stamp(start), "lastTimestamp": stamp(last), "count": count}

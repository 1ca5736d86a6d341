"""io-pause-report's story (the seed KB: filesystem trim during a Longhorn replica rebuild): a guest
Kubernetes node's VM flaps Running↔Paused on IO errors while its Longhorn volume rebuilds a replica,
another gets stuck paused (harvester#11585), a third is paused by its user. KubeVirt's resume
backoff (10 s doubling to 3 min) runs 50× faster here."""
from __future__ import annotations

import json
import time

from simcluster.play import PING_INTERVAL, Stage, stage, wait_until

COMPONENT = "io-pause-report"
SETTINGS = {"IO_PAUSE_STUCK_AFTER": "4s", "IO_PAUSE_RESOLVED_AFTER": "6s"}
IO_TIME_SCALE = 0.02
LONGHORN_NS = "longhorn-system"


def seed_storage(s: Stage, vm: str, pv: str) -> None:
    """disk-0 → PVC → PV (driver.longhorn.io) → a Longhorn volume degraded, rebuilding a replica."""
    claim = f"{vm}-disk-0"
    s.cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                      "metadata": {"name": claim, "namespace": "default"},
                      "spec": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block", "volumeName": pv,
                               "storageClassName": "harvester-longhorn",
                               "resources": {"requests": {"storage": "20Gi"}}},
                      "status": {"phase": "Bound"}})
    s.cluster.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                      "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteMany"],
                               "claimRef": {"namespace": "default", "name": claim},
                               "csi": {"driver": "driver.longhorn.io", "volumeHandle": pv}},
                      "status": {"phase": "Bound"}})
    s.cluster.create({"apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
                      "metadata": {"name": pv, "namespace": LONGHORN_NS},
                      "spec": {"size": str(20 * 2**30), "numberOfReplicas": 3, "frontend": "blockdev"},
                      "status": {"state": "attached", "robustness": "degraded", "actualSize": 6 * 2**30}})
    s.cluster.create({"apiVersion": "longhorn.io/v1beta2", "kind": "Engine",
                      "metadata": {"name": f"{pv}-e-0", "namespace": LONGHORN_NS, "labels": {"longhornvolume": pv}},
                      "spec": {"volumeName": pv, "nodeID": "harvester-node-0"},
                      "status": {"currentState": "running", "rebuildStatus": {"tcp://10.52.1.12:10010": {
                          "isRebuilding": True, "progress": 23, "state": "in_progress"}}}})


def seed_vm(s: Stage, name: str) -> None:
    s.cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                      "metadata": {"name": name, "namespace": "default"},
                      "spec": {"runStrategy": "Always", "template": {"spec": {
                          "domain": {"devices": {"disks": [{"name": "disk-0", "disk": {"bus": "virtio"}}]},
                                     "resources": {"requests": {"memory": "2Gi"}}},
                          "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}}]}}}})


def play() -> None:
    with stage("io-pause-report: trim during a Longhorn rebuild (the seed KB)",
               env_overrides={COMPONENT: SETTINGS}) as s:
        s.kubevirt.io_time_scale = IO_TIME_SCALE
        _play(s)


def _play(s: Stage) -> None:
    s.timeline.line("setup", f"io-pause-report runs with {', '.join(f'{k}={v}' for k, v in SETTINGS.items())}; "
                             f"PingSource every {PING_INTERVAL:g}s; KubeVirt's backoff ×{IO_TIME_SCALE}")
    cast = {"etcd-1": "pvc-7a1e0c4d", "etcd-2": "pvc-91b3f0aa", "desktop": "pvc-0c55e2d1"}
    for name, pv in cast.items():
        seed_storage(s, name, pv)
        seed_vm(s, name)
    wait_until(lambda: all(_phase(s, n) == "Running" for n in cast), 20)
    s.timeline.line("running", "etcd-1, etcd-2 (a guest Kubernetes cluster) and desktop run; their Longhorn volumes "
                               "are degraded, each rebuilding a replica (23%)")
    s.kubevirt.start_io_errors("default", "etcd-1", "disk-0")
    s.timeline.line("fstrim", "etcd-1's guest runs fstrim during the rebuild: IO errors, KubeVirt pauses and "
                              "resumes it")
    s.kubevirt.start_io_errors("default", "etcd-2", "disk-0", stuck=True)
    s.timeline.line("fstrim", "etcd-2 hits the same IO error, and KubeVirt never resumes it (harvester#11585)")
    _pause_by_user(s, "desktop")
    s.timeline.line("pause", "desktop is paused by its user (PausedByUser): not an IO error")
    wait_until(lambda: s.report_events(COMPONENT) and s.kubevirt.io_pauses("default", "etcd-1") >= 5, 30)
    s.timeline.line("flapping", f"etcd-1 has paused {s.kubevirt.io_pauses('default', 'etcd-1')} times")
    wait_until(lambda: s.report_events(COMPONENT) and _has_event(s, "etcd-2", 2), 30)
    for name, pv in cast.items():
        if name != "desktop":
            _rebuild_done(s, pv)
    s.kubevirt.stop_io_errors("default", "etcd-1")
    s.timeline.line("rebuilt", "Longhorn finished both rebuilds: the volumes are healthy again")
    wait_until(lambda: s.report_events(COMPONENT) and _has_event(s, "etcd-1", 1, "IOErrorPauseResolved"), 30)
    uid = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "etcd-2")["metadata"]["uid"]
    s.cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "etcd-2")
    s.timeline.line("restart", "the operator stops and starts etcd-2, as the report advised")
    wait_until(lambda: (v := s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "etcd-2"))
               and v["metadata"]["uid"] != uid, 20)
    wait_until(lambda: s.report_events(COMPONENT) and _has_event(s, "etcd-2", 1, "IOErrorPauseResolved"), 30)
    time.sleep(PING_INTERVAL * 1.5)
    s.knative.wait_idle(10)
    s.report_events(COMPONENT)
    _summary(s, cast)


def _pause_by_user(s: Stage, name: str) -> None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    conditions = (vmi["status"].get("conditions") or []) + [{
        "type": "Paused", "status": "True", "reason": "PausedByUser", "message": "VMI was paused by user",
        "lastProbeTime": None, "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    s.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", name, {"status": {"conditions": conditions}})


def _rebuild_done(s: Stage, pv: str) -> None:
    s.cluster.patch("longhorn.io/v1beta2", "Volume", LONGHORN_NS, pv, {"status": {"robustness": "healthy"}},
                    subresource="status")
    s.cluster.patch("longhorn.io/v1beta2", "Engine", LONGHORN_NS, f"{pv}-e-0", {"status": {"rebuildStatus": None}},
                    subresource="status")


def _phase(s: Stage, name: str) -> str | None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")


def _has_event(s: Stage, name: str, at_least: int, reason: str = "IOErrorPause") -> bool:
    return len([e for e in s.kube_events(COMPONENT) if e["involvedObject"]["name"] == name
                and e["reason"] == reason]) >= at_least


def _summary(s: Stage, cast: dict) -> None:
    replies = []
    for event in list(s.knative.broker.received):
        if event["source"] == f"/vmevents/{COMPONENT}":
            data = json.loads(event.data) if isinstance(event.data, (bytes, str)) else event.data
            replies.extend((f["state"], f["details"]) for f in data.get("findings", [data]))
    print(f"\n  {'VM':<9} {'KubeVirt IOerror':<17} Events and replies of io-pause-report")
    for name in cast:
        kubevirt = sum(e["count"] for e in s.cluster.list("v1", "Event", "default")
                       if e["involvedObject"]["name"] == name and e["reason"] == "IOerror")
        events = [e for e in s.kube_events(COMPONENT) if e["involvedObject"]["name"] == name]
        notes = ("; ".join(f"{e['type']} {e['reason']} ×{e.get('count', 1)}" for e in events)
                 or "— (nothing: not an IO error)")
        said = ", ".join(f".{kind} {d.get('category')}" for kind, d in replies if d["vmi"] == f"default/{name}")
        print(f"  {name:<9} {kubevirt:<17} {notes}" + (f"; replies: {said}" if said else ""))
    print(f"  ({s.timeline.irrelevant} irrelevant events answered without an API call; "
          f"{s.timeline.repeats} repeated decisions not shown)")

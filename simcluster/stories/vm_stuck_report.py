"""vm-stuck-report's story: VMs stuck the ways Harvester users report — a vGPU VM after the cluster shrank
(harvester#8478), a disk whose StorageClass is gone, a migration a ResourceQuota has no room for (harvester#9435),
VMs that stay Stopping after a node went away (harvester#4280) — and vm-stuck-report names each one's cause, its
evidence and the next step, once. The VM stuck Stopping on the dead node is that node's: evacuation-report lists it
in the node's one finding and vm-stuck-report defers; the node comes back and that finding ends, once. The simulated
KubeVirt writes each VM's printableStatus from its VMI, places launcher pods on the cluster's Node objects, and
reads PVCs; it does not model migration, so the story plays the migration controller's part (the VMIM, and the
FailedCreate Event KubeVirt records on the VMI when the quota refuses the target pod)."""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from simcluster.builders import stuck as b
from simcluster.play import PING_INTERVAL, Stage, stage, wait_until

COMPONENT = "vm-stuck-report"
AFTER = 6  # VM_STUCK_AFTER here, seconds (10m in deploy/)
GPU = "nvidia.com/NVIDIA_L40S-8Q"


def play() -> None:
    with stage("vm-stuck-report, KubeVirt 1.3.1 (Harvester 1.4)", volumes=True,
               env_overrides={COMPONENT: {"VM_STUCK_AFTER": f"{AFTER}s"},
                              "evacuation-report": {"EVACUATION_DOWN_AFTER": "1s"}}) as s:
        _play(s)


def _vm(s: Stage, name: str, **kw) -> None:
    obj = b.vm(name, status=None, **kw)
    obj["metadata"] = {"name": name, "namespace": "default"}
    obj.pop("status")
    s.cluster.create(obj)


def _node(s: Stage, obj: dict) -> None:
    s.cluster.create(obj)  # the node lifecycle controller clears the admission's not-ready taint of a Ready node
    s.cluster.patch("v1", "Node", None, obj["metadata"]["name"], {"spec": {"taints": None}})


def _status(s: Stage, name: str) -> str:
    vm = s.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name) or {}
    return (vm.get("status") or {}).get("printableStatus") or ""


def _play(s: Stage) -> None:
    _node(s, b.node("harvester-a", allocatable={"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "1"}))
    _node(s, b.node("harvester-b", allocatable={"cpu": "16", "memory": "64Gi", "pods": "110"}))
    s.timeline.line("setup", f"2 nodes; harvester-a has one {GPU}; VM_STUCK_AFTER {AFTER}s (10m in deploy/); "
                             f"PingSource every {PING_INTERVAL:g}s")
    s.cluster.create(b.pvc("archive-disk", storage_class="longhorn-archive"))  # a StorageClass nobody created
    cast = [("vgpu", dict(devices=(GPU, GPU)), "asks for two vGPUs; the cluster that had two such nodes shrank"),
            ("archive", dict(claims=("archive-disk",)), "its disk's StorageClass longhorn-archive does not exist"),
            ("db", dict(memory="8Gi"), "runs; then a migration the namespace's quota has no room for"),
            ("web", {}, "runs on a node that then stops answering; the VM is stopped (evacuation-report's)"),
            ("fine", {}, "starts normally: nothing to say")]
    for name, kw, why in cast:
        _vm(s, name, **kw)
        s.timeline.line("create", f"VM default/{name}: {why}")
    wait_until(lambda: _status(s, "db") == "Running" and _status(s, "web") == "Running", 30)
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "db")
    s.cluster.create(b.quota("tenant-quota", hard={"requests.memory": "16Gi"}, used={"requests.memory": "13Gi"}))
    migration = b.vmim(vmi, name="db-maintenance", rejected_by_quota=True)
    migration["metadata"] = {"name": "db-maintenance", "namespace": "default"}
    s.cluster.create(migration)
    s.cluster.create(b.event(vmi, "FailedCreate", 'Error creating pod: pods "virt-launcher-db-target" is forbidden: '
                             'exceeded quota: tenant-quota, requested: requests.memory=8Gi, used: '
                             'requests.memory=13Gi, limited: requests.memory=16Gi',
                             component="virtualmachine-controller", when=datetime.now(UTC)))
    s.timeline.line("migrate", "VMIM default/db-maintenance: the quota refuses its target pod (FailedCreate)")
    node = (vmi_web := s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "web") or {}) and \
        vmi_web["status"].get("nodeName")
    s.cluster.patch("v1", "Node", None, node, {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
         "lastHeartbeatTime": b.stamp(datetime.now(UTC)), "lastTransitionTime": b.stamp(datetime.now(UTC))}]}},
        subresource="status")
    s.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "web", {"spec": {"runStrategy": "Halted"}})
    s.timeline.line("node", f"node {node} stops answering (Ready=Unknown); VM default/web is stopped")
    wait_until(lambda: len(_notices(s)) >= 3 and _notices(s, function="evacuation-report"), AFTER + 30)
    time.sleep(PING_INTERVAL * 1.5)  # another tick: nothing is announced twice
    s.knative.wait_idle(10)
    _summary(s)
    s.cluster.patch("v1", "Node", None, node, {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "lastHeartbeatTime": b.stamp(datetime.now(UTC)), "lastTransitionTime": b.stamp(datetime.now(UTC))}]}},
        subresource="status")
    s.timeline.line("node", f"node {node} is back: virt-handler completes web's stop")
    wait_until(lambda: _notices(s, "resolved", function="evacuation-report"), 30)
    s.knative.wait_idle(10)
    for notice in _notices(s, "resolved", function="evacuation-report"):
        print(f"  resolved: node {notice['details']['node']}: {notice['details'].get('because')}")
    print(f"  ({s.timeline.irrelevant} irrelevant events answered without an API call; "
          f"{s.timeline.repeats} repeated decisions not shown)")


def _notices(s: Stage, state: str = "detected", function: str = COMPONENT) -> list[dict]:
    found = []
    for event in list(s.knative.broker.received):
        if event["source"] == f"/vmevents/{function}":
            data = json.loads(event.data) if isinstance(event.data, (bytes, str)) else event.data
            found += [i for i in data.get("findings", [data]) if i.get("state") == state]
    return found


def _summary(s: Stage) -> None:
    notices = _notices(s)
    print(f"\n  {len(notices)} notice(s), one per stuck VM (web's is the dead node's: evacuation-report's); "
          f"the reports:")
    for n in notices:
        d = n["details"]
        what = (f"migration {d['migration']} {d['state'].removeprefix('Migration')}" if d.get("migration")
                else d["state"])
        print(f"\n  VM {d['vm']} — {what} since {d['since']} — cause: {d['cause']}")
        for line in d["evidence"][:3]:
            print(f"      evidence: {line[:220]}")
        print(f"      next step: {d['nextStep'][:260]}")
    counts = {e["involvedObject"]["name"]: e["count"] for e in s.kube_events(COMPONENT)}
    print(f"\n  VMStuck Events on the VMs (name: count): {counts}; VM default/fine: none")

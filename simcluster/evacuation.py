"""What moves a VM off its node, played where neither backend runs the real component (docs/facts.md §10):

- **virt-handler's `LiveMigratable`** (both backends: no virt-handler runs): a Running VMI gets the condition once,
  `False` with KubeVirt's reason and message for host devices or GPUs (`HostDeviceNotLiveMigratable`, "VMI uses a
  PCI host devices") and for a PVC that is not ReadWriteMany (`DisksNotLiveMigratable`), else `True`
  (pkg/virt-handler/vm.go).
- **virt-api's eviction webhook** (both backends: no virt-api runs), in `drain(node)`, what `kubectl drain` does:
  cordon, then each launcher pod's eviction judged as pod-eviction-admitter.go does — `LiveMigrate` not migratable:
  denied; migrating on eviction: `status.evacuationNodeName` set; otherwise the pod is evicted (deleted). A refused
  eviction is recorded in `denied`, as kubectl prints it.
- **KubeVirt's evacuation controller and the end of its migrations** (the simulator only; on the real backend virt-
  controller's own run, and the node stand-in plays virt-handler's part): the drain taint or a VMI marked for
  eviction gets a `kubevirt-evacuation-` VMIM (annotated with the node, `SuccessfulCreate` on the VMI), at most
  `parallelOutboundMigrationsPerNode` (2) at once from a node; a not migratable one a Normal `FailedCreate`
  "VirtualMachineInstance is not migrateable" (component `evacuation-controller`). The migration then ends as
  `plan()` says: Succeeded (the VMI on another Ready, schedulable node) or Failed with a failureReason (Warning
  `FailedMigration` on the VMIM, `Migrated` on the VMI). A Running VMI whose launcher pod is gone turns Failed
  (vmi.go), and one on a node whose heartbeat is 5 minutes old with no live pod turns Failed `NodeUnresponsive`
  (node controller).
- **Kubernetes' non-graceful shutdown** (both backends: kube-controller-manager runs neither the taint manager nor the
  pod GC here): a NotReady node tainted `node.kubernetes.io/out-of-service:NoExecute` has its pods force-deleted.
- **Harvester's controllers** (both backends, with `harvester=<version>`): maintenance mode (the node-drain controller:
  labelled VMs stopped, forced mode's non-migratable VMs stopped, cordon and drain, `maintain-status: running`; the
  maintain controller: `completed` once empty, `ShutdownAndRestartAfterEnable` VMs started); and the node-down
  controller with `vm-force-reset-policy`, per version (≤ 1.6: pods force-deleted and heartbeat rewound after
  `period`; ≥ 1.7, Ready=Unknown only: the drain taint and `Drained=False` after `period`, the out-of-service taint
  and `Drained=True` after `vmMigrationTimeout`; both taints lifted when Ready again; nothing during an Upgrade).

Harvester's and KubeVirt's waits run at `time_scale` (tests: 0.01). One polling thread does every write.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shared import kubevirt as kv
from shared import nodes as n
from shared import objects as o
from shared.kinds import EVENT, HARVESTER_SETTING, HARVESTER_UPGRADE, NODE, POD, PVC, VM, VMI, VMIM, Kind
from shared.kube import Conflict, Kube, NotFound

EVACUATION = "kubevirt.io/evacuationMigration"
STRATEGY = "harvesterhci.io/maintain-mode-strategy"
STRATEGY_NODE = "harvesterhci.io/maintain-mode-strategy-node-name"
SHUTDOWN = ("Shutdown", "ShutdownAndRestartAfterEnable", "ShutdownAndRestartAfterDisable")
HOST_DEVICE = ("HostDeviceNotLiveMigratable", "VMI uses a PCI host devices")
NOT_SHARED = ("cannot migrate VMI: PVC {} is not shared, live migration requires that all PVCs must be shared "
              "(using ReadWriteMany access mode)")
HEARTBEAT_TIMEOUT = 300.0


@dataclass
class Plan:
    """How the next evacuation migration of one VMI ends (simulator only)."""

    fail: str | None = None   # a failureReason: the migration fails with it; None: it succeeds


def now_stamp(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def live_migratable(vmi: Mapping, pvcs: Mapping[str, Mapping]) -> tuple[str, str, str]:
    """virt-handler's LiveMigratable for this VMI (vm.go calculateLiveMigrationCondition, the two reasons played)."""
    devices = o.mapping(vmi, "spec", "domain", "devices")
    if o.array(devices, "hostDevices") or o.array(devices, "gpus"):
        return "False", *HOST_DEVICE
    for volume in o.objects(vmi, "spec", "volumes"):
        claim = o.text(volume, "persistentVolumeClaim", "claimName") or o.text(volume, "dataVolume", "name")
        if claim and "ReadWriteMany" not in o.array(pvcs.get(claim), "spec", "accessModes"):
            return "False", "DisksNotLiveMigratable", NOT_SHARED.format(claim)
    return "True", "", ""


def eviction_strategy(vmi: Mapping, kubevirt: Mapping | None) -> str:
    return o.text(vmi, "spec", "evictionStrategy") or o.text(kubevirt, "spec", "configuration",
                                                            "evictionStrategy") or "None"


def migrates_on_eviction(vmi: Mapping, kubevirt: Mapping | None) -> bool:
    """migrations.VMIMigratableOnEviction."""
    strategy = eviction_strategy(vmi, kubevirt)
    return strategy == "LiveMigrate" or (strategy == "LiveMigrateIfPossible" and _migratable(vmi))


def admit_eviction(vmi: Mapping, kubevirt: Mapping | None, pod_node: str) -> str:
    """virt-api's pod-eviction-admitter: "deny", "mark" (set evacuationNodeName, deny this eviction), "pass", or
    "protected": marked already, the webhook lets it through and KubeVirt's PodDisruptionBudget refuses it (429)
    while the evacuation runs (disruptionbudget.go)."""
    strategy = eviction_strategy(vmi, kubevirt)
    if strategy == "LiveMigrate" and not _migratable(vmi):
        return "deny"
    mark = strategy in ("LiveMigrate", "External") or (strategy == "LiveMigrateIfPossible" and _migratable(vmi))
    if mark:
        marked = o.string(vmi, "status", "evacuationNodeName")
        return "mark" if not marked and o.string(vmi, "status", "nodeName") == pod_node else "protected"
    return "pass"


def _migratable(vmi: Mapping) -> bool:
    return any(c.get("type") == "LiveMigratable" and c.get("status") == "True" for c in kv.conditions_of(vmi))


class EvacuationSim:
    """See the module docstring. `kubevirt`: play KubeVirt's evacuation controller, migrations and VMI failures
    (default: only where KubeVirt's own virt-controller does not run). `harvester`: play Harvester of that version."""

    def __init__(self, cluster: Any, *, harvester: str | None = None, kubevirt: bool | None = None,
                 time_scale: float = 0.01, period: float = 0.1, harvester_namespace: str = "harvester-system"):
        self.cluster = cluster
        self.kube = Kube(cluster.api_client())
        self.harvester = kv.parse_version(harvester) if harvester else None
        self.plays_kubevirt = (not getattr(cluster, "runs_virt_controller", False)) if kubevirt is None else kubevirt
        self.time_scale, self.period, self.harvester_namespace = time_scale, period, harvester_namespace
        self.plans: dict[tuple[str, str], Plan] = {}
        self.denied: list[str] = []
        self._draining: set[str] = set()       # nodes `drain()` keeps evicting from, as kubectl drain retries
        self._since: dict[tuple[str, str], float] = {}  # (what, node) -> monotonic time it began, for waits
        self._recorded: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.errors: list[str] = []  # the last passes' failures, for a test's message

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> EvacuationSim:
        self._thread = threading.Thread(target=self._loop, name="evacuation-sim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wait_idle(self, timeout: float = 15.0) -> None:
        """Two passes in a row that wrote nothing."""
        deadline, quiet = time.monotonic() + timeout, 0
        while quiet < 2 and time.monotonic() < deadline:
            before = self.writes
            time.sleep(self.period * 2)
            quiet = quiet + 1 if self.writes == before else 0

    # -- what a person does -----------------------------------------------------------------------
    def plan(self, namespace: str, vmi: str, *, fail: str | None = None) -> None:
        self.plans[(namespace, vmi)] = Plan(fail)

    def drain(self, node: str) -> None:
        """`kubectl drain`: cordon, then keep evicting the node's launcher pods (virt-api judging each)."""
        self.kube.merge_patch(NODE, None, node, {"spec": {"unschedulable": True}})
        with self._lock:
            self._draining.add(node)

    def uncordon(self, node: str) -> None:
        """`kubectl uncordon`: the drain is over (or given up)."""
        with self._lock:
            self._draining.discard(node)
        self.kube.merge_patch(NODE, None, node, {"spec": {"unschedulable": None}})

    def maintenance(self, node: str, *, force: bool = False) -> None:
        """Harvester UI's Enable Maintenance Mode (formatter.go enableMaintenanceMode)."""
        notes = {n.DRAIN_REQUESTED: "true", **({n.DRAIN_FORCED: "true"} if force else {})}
        self.kube.merge_patch(NODE, None, node, {"metadata": {"annotations": notes}})

    def set_ready(self, node: str, status: str) -> None:
        """The kubelet's word (False: it reports NotReady) or the node lifecycle controller's (Unknown: the kubelet
        stopped posting), with the taints that controller keeps in step (node.kubernetes.io/not-ready or
        unreachable, NoSchedule and NoExecute: pkg/controller/nodelifecycle), so that no scheduler places a pod there.
        Ready again lifts them."""
        stamp = now_stamp()
        reason = {"True": "KubeletReady", "False": "KubeletNotReady", "Unknown": "NodeStatusUnknown"}[status]
        self.kube.request("PATCH", NODE.path(None, node, "status"), content_type="application/merge-patch+json",
                          body={"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                                                           "lastHeartbeatTime": stamp,
                                                           "lastTransitionTime": stamp}]}})
        current = self.kube.get(NODE, None, node) or {}
        keys = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        taints = [t for t in o.objects(current, "spec", "taints") if t.get("key") not in keys]
        if status != "True":
            key = keys[0] if status == "False" else keys[1]
            taints += [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute", "timeAdded": stamp}]
        self.kube.merge_patch(NODE, None, node, {"spec": {"taints": taints or None}})

    # -- the loop -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a race with a test's own write: the next pass sees it again
                self.errors.append(f"{exc.__class__.__name__}: {exc}")
                del self.errors[:-20]

    def step(self) -> None:
        nodes = {o.string(x, "metadata", "name"): x for x in self.kube.list(NODE)}
        vmis = list(self.kube.list(VMI))
        kubevirt = next(iter(self.kube.list(Kind("kubevirt.io/v1", "KubeVirt", "kubevirts"))), None)
        self._virt_handler(vmis, nodes)
        if self.harvester is not None:
            self._harvester(nodes, vmis, kubevirt)
        with self._lock:
            draining = set(self._draining)
        for node in sorted(draining & set(nodes)):
            self._evict(node, vmis, kubevirt)
        self._out_of_service(nodes)
        if self.plays_kubevirt:
            self._kubevirt(nodes, vmis, kubevirt)

    def _write(self, fn: Callable[..., Any]) -> Any:
        try:
            result = fn()
        except (Conflict, NotFound):
            return None
        self.writes += 1
        return result

    def _waited(self, what: str, node: str, seconds: float) -> bool:
        began = self._since.setdefault((what, node), time.monotonic())
        return time.monotonic() - began >= seconds * self.time_scale

    def _forget(self, what: str, node: str) -> None:
        self._since.pop((what, node), None)

    # -- virt-handler: LiveMigratable -----------------------------------------------------------------
    def _virt_handler(self, vmis: list[dict], nodes: Mapping[str, dict]) -> None:
        for vmi in vmis:
            node = nodes.get(o.string(vmi, "status", "nodeName"))
            if kv.phase(vmi) != "Running" or node is None or n.down(node) or \
                    any(c.get("type") == "LiveMigratable" for c in kv.conditions_of(vmi)):
                continue
            namespace = o.string(vmi, "metadata", "namespace")
            pvcs = {o.string(p, "metadata", "name"): p for p in self.kube.list(PVC, namespace)}
            status, reason, message = live_migratable(vmi, pvcs)
            cond = {"type": "LiveMigratable", "status": status, "lastProbeTime": None,
                    "lastTransitionTime": now_stamp(), **({"reason": reason, "message": message} if reason else {})}
            # A JSON patch adds it, as virt-handler's patch does: a merge patch replacing the list would drop every
            # condition's `lastProbeTime: null` (merge patches prune nulls), and virt-controller's own patches,
            # which test the conditions it read, would then fail for ever ("patching of vmi conditions and
            # activePods failed", seen on the real backend).
            op = ({"op": "add", "path": "/status/conditions/-", "value": cond} if kv.conditions_of(vmi)
                  else {"op": "add", "path": "/status/conditions", "value": [cond]})
            self._write(lambda v=vmi, p=op: self.kube.json_patch(VMI, o.string(v, "metadata", "namespace"),
                                                                 o.string(v, "metadata", "name"), [p]))

    # -- kubectl drain through virt-api's webhook -------------------------------------------------------
    def _evict(self, node: str, vmis: list[dict], kubevirt: Mapping | None) -> None:
        by_uid = {o.string(v, "metadata", "uid"): v for v in vmis}
        for pod in self.kube.list(POD, None, label_selector="kubevirt.io=virt-launcher"):
            if o.string(pod, "spec", "nodeName") != node or o.string(pod, "status", "phase") in ("Succeeded", "Failed"):
                continue
            vmi = by_uid.get(kv.labels_of(pod).get("kubevirt.io/created-by", ""))
            if vmi is None or kv.meta(pod).get("deletionTimestamp"):
                continue
            verdict = admit_eviction(vmi, kubevirt, node)
            name = f"{o.string(vmi, 'metadata', 'namespace')}/{o.string(vmi, 'metadata', 'name')}"
            if verdict == "deny" and name not in self.denied:
                self.denied.append(name)
            elif verdict == "mark":
                self._write(lambda v=vmi: self.kube.json_patch(VMI, o.string(v, "metadata", "namespace"),
                                                               o.string(v, "metadata", "name"),
                                                               [{"op": "add", "path": "/status/evacuationNodeName",
                                                                 "value": node}]))
            elif verdict == "pass":
                self._delete_pod(pod, grace=None)

    def _delete_pod(self, pod: Mapping, grace: int | None) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **({"gracePeriodSeconds": grace} if grace is not None
                                                                  else {})}
        self._write(lambda: self.kube.request("DELETE", POD.path(o.string(pod, "metadata", "namespace"),
                                                                 o.string(pod, "metadata", "name")), body=body))

    # -- Kubernetes: the out-of-service taint ---------------------------------------------------------
    def _out_of_service(self, nodes: Mapping[str, dict]) -> None:
        gone = {name for name, node in nodes.items() if n.down(node) and n.has_taint(node, n.OUT_OF_SERVICE,
                                                                                     "NoExecute")}
        if not gone:
            return
        for pod in self.kube.list(POD, None, label_selector="kubevirt.io=virt-launcher"):
            if o.string(pod, "spec", "nodeName") in gone:
                self._delete_pod(pod, grace=0)

    # -- Harvester -------------------------------------------------------------------------------------
    def _harvester(self, nodes: Mapping[str, dict], vmis: list[dict], kubevirt: Mapping | None) -> None:
        upgrading = any(kv.labels_of(u).get("harvesterhci.io/upgradeState") not in ("Succeeded", "Failed")
                        for u in self._list(HARVESTER_UPGRADE, self.harvester_namespace))
        for name, node in nodes.items():
            self._maintenance(name, node, vmis, kubevirt)
            if not upgrading:
                self._node_down(name, node)

    def _maintenance(self, name: str, node: dict, vmis: list[dict], kubevirt: Mapping | None) -> None:
        notes = kv.annotations_of(node)
        on_node = [v for v in vmis if o.string(v, "status", "nodeName") == name and kv.phase(v) not in
                   kv.FINAL_PHASES]
        if notes.get(n.DRAIN_REQUESTED):  # nodedrain_controller.go OnNodeChange
            forced = bool(notes.get(n.DRAIN_FORCED))
            for vmi in on_node:
                strategy = kv.labels_of(vmi).get(STRATEGY, "")
                stop = (not forced and strategy in SHUTDOWN) or (forced and self._harvester_non_migratable(vmi))
                if stop:
                    vm_notes = {STRATEGY_NODE: name} if not forced and strategy in SHUTDOWN[1:] else {}
                    self._write(lambda v=vmi, a=vm_notes: self.kube.merge_patch(
                        VM, o.string(v, "metadata", "namespace"), o.string(v, "metadata", "name"),
                        {"metadata": {"annotations": a}, "spec": {"runStrategy": "Halted"}}))
            self._write(lambda: self.kube.merge_patch(NODE, None, name, {
                "metadata": {"annotations": {n.DRAIN_REQUESTED: None, n.DRAIN_FORCED: None,
                                             n.MAINTAIN_STATUS: "running"}},
                "spec": {"unschedulable": True}}))
            with self._lock:
                self._draining.add(name)  # drainhelper.DrainNode: kubectl's drain, retried on error
        elif notes.get(n.MAINTAIN_STATUS) == "running" and not on_node:  # maintain_controller.go OnNodeChanged
            for vm in self.kube.list(VM):
                if kv.annotations_of(vm).get(STRATEGY_NODE) == name and \
                        kv.labels_of(vm).get(STRATEGY) == "ShutdownAndRestartAfterEnable":
                    strategy = kv.annotations_of(vm).get("harvesterhci.io/vmRunStrategy") or "RerunOnFailure"
                    self._write(lambda v=vm, s=strategy: self.kube.merge_patch(
                        VM, o.string(v, "metadata", "namespace"), o.string(v, "metadata", "name"),
                        {"metadata": {"annotations": {STRATEGY_NODE: None}}, "spec": {"runStrategy": s}}))
            self._write(lambda: self.kube.merge_patch(NODE, None, name, {
                "metadata": {"annotations": {n.MAINTAIN_STATUS: "completed"}}}))
            with self._lock:
                self._draining.discard(name)

    @staticmethod
    def _harvester_non_migratable(vmi: Mapping) -> bool:
        """FindNonMigratableVMS, as far as the VMI shows: a CD-ROM or container disk, or LiveMigratable=False."""
        disks = o.objects(vmi, "spec", "domain", "devices", "disks")
        return any("cdrom" in d for d in disks) or \
            any("containerDisk" in v for v in o.objects(vmi, "spec", "volumes")) or \
            any(c.get("type") == "LiveMigratable" and c.get("status") == "False" for c in kv.conditions_of(vmi))

    def _policy(self) -> dict:
        setting = next((s for s in self._list(HARVESTER_SETTING, None)
                        if o.string(s, "metadata", "name") == "vm-force-reset-policy"), None)
        policy = self._json(o.text(setting, "value")) or self._json(o.text(setting, "default"))
        if policy.get("period"):
            return policy
        newer = self.harvester is None or self.harvester >= (1, 7, 0)
        return {"enable": True, "period": 15, "vmMigrationTimeout": 180} if newer else {"enable": True, "period": 300}

    def _node_down(self, name: str, node: dict) -> None:
        """node_down_controller.go, per version (docs/facts.md §10)."""
        status = n.ready(node)[0]
        newer = self.harvester is not None and self.harvester >= (1, 7, 0)
        if status == "True":
            self._forget("down", name)
            self._forget("drained", name)
            taints = [t for t in o.objects(node, "spec", "taints") if t.get("key") not in (n.DRAIN_TAINT,
                                                                                             n.OUT_OF_SERVICE)]
            if newer and len(taints) != len(o.array(node, "spec", "taints")):
                self._write(lambda: self.kube.merge_patch(NODE, None, name, {"spec": {"taints": taints or None}}))
            if newer and n.condition(node, n.HARVESTER_DRAINED) is not None:
                conditions = [c for c in kv.conditions_of(node) if c.get("type") != n.HARVESTER_DRAINED]
                self._write(lambda: self.kube.request("PUT", NODE.path(None, name, "status"),
                                                      body={**node, "status": {**node["status"],
                                                                               "conditions": conditions}}))
            return
        policy = self._policy()
        if not policy.get("enable") or (newer and status != "Unknown"):
            return
        if not self._waited("down", name, float(policy["period"])):
            return
        if not newer:  # force-delete the launcher pods, rewind the heartbeat (≤ 1.6)
            for pod in self.kube.list(POD, None, label_selector="kubevirt.io=virt-launcher"):
                if o.string(pod, "spec", "nodeName") == name:
                    self._delete_pod(pod, grace=0)
            rewound = now_stamp(datetime.now(UTC) - timedelta(minutes=6))
            if kv.annotations_of(node).get(n.HEARTBEAT) != rewound:
                self._write(lambda: self.kube.merge_patch(NODE, None, name, {
                    "metadata": {"annotations": {n.HEARTBEAT: rewound}}}))
            return
        if not n.has_taint(node, n.DRAIN_TAINT):
            self._taint(node, {"key": n.DRAIN_TAINT, "effect": "NoSchedule"}, "False", "HarvesterNodeIsDraining")
        elif not n.has_taint(node, n.OUT_OF_SERVICE) and self._waited("drained", name,
                                                                      float(policy.get("vmMigrationTimeout") or 0)):
            self._taint(node, {"key": n.OUT_OF_SERVICE, "effect": "NoExecute"}, "True", "HarvesterNodeIsDrained")

    def _taint(self, node: dict, taint: dict, drained: str, reason: str) -> None:
        name = o.string(node, "metadata", "name")
        taints = [*o.objects(node, "spec", "taints"), taint]
        self._write(lambda: self.kube.merge_patch(NODE, None, name, {"spec": {"taints": taints}}))
        stamp = now_stamp()
        cond = {"type": n.HARVESTER_DRAINED, "status": drained, "reason": reason, "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp, "message": "Node is draining due to kubelet/node not ready."}
        current = self.kube.get(NODE, None, name)
        if current is not None:
            conditions = [c for c in kv.conditions_of(current) if c.get("type") != n.HARVESTER_DRAINED] + [cond]
            self._write(lambda: self.kube.request("PUT", NODE.path(None, name, "status"),
                                                  body={**current, "status": {**current["status"],
                                                                              "conditions": conditions}}))

    # -- KubeVirt (the simulator only) ------------------------------------------------------------------
    def _kubevirt(self, nodes: Mapping[str, dict], vmis: list[dict], kubevirt: Mapping | None) -> None:
        vmims = list(self.kube.list(VMIM))
        live_pods = {kv.labels_of(p).get("kubevirt.io/created-by") for p in
                     self.kube.list(POD, None, label_selector="kubevirt.io=virt-launcher")
                     if o.string(p, "status", "phase") not in ("Succeeded", "Failed")}
        for vmi in vmis:  # vmi.go: a Running VMI whose pod is gone fails; node.go: unresponsive node, no live pod
            node = nodes.get(o.string(vmi, "status", "nodeName"))
            beat = kv.parse_time(kv.annotations_of(node).get(n.HEARTBEAT)) if node else None
            stale = beat is not None and (datetime.now(UTC) - beat).total_seconds() > HEARTBEAT_TIMEOUT
            if kv.phase(vmi) == "Running" and o.string(vmi, "metadata", "uid") not in live_pods and \
                    (node is None or not n.down(node) or stale):
                reason = {"reason": "NodeUnresponsive"} if stale else {}
                self._write(lambda v=vmi, r=reason: self.kube.merge_patch(
                    VMI, o.string(v, "metadata", "namespace"), o.string(v, "metadata", "name"),
                    {"status": {"phase": "Failed", **r}}))
        unfinished = {(o.string(m, "metadata", "namespace"), o.string(m, "spec", "vmiName")) for m in vmims
                      if kv.phase(m) not in kv.FINAL_PHASES}
        for name, node in nodes.items():
            self._evacuate(name, node, [v for v in vmis if o.string(v, "status", "nodeName") == name], unfinished,
                           kubevirt)
        for vmim in vmims:
            if kv.annotations_of(vmim).get(EVACUATION) and kv.phase(vmim) not in kv.FINAL_PHASES:
                self._migrate(vmim, nodes)

    def _evacuate(self, name: str, node: dict, on_node: list[dict], unfinished: set, kubevirt: Mapping | None) -> None:
        """evacuation.go sync: the drain taint (every VMI on the node) or the VMIs marked for eviction."""
        key = o.string(kubevirt, "spec", "configuration", "migrations", "nodeDrainTaintKey") or n.DRAIN_TAINT
        tainted = n.has_taint(node, key, "NoSchedule")
        wanted = [v for v in on_node if tainted or o.string(v, "status", "evacuationNodeName") == name]
        free = int(o.integer(kubevirt, "spec", "configuration", "migrations", "parallelOutboundMigrationsPerNode")
                   or 2) - sum(1 for v in on_node if (o.string(v, "metadata", "namespace"),
                                                      o.string(v, "metadata", "name")) in unfinished)
        for vmi in wanted:
            where = (o.string(vmi, "metadata", "namespace"), o.string(vmi, "metadata", "name"))
            if kv.phase(vmi) in kv.FINAL_PHASES or kv.meta(vmi).get("deletionTimestamp") or where in unfinished \
                    or not migrates_on_eviction(vmi, kubevirt) and eviction_strategy(vmi, kubevirt) != "LiveMigrate":
                continue
            if not _migratable(vmi):
                if self._waited("not-migrateable", f"{where}", 60.0) or (("not-migrateable", f"{where}") not in
                                                                         self._recorded):
                    self._recorded.add(("not-migrateable", f"{where}"))
                    self._forget("not-migrateable", f"{where}")
                    self._record(vmi, "Normal", "FailedCreate", "VirtualMachineInstance is not migrateable",
                                 "evacuation-controller")
                continue
            if free <= 0:
                return
            body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
                    "metadata": {"generateName": "kubevirt-evacuation-", "annotations": {EVACUATION: name}},
                    "spec": {"vmiName": where[1]}}
            made = self._write(lambda b=body, w=where: self.kube.create(VMIM, w[0], b))
            if made is not None:
                free -= 1
                unfinished.add(where)
                self._record(vmi, "Normal", "SuccessfulCreate",
                             f"Created Migration {o.string(made, 'metadata', 'name')}", "evacuation-controller")

    def _migrate(self, vmim: dict, nodes: Mapping[str, dict]) -> None:
        """The migration controller's and the nodes' part, played to its end in two steps."""
        namespace, name = o.string(vmim, "metadata", "namespace"), o.string(vmim, "spec", "vmiName")
        vmi = self.kube.get(VMI, namespace, name)
        if vmi is None or kv.phase(vmi) != "Running":
            self._status(vmim, {"phase": "Failed"})
            return
        source = o.string(vmi, "status", "nodeName")
        targets = [k for k, v in sorted(nodes.items()) if k != source and not n.down(v) and not n.cordoned(v)
                   and not n.has_taint(v, n.DRAIN_TAINT)]
        if not kv.phase(vmim):
            self._status(vmim, {"phase": "Scheduling"})
            return
        if not targets:
            return  # the target pod stays Pending (KubeVirt deletes it after 5 minutes)
        plan = self.plans.pop((namespace, name), Plan())
        uid = o.string(vmim, "metadata", "uid")
        end, start = datetime.now(UTC), datetime.now(UTC) - timedelta(seconds=30)
        state = {"migrationUid": uid, "sourceNode": source, "targetNode": targets[0], "mode": "PreCopy",
                 "startTimestamp": now_stamp(start), "endTimestamp": now_stamp(end), "completed": True,
                 **({"failed": True, "failureReason": plan.fail, "abortStatus": "Succeeded"} if plan.fail else {})}
        if plan.fail:
            self._write(lambda: self.kube.merge_patch(VMI, namespace, name, {"status": {"migrationState": state}}))
            self._record(vmim, "Warning", "FailedMigration", "source node reported migration failed",
                         "virtualmachine-controller")
            self._record(vmi, "Warning", "Migrated", f"VirtualMachineInstance migration uid {uid} failed. "
                                                     f"reason:{plan.fail}", "virt-handler")
        else:
            self._write(lambda: self.kube.merge_patch(VMI, namespace, name, {
                "metadata": {"labels": {"kubevirt.io/nodeName": targets[0]}},
                "status": {"nodeName": targets[0], "migrationState": state, "evacuationNodeName": None}}))
            self._record(vmi, "Normal", "Migrated", f"The VirtualMachineInstance migrated to node {targets[0]}.",
                         "virt-handler")
        self._status(vmim, {"phase": "Failed" if plan.fail else "Succeeded", "migrationState": state})

    def _status(self, vmim: dict, status: dict) -> None:
        self._write(lambda: self.kube.request(
            "PATCH", VMIM.path(o.string(vmim, "metadata", "namespace"), o.string(vmim, "metadata", "name"), "status"),
            content_type="application/merge-patch+json", body={"status": status}))

    def _list(self, kind: Kind, namespace: str | None) -> list[dict]:
        try:
            return list(self.kube.list(kind, namespace))
        except NotFound:
            return []

    def _record(self, obj: Mapping, kind: str, reason: str, message: str, component: str) -> None:
        meta = kv.meta(obj)
        stamp = now_stamp()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:12]}",
                             "namespace": meta.get("namespace") or "default"},
                "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                                   "name": meta.get("name"), "namespace": meta.get("namespace"),
                                   "uid": meta.get("uid")},
                "reason": reason, "message": message, "type": kind, "source": {"component": component},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        self._write(lambda: self.kube.create(EVENT, meta.get("namespace") or "default", body))

    @staticmethod
    def _json(text: str | None) -> dict:
        try:
            value = json.loads(text or "")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


__all__ = ["EvacuationSim", "Plan", "admit_eviction", "live_migratable", "migrates_on_eviction"]

"""Stands in for kube-scheduler placing virt-launcher pods: it decides which node a pod is bound to (pods/binding),
or the FitError message that keeps it Pending and Unschedulable (FailedScheduling), from the pods' cpu, memory and
device requests, the Nodes' allocatable, cordons, taints, node selectors, unbound PVCs and a migration target's
pod anti-affinity.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from simcluster.kubevirt.objects import (
    CREATED_BY_LABEL,
    FINAL_POD_PHASES,
    MIGRATION_JOB_LABEL,
    NODE_NAME_LABEL,
    VMIS,
    as_pod,
    condition_is,
    condition_of,
    drop_condition,
    meta_of,
    rfc3339,
    set_condition,
    status_of,
    with_phase,
)
from simcluster.kubevirt.vmi_controller import device_requests


def pod_holds_devices(pod: Mapping) -> bool:
    """A bound pod holds its devices until it is Succeeded/Failed or gone (kubelet releases them)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and status_of(pod).get("phase") not in FINAL_POD_PHASES


def pod_device_requests(pod: Mapping) -> Counter:
    used: Counter = Counter()
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, qty in ((container.get("resources") or {}).get("requests") or {}).items():
            if "/" in name:  # extended resources (device plugins) only
                used[name] += int(str(qty))
    return used


def schedule(wanted: Mapping[str, int], nodes: Mapping[str, Mapping[str, int]],
             pods: Iterable[Mapping]) -> tuple[str | None, str | None]:
    """(node, None) for the first node with room for every device, else (None, scheduler message).

    The message is kube-scheduler's FitError, as in the seed issue (`0/1 nodes are available: 1 Insufficient
    intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION.`), then DefaultPreemption's part, as v1.33 writes it.
    """
    used: dict[str, Counter] = {name: Counter() for name in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in used and pod_holds_devices(pod):
            used[node] += pod_device_requests(pod)
    reasons: Counter = Counter()
    for node in sorted(nodes):
        short = [res for res, n in wanted.items() if int(nodes[node].get(res, 0)) - used[node][res] < n]
        if not short:
            return node, None
        for res in short:
            reasons[f"Insufficient {res}"] += 1
    return None, fit_error(len(nodes), reasons, Counter({NO_VICTIMS: len(nodes)}))


# kube-scheduler's DefaultPreemption, the PostFilter that runs after every FitError (v1.33.13
# pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go PostFilter, "preemption: " + the message of
# a second FitError over the candidates; pkg/scheduler/framework/preemption/preemption.go Preempt): a node whose
# filters failed Unschedulable (room: cpu, memory, a device; pod anti-affinity) is tried for victims, and with no pod
# of lower priority on it (launcher pods have none) it reads NO_VICTIMS; a node that failed
# UnschedulableAndUnresolvable (a cordon, a taint, node affinity/selector; every node when a PreFilter failed, as
# VolumeBinding's unbound PVC) is left out, and reads NOT_HELPFUL. Measured on the real node: docs/facts.md §9.
NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
_UNRESOLVABLE = ("node(s) were unschedulable", "node(s) had untolerated taint", "node(s) didn't match Pod's node")


def fit_error(nodes: int, reasons: Counter | str, preemption: Counter) -> str:
    """kube-scheduler's FitError message (v1.33.13 pkg/scheduler/framework/types.go FitError.Error): "0/N nodes are
    available: " and either a PreFilter's message (a str) or the filters' reasons counted per node, sorted as
    strings; then DefaultPreemption's " preemption: …" (a FitError of its own, over `preemption`'s reasons)."""
    def counted(c: Counter) -> str:
        return ", ".join(sorted(f"{count} {reason}" for reason, count in c.items()))

    detail = reasons if isinstance(reasons, str) else counted(reasons)
    return f"0/{nodes} nodes are available: {detail}. preemption: 0/{nodes} nodes are available: {counted(preemption)}."


def _preemption(misfit: list[str]) -> str:
    """What DefaultPreemption says of a node the filters refused for `misfit` (the first failing filter's reasons)."""
    return NOT_HELPFUL if any(r.startswith(_UNRESOLVABLE) for r in misfit) else NO_VICTIMS


_SUFFIX = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30,
           "Ti": 2.0**40}


def quantity(text: Any) -> float:
    """A Kubernetes quantity ('500m', '2Gi', '4') as a number (0 when unreadable)."""
    match = re.match(r"^([0-9.]+)([a-zA-Z]*)$", str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        return 0.0
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def pod_requests(pod: Mapping) -> dict[str, float]:
    """What a pod asks the scheduler for: cpu, memory and extended resources, summed over its containers."""
    total: dict[str, float] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, qty in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, 0.0) + quantity(qty)
    return total


def _tolerated(taint: Mapping, tolerations: list) -> bool:
    for t in tolerations:
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            if not t.get("effect") or t.get("effect") == taint.get("effect"):
                return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", "") and \
                (not t.get("effect") or t.get("effect") == taint.get("effect")):
            return True
    return False


def node_misfit(node: Mapping, wanted: Mapping[str, float], used: Mapping[str, float],
                vmi_spec: Mapping) -> list[str]:
    """Why a Node object cannot take the launcher pod, in kube-scheduler's words (v1.33 plugins in their default
    order, the first that fails per node: NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit)."""
    spec, labels = node.get("spec") or {}, meta_of(node).get("labels") or {}
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not _tolerated(taint, list(vmi_spec.get("tolerations") or [])):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if any(labels.get(k) != v for k, v in (vmi_spec.get("nodeSelector") or {}).items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = status_of(node).get("allocatable") or {}
    return [f"Insufficient {res}" for res, need in sorted(wanted.items())
            if need > 0 and quantity(allocatable.get(res, 0)) - used.get(res, 0.0) < need]


def schedule_on_nodes(wanted: Mapping[str, float], nodes: list[Mapping], pods: Iterable[Mapping],
                      vmi_spec: Mapping, anti_affinity: Iterable[str | None] = ()) -> tuple[str | None, str | None]:
    """kube-scheduler over the cluster's Node objects: (node, None), or (None, its FitError message).
    `vmi_spec`: whatever carries nodeSelector and tolerations (the VMI's spec, or the launcher pod's).
    `anti_affinity`: nodes a required pod anti-affinity keeps the pod off (InterPodAffinity, the last filter)."""
    avoid = set(anti_affinity)
    used: dict[str, dict[str, float]] = {meta_of(n)["name"]: {} for n in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in used and pod_holds_devices(pod):
            for res, qty in pod_requests(pod).items():
                used[node][res] = used[node].get(res, 0.0) + qty
    reasons: Counter = Counter()
    preemption: Counter = Counter()
    for node in sorted(nodes, key=lambda n: meta_of(n)["name"]):
        misfit = node_misfit(node, wanted, used[meta_of(node)["name"]], vmi_spec)
        if not misfit and meta_of(node)["name"] in avoid:
            misfit = ["node(s) didn't match pod anti-affinity rules"]
        if not misfit:
            return meta_of(node)["name"], None
        reasons.update(misfit)
        preemption[_preemption(misfit)] += 1
    return None, fit_error(len(nodes), reasons, preemption)

UNBOUND_PVC = "pod has unbound immediate PersistentVolumeClaims"  # v1.33 volumebinding ErrReasonUnboundImmediatePVC


class Scheduler:
    """kube-scheduler's I/O, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py)."""

    def _schedule_pod(self, pod: dict, vmi: Mapping) -> None:
        """kube-scheduler over the Node objects: bind the pod to the first node that passes its filters (cordon,
        taints, nodeSelector, cpu/memory/device room; `volumes`: every PVC bound), or mark it Unschedulable with
        the scheduler's FitError message and record FailedScheduling (the VMI controller copies the condition to
        the VMI). A migration target pod goes to another node than the VMI's other launcher (its pod
        anti-affinity on `kubevirt.io/created-by`, pkg/virt-controller/services/template.go)."""
        meta, now = meta_of(pod), self.clock()
        nodes = self._kube.nodes()
        taken: set[str] = set()
        if MIGRATION_JOB_LABEL in (meta.get("labels") or {}):
            owner = (meta.get("labels") or {}).get(CREATED_BY_LABEL)
            taken = {(p.get("spec") or {}).get("nodeName") for p in self._kube.pods(meta["namespace"])
                     if meta_of(p).get("labels", {}).get(CREATED_BY_LABEL) == owner and pod_holds_devices(p)}
        if self.volumes and self._unbound_pvc(vmi):
            node, why = None, fit_error(len(nodes), UNBOUND_PVC, Counter({NOT_HELPFUL: len(nodes)}))
        else:
            node, why = schedule_on_nodes(pod_requests(pod), nodes, self._kube.pods(), pod.get("spec") or {},
                                          anti_affinity=taken)
        if node is None:
            current = condition_of(pod, "PodScheduled")
            self._kube.record_series(as_pod(pod), "Warning", "FailedScheduling", str(why), "default-scheduler",
                                     "Scheduling", now)
            if current and current.get("status") == "False" and current.get("message") == why:
                return
            self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                 "lastProbeTime": None, "lastTransitionTime": rfc3339(now)}]}}, status=True)
            return
        self._kube.bind_pod(meta["namespace"], meta["name"], node)

    def _bind(self, vmi: dict, pod: dict) -> bool:
        """kube-scheduler for the launcher pod: bind it, or mark the VMI Unschedulable; then the kubelet starts
        it, unless its image cannot be pulled or (with `volumes`) a volume cannot be attached."""
        now = self.clock()
        meta = meta_of(vmi)
        node = (pod.get("spec") or {}).get("nodeName")
        why = None
        if not node:
            node, why = self._place(vmi, pod)
        if node is None:
            # every try the scheduler makes is a repeat of its Event (series.count rises)
            self._kube.record_series(as_pod(pod), "Warning", "FailedScheduling", str(why), "default-scheduler",
                                     "Scheduling", now)
            unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
            if condition_is(vmi, "PodScheduled", "False", "Unschedulable") and \
                    condition_of(vmi, "PodScheduled").get("message") == why:
                return False
            conditions = set_condition(status_of(vmi).get("conditions"), unschedulable, now)
            self._patch_vmi_status(vmi, {"conditions": conditions})
            pod_condition = dict(unschedulable, lastProbeTime=None, lastTransitionTime=rfc3339(now))
            self._kube.patch_pod(meta["namespace"], meta_of(pod)["name"], {"status": {
                "phase": "Pending", "conditions": [pod_condition]}}, status=True)
            return False
        pod_name = meta_of(pod)["name"]
        if not (pod.get("spec") or {}).get("nodeName"):
            self._kube.bind_pod(meta["namespace"], pod_name, node)
        if self._kubelet_blocked(vmi, pod, node, now):
            return False
        self._kube.patch_pod(meta["namespace"], pod_name, {"status": {
            "phase": "Running", "startTime": rfc3339(now), "hostIP": "10.0.0.1",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": rfc3339(now)}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": "compute", "ready": True, "restartCount": 0, "image": "virt-launcher",
                                   "imageID": "", "state": {"running": {"startedAt": rfc3339(now)}}}],
        }}, status=True)
        status = with_phase(vmi, "Scheduled", now)
        status["nodeName"] = node
        status["conditions"] = drop_condition(status_of(vmi).get("conditions"), "PodScheduled")
        # The VMI has no status subresource: the node label and the status go in one write.
        self._kube.patch(VMIS, meta["namespace"], meta["name"],
                         {"metadata": {"labels": {NODE_NAME_LABEL: node}}, "status": status})
        return True

    def _place(self, vmi: dict, pod: dict) -> tuple[str | None, str | None]:
        """Where the scheduler puts the pod: with `volumes`, nowhere while a PVC is unbound; on the cluster's Node
        objects when there are any, else on the simulator's own nodes (devices only)."""
        spec = vmi.get("spec") or {}
        nodes = self._kube.nodes()
        if self.volumes and self._unbound_pvc(vmi):
            count = len(nodes) or len(self.nodes)
            return None, fit_error(count, UNBOUND_PVC, Counter({NOT_HELPFUL: count}))
        if nodes:
            return schedule_on_nodes(pod_requests(pod), nodes, self._kube.pods(), spec)
        return schedule(device_requests(spec), self.nodes, self._kube.pods())

    def _unbound_pvc(self, vmi: Mapping) -> str | None:
        ns = meta_of(vmi)["namespace"]
        return next((c for c in self._claims(vmi) if status_of(self._kube.pvc(ns, c)).get("phase") != "Bound"), None)

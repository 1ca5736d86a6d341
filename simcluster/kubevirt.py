"""A simulated KubeVirt: the VM controller, a minimal virt-handler and a device-aware scheduler.

It is a client of the simulated API server over HTTP with the real `kubernetes` client and the
admin kubeconfig, as the real virt-controller is a client of the real API server, so the functions
under test see the same objects, phases and Events they would see on a Harvester cluster.

The file reads top to bottom as: facts and pure decisions (`reconcile`, `vm_status`, `schedule`,
object builders; no client, no clock) → the I/O loop (`KubeVirtSim`) that fetches, decides again
on fresh objects and acts. Sources are cited next to each behaviour; docs/facts.md §1–3 is the summary.
"""
from __future__ import annotations

import copy
import json
import logging
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from simcluster import node_migration as nm
from simcluster.instancetypes import Instancetypes, apply_to_vmi

log = logging.getLogger(__name__)

GROUP, API_VERSION = "kubevirt.io", "v1"
KUBEVIRT_API = f"{GROUP}/{API_VERSION}"
VMS, VMIS = "virtualmachines", "virtualmachineinstances"

# staging/src/kubevirt.io/api/core/v1/types.go: the VM controller puts this finalizer on the VM and
# on every VMI it creates (and removes it from a VMI once the VMI is final, vm.go updateStatus);
# the VMI controller puts VirtualMachineInstanceFinalizer on every VMI.
VM_CONTROLLER_FINALIZER = "kubevirt.io/virtualMachineControllerFinalize"
VMI_FINALIZER = "foregroundDeleteVirtualMachine"
# The event source of the VM controller, as `kubectl describe vm` shows it ("From" column).
VM_CONTROLLER_COMPONENT = "virtualmachine-controller"

FINAL_PHASES = ("Succeeded", "Failed")
FINAL_POD_PHASES = ("Succeeded", "Failed")
LAUNCHER_LABELS = {"kubevirt.io": "virt-launcher"}
CREATED_BY_LABEL = "kubevirt.io/created-by"
VM_NAME_LABEL = "vm.kubevirt.io/name"
NODE_NAME_LABEL = "kubevirt.io/nodeName"
MIGRATION_JOB_LABEL = "kubevirt.io/migrationJobUID"  # on a migration's target launcher pod
DEFAULT_NODES: Mapping[str, Mapping[str, int]] = {"harvester-node-0": {}}
# virt-handler's permanent device plugins advertise 1000 of each (cmd/virt-handler/virt-handler.go maxDevices,
# pkg/virt-handler/device-manager/device_controller.go PermanentHostDevicePlugins); launcher pods request them.
# node_only: how long nothing may change before wait_idle calls KubeVirt idle (its workqueues act within ms).
QUIET_PERIOD = 0.3
NODE_RESYNC_PERIOD = 3.0
PERMANENT_DEVICES = {"devices.kubevirt.io/kvm": 1000, "devices.kubevirt.io/tun": 1000,
                     "devices.kubevirt.io/vhost-net": 1000}

# RerunOnFailure stopped restarting a guest that shut itself down in v1.2.0 (PR #10639, FACTS §2
# cites commit 0bb53947); v1.3.0 replaced its bookkeeping with status.runStrategy (PR #11963).
RERUN_DELETES_SUCCEEDED = (1, 2, 0)


# --------------------------------------------------------------------------------------------
# Pure helpers: versions, object fields, time formatting
# --------------------------------------------------------------------------------------------

def parse_version(version: str) -> tuple[int, int, int]:
    """'v1.3.1' / '1.3.1' / '1.4.0-rc.1' -> (1, 3, 1); numeric, so '1.10.0' > '1.9.0'."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not match:
        raise ValueError(f"KubeVirt version {version!r} is not a version; use one like 1.3.1.")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def rfc3339(when: datetime) -> str:
    """KubeVirt's timestamps: RFC 3339, UTC, second precision (metav1.Time)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A KubeVirt timestamp (RFC 3339, UTC, whole seconds) as a datetime; None when absent or unreadable."""
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _meta(obj: Mapping | None) -> Mapping:
    return (obj or {}).get("metadata") or {}


def _status(obj: Mapping | None) -> Mapping:
    return (obj or {}).get("status") or {}


def is_deleting(obj: Mapping | None) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def has_finalizer(obj: Mapping | None, finalizer: str) -> bool:
    return finalizer in (_meta(obj).get("finalizers") or [])


def vmi_phase(vmi: Mapping | None) -> str:
    return _status(vmi).get("phase") or ""


def run_strategy(vm: Mapping) -> str:
    """VirtualMachine.RunStrategy(): spec.runStrategy, else legacy spec.running, else Halted."""
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        return spec["runStrategy"]
    if spec.get("running") is True:
        return "Always"
    return "Halted"


def _condition(obj: Mapping | None, ctype: str) -> Mapping | None:
    for cond in _status(obj).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def _condition_is(obj: Mapping | None, ctype: str, status: str, reason: str | None = None) -> bool:
    cond = _condition(obj, ctype)
    return bool(cond and cond.get("status") == status and (reason is None or cond.get("reason") == reason))


def _first_request(vm: Mapping) -> Mapping | None:
    requests = _status(vm).get("stateChangeRequests") or []
    return requests[0] if requests else None


def has_start_request(vm: Mapping) -> bool:
    first = _first_request(vm)
    return bool(first and first.get("action") == "Start")


def has_stop_request_for(vm: Mapping, vmi: Mapping | None) -> bool:
    first = _first_request(vm)
    return bool(vmi and first and first.get("action") == "Stop"
                and first.get("uid") and first.get("uid") == _meta(vmi).get("uid"))


# --------------------------------------------------------------------------------------------
# Decide (VM controller): what syncRunStrategy does for one VM and its VMI
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Action:
    """One step the VM controller takes; `why` is logged and kept for tests."""

    # start | stop | add_start_request | set_always | add_vm_finalizer | remove_vm_finalizer | remove_vmi_finalizer
    verb: str
    why: str


START, STOP = "start", "stop"
ADD_START_REQUEST, SET_ALWAYS = "add_start_request", "set_always"
ADD_VM_FINALIZER, REMOVE_VM_FINALIZER = "add_vm_finalizer", "remove_vm_finalizer"
REMOVE_VMI_FINALIZER = "remove_vmi_finalizer"


def reconcile(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int] | str) -> list[Action]:
    """The VM controller's decision for one VM, level-based on fresh objects.

    Mirrors pkg/virt-controller/watch/vm.go `sync` + `syncRunStrategy` (v1.1.1: `startStop`;
    ≥v1.5: pkg/virt-controller/watch/vm/vm.go), docs/facts.md §2.
    """
    version = parse_version(version) if isinstance(version, str) else version
    actions = _finalizer_actions(vm, vmi)
    if is_deleting(vm):
        # sync(): a VM being deleted stops its VMI, then drops its own finalizer.
        if vmi is None:
            if has_finalizer(vm, VM_CONTROLLER_FINALIZER):
                actions.insert(0, Action(REMOVE_VM_FINALIZER, "VM is being deleted and its VMI is gone"))
        elif not is_deleting(vmi):
            actions.insert(0, Action(STOP, "VM is being deleted"))
        return actions
    if not has_finalizer(vm, VM_CONTROLLER_FINALIZER):
        actions.insert(0, Action(ADD_VM_FINALIZER, "every VM the controller manages carries its finalizer"))
    strategy = run_strategy(vm)
    decide = _STRATEGIES.get(strategy)
    if decide is None:
        return actions  # "unknown runstrategy": a sync error, nothing is touched
    return decide(vm, vmi, version) + actions


def _finalizer_actions(vm: Mapping, vmi: Mapping | None) -> list[Action]:
    # updateStatus(): "Remove our finalizer off of a finalized VMI now that we've been able to
    # record any status info from the VMI onto the VM object."
    if vmi is not None and vmi_phase(vmi) in FINAL_PHASES and has_finalizer(vmi, VM_CONTROLLER_FINALIZER):
        return [Action(REMOVE_VMI_FINALIZER, "VMI is final and its status is recorded on the VM")]
    return []


def _stop(vmi: Mapping, why: str) -> list[Action]:
    # stopVMI() returns at once for a VMI that is already being deleted.
    return [] if is_deleting(vmi) else [Action(STOP, why)]


def _always(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int]) -> list[Action]:
    if vmi is None:
        return [Action(START, "runStrategy Always and no VMI")]
    if has_stop_request_for(vm, vmi):
        return _stop(vmi, "restart requested (stop request for this VMI)")
    if vmi_phase(vmi) in FINAL_PHASES:
        return _stop(vmi, f"runStrategy Always and the VMI is {vmi_phase(vmi)}; a new one follows")
    return []


def _rerun_on_failure(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int]) -> list[Action]:
    phase = vmi_phase(vmi)
    if version < RERUN_DELETES_SUCCEEDED:
        # ≤v1.1.1 startStop(): only a Failed VMI (or a stop request) is deleted; a Succeeded VMI is
        # left alone, and with no VMI at all the VM is started: deleting a leftover Succeeded VMI
        # therefore boots the guest again.
        if vmi is None:
            return [Action(START, "runStrategy RerunOnFailure and no VMI (≤1.1: starts whenever the VMI is gone)")]
        if has_stop_request_for(vm, vmi) or phase == "Failed":
            return _stop(vmi, f"runStrategy RerunOnFailure and the VMI is {phase or 'stopping'}")
        return []
    # ≥v1.2.0 (PR #10639; FACTS cites commit 0bb53947): the controller deletes a final VMI itself
    # and only a Failed one is rerun: it is rerun through a Start state-change request that the
    # controller adds to the VM status (addStartRequest). With no VMI the VM starts only on a
    # Start request, so neither its own deletion of a Succeeded VMI nor anyone else's restarts it.
    # v1.3.0 (PR #11963) also starts "when coming here from a different RunStrategy":
    # `if !hasStartRequest(vm) && vm.Status.RunStrategy == runStrategy { return }`, where
    # status.runStrategy is first written once a VMI has been created; that is how a new
    # RerunOnFailure VM boots. (v1.2.x did the same first start with a VirtualMachineInitialized
    # condition, removed by #11963; the simulator uses the v1.3 bookkeeping for 1.2.x too.)
    if vmi is not None:
        if is_deleting(vmi):
            return []
        if has_stop_request_for(vm, vmi) or phase in FINAL_PHASES:
            actions = [Action(STOP, f"runStrategy RerunOnFailure and the VMI is {phase or 'to be stopped'}")]
            if phase == "Failed":
                actions.append(Action(ADD_START_REQUEST, "rerun the failed VMI"))
            return actions
        return []
    last_seen = _status(vm).get("runStrategy")
    if has_start_request(vm) or last_seen != "RerunOnFailure":
        return [Action(START, "runStrategy RerunOnFailure: start request, or first start / switched here")]
    return []


def _manual(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int]) -> list[Action]:
    if vmi is not None:
        if has_stop_request_for(vm, vmi):
            return _stop(vmi, "stop request for this VMI (runStrategy Manual)")
        return []
    if has_start_request(vm):
        return [Action(START, "start request (runStrategy Manual)")]
    return []


def _halted(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int]) -> list[Action]:
    if vmi is not None:
        return _stop(vmi, "runStrategy Halted")
    if has_start_request(vm):
        # "Set RunStrategyAlways/running = true if VM has StartRequest (start paused case)."
        return [Action(SET_ALWAYS, "start request on a Halted VM")]
    return []


def _once(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int]) -> list[Action]:
    # `if vmi == nil { startVMI }` and nothing else: a final VMI is left, and deleting it boots again.
    if vmi is None:
        return [Action(START, "runStrategy Once and no VMI")]
    return []


_STRATEGIES: dict[str, Callable[[Mapping, Mapping | None, tuple[int, int, int]], list[Action]]] = {
    "Always": _always,
    "RerunOnFailure": _rerun_on_failure,
    "Manual": _manual,
    "Halted": _halted,
    "Once": _once,
}


# --------------------------------------------------------------------------------------------
# Decide (VM controller): the VM status it writes (vm.go updateStatus / setPrintableStatus)
# --------------------------------------------------------------------------------------------

def vm_status(vm: Mapping, vmi: Mapping | None, version: tuple[int, int, int] | str, now: datetime) -> dict:
    """The VM's status after this sync, computed from the VMI as it was fetched."""
    version = parse_version(version) if isinstance(version, str) else version
    status = copy.deepcopy(dict(_status(vm)))
    created = vmi is not None
    ready = created and _condition_is(vmi, "Ready", "True")
    _set_or_drop(status, "created", True if created else None)  # bool, omitempty
    _set_or_drop(status, "ready", True if ready else None)
    if version >= RERUN_DELETES_SUCCEEDED:
        # "sync for the first time only when the VMI gets created so that we can tell if the VM
        # got started at least once"
        if status.get("runStrategy") or created:
            status["runStrategy"] = run_strategy(vm)
    if _trim_first_request(vm, vmi):
        status["stateChangeRequests"] = list(status.get("stateChangeRequests") or [])[1:]
    if not status.get("stateChangeRequests"):
        status.pop("stateChangeRequests", None)
    status["conditions"] = _vm_conditions(status.get("conditions") or [], vmi, now)
    status["printableStatus"] = printable_status(vm, vmi)
    return status


def _set_or_drop(status: dict, key: str, value: Any) -> None:
    if value is None:
        status.pop(key, None)
    else:
        status[key] = value


def _trim_first_request(vm: Mapping, vmi: Mapping | None) -> bool:
    """isTrimFirstChangeRequestNeeded: only the first request is considered."""
    first = _first_request(vm)
    if not first:
        return False
    if first.get("action") == "Stop":
        return vmi is None or not first.get("uid") or first.get("uid") != _meta(vmi).get("uid")
    if first.get("action") == "Start":
        return bool(vmi is not None and not is_deleting(vmi) and vmi_phase(vmi) not in FINAL_PHASES)
    return False


def _vm_conditions(current: list, vmi: Mapping | None, now: datetime) -> list:
    """Ready from the VMI (or VMINotExists), the VMI's other conditions copied (syncConditions)."""
    if vmi is None:
        wanted = [{"type": "Ready", "status": "False", "reason": "VMINotExists", "message": "VMI does not exist"}]
    else:
        ready = _condition(vmi, "Ready") or {"type": "Ready", "status": "False", "reason": "VMIConditionMissing",
                                            "message": "VMI is missing the Ready condition"}
        wanted = [_cond_fields(ready)] + [_cond_fields(c) for c in _status(vmi).get("conditions") or []
                                          if c.get("type") != "Ready"]
    # Conditions of the VM controller's own (Failure, RestartRequired) are kept as they are.
    own = [c for c in current if c.get("type") in ("Failure", "RestartRequired")]
    old = {c.get("type"): c for c in current}
    result = []
    for cond in wanted:
        prev = old.get(cond["type"])
        same = prev and all(prev.get(k) == cond.get(k) for k in ("status", "reason", "message"))
        # No lastProbeTime: KubeVirt's Go types write null, which the API server drops (the CRD schema does not
        # mark it nullable), so a dict that carried it would never equal what is stored.
        cond = dict(cond, lastTransitionTime=prev.get("lastTransitionTime") if same else rfc3339(now))
        result.append(cond)
    return result + own


def _cond_fields(cond: Mapping) -> dict:
    return {k: cond[k] for k in ("type", "status", "reason", "message") if cond.get(k) is not None}


def printable_status(vm: Mapping, vmi: Mapping | None) -> str:
    """setPrintableStatus: the first matching status wins, in KubeVirt's order."""
    phase = vmi_phase(vmi)
    if is_deleting(vm):
        return "Terminating"
    if vmi is not None and phase not in FINAL_PHASES and is_deleting(vmi):
        return "Stopping"
    if phase == "Running":
        return "Paused" if _condition_is(vmi, "Paused", "True") else "Running"
    if vmi is not None and _condition_is(vmi, "Synchronized", "False", "FailedPvcNotFound"):
        return "ErrorPvcNotFound"
    if vmi is not None and _condition_is(vmi, "PodScheduled", "False", "Unschedulable"):
        return "ErrorUnschedulable"
    for reason in ("ErrImagePull", "ImagePullBackOff"):  # the VMI's Synchronized condition, from the pod's container
        if vmi is not None and _condition_is(vmi, "Synchronized", "False", reason):
            return reason
    if phase in ("", "Pending", "Scheduling", "Scheduled") and vmi is not None:
        return "Starting"
    # A final VMI (the seed: a guest powered off, VMI Succeeded) or none: Stopped.
    return "Stopped"


# --------------------------------------------------------------------------------------------
# Decide (virt-controller VMI side + scheduler): objects and placement
# --------------------------------------------------------------------------------------------

def vmi_from_vm(vm: Mapping) -> dict:
    """setupVMIFromVM: same name and namespace, template metadata and spec, owned by the VM."""
    meta, template = _meta(vm), (vm.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    annotations = dict(tmeta.get("annotations") or {})
    annotations["kubevirt.io/vm-generation"] = str(meta.get("generation") or 1)
    return {
        "apiVersion": KUBEVIRT_API,
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(tmeta.get("labels") or {}),
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": KUBEVIRT_API, "kind": "VirtualMachine", "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
            # "add a finalizer to ensure the VM controller has a chance to see the VMI before it
            # is deleted" (startVMI)
            "finalizers": [VM_CONTROLLER_FINALIZER],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
    }


def device_requests(vmi_spec: Mapping) -> Counter:
    """1 unit of each host device's / GPU's deviceName per entry (FACTS §3)."""
    devices = ((vmi_spec.get("domain") or {}).get("devices") or {})
    wanted: Counter = Counter()
    for dev in list(devices.get("hostDevices") or []) + list(devices.get("gpus") or []):
        if dev.get("deviceName"):
            wanted[dev["deviceName"]] += 1
    return wanted


def launcher_pod(vmi: Mapping, version: str) -> dict:
    """The virt-launcher pod (pkg/virt-controller/services/template.go), cut down to what is observed."""
    meta, spec = _meta(vmi), vmi.get("spec") or {}
    resources = (spec.get("domain") or {}).get("resources") or {}
    requests = {k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}
    limits = {k: v for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")}
    for name, count in device_requests(spec).items():
        requests[name] = limits[name] = str(count)
    labels = dict(meta.get("labels") or {})
    # template.go: podLabels[VirtualMachineNameLabel] = hostName (spec.hostname, else the VMI name).
    labels.update(LAUNCHER_LABELS)
    labels[CREATED_BY_LABEL] = meta["uid"]
    labels[VM_NAME_LABEL] = spec.get("hostname") or meta["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"virt-launcher-{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {"kubevirt.io/domain": meta["name"]},
            "ownerReferences": [{
                "apiVersion": KUBEVIRT_API, "kind": "VirtualMachineInstance", "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "compute",
                "image": f"registry.suse.com/suse/sles/15.5/virt-launcher:{version}",
                "resources": {"requests": requests, "limits": limits},
            }],
        },
    }


def pod_holds_devices(pod: Mapping) -> bool:
    """A bound pod holds its devices until it is Succeeded/Failed or gone (kubelet releases them)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and _status(pod).get("phase") not in FINAL_POD_PHASES


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

    The message is kube-scheduler's FitError, as in the seed issue:
    `0/1 nodes are available: 1 Insufficient intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION.`
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
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}."


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
    spec, labels = node.get("spec") or {}, _meta(node).get("labels") or {}
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                not _tolerated(taint, list(vmi_spec.get("tolerations") or [])):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if any(labels.get(k) != v for k, v in (vmi_spec.get("nodeSelector") or {}).items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = _status(node).get("allocatable") or {}
    return [f"Insufficient {res}" for res, need in sorted(wanted.items())
            if need > 0 and quantity(allocatable.get(res, 0)) - used.get(res, 0.0) < need]


def schedule_on_nodes(wanted: Mapping[str, float], nodes: list[Mapping], pods: Iterable[Mapping],
                      vmi_spec: Mapping, anti_affinity: Iterable[str | None] = ()) -> tuple[str | None, str | None]:
    """kube-scheduler over the cluster's Node objects: (node, None), or (None, its FitError message).
    `vmi_spec`: whatever carries nodeSelector and tolerations (the VMI's spec, or the launcher pod's).
    `anti_affinity`: nodes a required pod anti-affinity keeps the pod off (InterPodAffinity, the last filter)."""
    avoid = set(anti_affinity)
    used: dict[str, dict[str, float]] = {_meta(n)["name"]: {} for n in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in used and pod_holds_devices(pod):
            for res, qty in pod_requests(pod).items():
                used[node][res] = used[node].get(res, 0.0) + qty
    reasons: Counter = Counter()
    for node in sorted(nodes, key=lambda n: _meta(n)["name"]):
        misfit = node_misfit(node, wanted, used[_meta(node)["name"]], vmi_spec)
        if not misfit and _meta(node)["name"] in avoid:
            misfit = ["node(s) didn't match pod anti-affinity rules"]
        if not misfit:
            return _meta(node)["name"], None
        reasons.update(misfit)
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}."


def as_pod(pod: Mapping) -> dict:
    """A pod from a LIST, whose items carry no kind: as an Event's involvedObject names it."""
    return {**pod, "apiVersion": "v1", "kind": "Pod"}


UNBOUND_PVC = "pod has unbound immediate PersistentVolumeClaims"  # v1.33 volumebinding ErrReasonUnboundImmediatePVC


def unpullable(image: str) -> bool:
    """An image the simulated kubelet cannot pull: its registry host is under `.invalid`, a top-level domain that
    never resolves (RFC 2606); the stand-in for an unreachable registry or a wrong image name."""
    host = image.split("/", 1)[0] if "/" in image else ""
    return host.split(":", 1)[0].endswith(".invalid")


def with_phase(vmi: Mapping, phase: str, now: datetime) -> dict:
    """The status patch that moves a VMI to `phase`, recording the transition time."""
    stamps = [dict(s) for s in _status(vmi).get("phaseTransitionTimestamps") or []]
    stamps.append({"phase": phase, "phaseTransitionTimestamp": rfc3339(now)})
    return {"phase": phase, "phaseTransitionTimestamps": stamps}


def set_condition(conditions: list, cond: Mapping, now: datetime) -> list:
    """Replace the condition of that type; keep lastTransitionTime when the status is unchanged."""
    out, prev = [], None
    for c in conditions or []:
        if c.get("type") == cond["type"]:
            prev = c
        else:
            out.append(c)
    keep = prev and prev.get("status") == cond.get("status")
    out.append(dict(cond, lastTransitionTime=prev.get("lastTransitionTime") if keep else rfc3339(now)))
    return out


def drop_condition(conditions: list, ctype: str) -> list:
    return [c for c in conditions or [] if c.get("type") != ctype]


def merge_patch_for(old: Mapping, new: Mapping) -> dict:
    """Top-level JSON merge patch turning `old` into `new` (removed keys become null)."""
    patch = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


# --------------------------------------------------------------------------------------------
# Decide (virt-launcher / virt-handler): IO-error pauses and their resume backoff (FACTS §5)
# --------------------------------------------------------------------------------------------

# virt-launcher: a domain paused with reason IOError gets the VMI condition Paused/PausedIOError, and
# one Warning "IOerror" Event per disk with an error (pkg/virt-launcher/virtwrap/cmd-server notify,
# SendK8sEvent); virt-handler resumes it with a backoff (FACTS §5: 10 s doubling to 3 min).
IO_ERROR_REASON = "IOerror"
PAUSED_IO_ERROR = {"type": "Paused", "status": "True", "reason": "PausedIOError",
                   "message": "VMI was paused, low-level IO error detected"}
IO_RESUME_FIRST, IO_RESUME_MAX = 10.0, 180.0
IO_ERROR_AGAIN_AFTER = 5.0   # a resumed guest that is still trimming hits the error again this soon
VIRT_HANDLER_COMPONENT = "virt-handler"


def io_error_message(volume: str, no_space: bool = False) -> str:
    """KubeVirt's IOerror Event message for a disk error (libvirt DISK_ERROR_UNSPEC / NO_SPACE)."""
    if no_space:
        return f"VM Paused due to not enough space on volume: {volume}"
    return f"VM Paused due to IO error at the volume: {volume}"


def io_resume_backoff(pauses: int) -> float:
    """Seconds a paused guest waits before its n-th resume: 10, 20, 40, ... at most 180."""
    return min(IO_RESUME_FIRST * 2 ** max(pauses - 1, 0), IO_RESUME_MAX)


@dataclass
class IOFault:
    """A volume whose IO fails (a Longhorn replica rebuilding while the guest trims, a full disk)."""

    volume: str
    no_space: bool = False
    stuck: bool = False       # never resumed (harvester#11585): only a stop and start helps
    active: bool = True       # False once the storage works again (the rebuild completed)
    pauses: int = 0
    next_at: float = 0.0      # monotonic time of the next pause or resume
    vmi_uid: str = ""         # the guest it belongs to: a restarted VM's new VMI starts healthy


# --------------------------------------------------------------------------------------------
# I/O: every API call the simulated KubeVirt makes, in one place
# --------------------------------------------------------------------------------------------

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class _Kube:
    """Thin wrapper over the real `kubernetes` client; answers plain dicts and counts writes."""

    def __init__(self, api_client: Any, on_write: Callable[[], None]):
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._on_write = on_write

    # -- KubeVirt objects
    def get(self, plural: str, ns: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, API_VERSION, ns, plural, name)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer, the rest propagates
            if _http_status(exc) == 404:
                return None
            raise

    def list(self, plural: str) -> list[dict]:
        return self.custom.list_cluster_custom_object(GROUP, API_VERSION, plural).get("items") or []

    def get_object(self, group: str, version: str, plural: str, ns: str | None, name: str) -> dict | None:
        """Any other group's object (instancetypes, ControllerRevisions); None when it does not exist."""
        try:
            if ns is None:
                return self.custom.get_cluster_custom_object(group, version, plural, name)
            return self.custom.get_namespaced_custom_object(group, version, ns, plural, name)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer, the rest propagates
            if _http_status(exc) == 404:
                return None
            raise

    def create_object(self, group: str, version: str, plural: str, ns: str, body: dict) -> dict | None:
        self._on_write()
        try:
            return self.custom.create_namespaced_custom_object(group, version, ns, plural, body)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 409:
                return None  # already there (storeRevision then compares and reuses it)
            raise

    def create(self, plural: str, ns: str, body: dict) -> dict | None:
        self._on_write()
        try:
            return self.custom.create_namespaced_custom_object(GROUP, API_VERSION, ns, plural, body)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 409:
                return None  # already there: the next sync sees it
            raise

    def patch(self, plural: str, ns: str, name: str, body: Any, *, status: bool = False) -> dict | None:
        self._on_write()
        ctype = JSON_PATCH if isinstance(body, list) else MERGE_PATCH
        fn = self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        try:
            return fn(GROUP, API_VERSION, ns, plural, name, body, _content_type=ctype)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) in (404, 409, 422):  # gone, or a precondition (test op) failed
                log.debug("patch %s %s/%s not applied: %s", plural, ns, name, exc)
                return None
            raise

    def delete(self, plural: str, ns: str, name: str, uid: str | None = None) -> bool:
        from kubernetes import client

        self._on_write()
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
        try:
            self.custom.delete_namespaced_custom_object(GROUP, API_VERSION, ns, plural, name, body=body)
            return True
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) in (404, 409):  # gone already, or a different object by now
                return False
            raise

    # -- what the scheduler and the kubelet stand-ins read
    def nodes(self) -> list[dict]:
        resp = self.core.list_node(_preload_content=False)
        return json.loads(resp.data).get("items") or []

    def pvc(self, ns: str, name: str) -> dict | None:
        try:
            return json.loads(self.core.read_namespaced_persistent_volume_claim(name, ns, _preload_content=False).data)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 404:
                return None
            raise

    def pv(self, name: str) -> dict | None:
        try:
            return json.loads(self.core.read_persistent_volume(name, _preload_content=False).data)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 404:
                return None
            raise

    def nad(self, ns: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object("k8s.cni.cncf.io", "v1", ns,
                                                            "network-attachment-definitions", name)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 404:
                return None
            raise

    def longhorn_volume(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object("longhorn.io", "v1beta2", "longhorn-system", "volumes",
                                                            name)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) == 404:
                return None
            raise

    # -- launcher pods
    def pods(self, ns: str | None = None, selector: str = "kubevirt.io=virt-launcher") -> list[dict]:
        if ns is None:
            resp = self.core.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
        else:
            resp = self.core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def create_pod(self, ns: str, body: dict) -> None:
        self._on_write()
        self.core.create_namespaced_pod(ns, body)

    def bind_pod(self, ns: str, name: str, node: str) -> None:
        """What the scheduler does: POST the pod's binding subresource (spec.nodeName cannot be patched)."""
        self._on_write()
        answer = self.api_client.call_api(*self.api_client.param_serialize(
            method="POST", resource_path=f"/api/v1/namespaces/{ns}/pods/{name}/binding",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
            auth_settings=["BearerToken"]))
        answer.read()
        if answer.status >= 300:
            raise RuntimeError(f"binding pod {ns}/{name} to {node}: HTTP {answer.status}: {answer.data[:300]!r}")

    def patch_pod(self, ns: str, name: str, body: dict, *, status: bool = False) -> None:
        self._on_write()
        fn = self.core.patch_namespaced_pod_status if status else self.core.patch_namespaced_pod
        try:
            fn(name, ns, body, _content_type=MERGE_PATCH)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) != 404:
                raise

    def delete_pod(self, ns: str, name: str, uid: str | None = None) -> None:
        from kubernetes import client

        self._on_write()
        body = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            self.core.delete_namespaced_pod(name, ns, body=body)
        except Exception as exc:  # noqa: BLE001
            if _http_status(exc) not in (404, 409):
                raise

    # -- Events (best effort, as the real recorder: a failure is logged, never fatal)
    def record(self, obj: Mapping, etype: str, reason: str, message: str, component: str, now: datetime) -> None:
        meta = _meta(obj)
        stamp = rfc3339(now)
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": etype, "reason": reason, "message": message,
            "source": {"component": component},
            "reportingComponent": component, "reportingInstance": f"{component}-sim",
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not record Event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


    def record_counted(self, obj: Mapping, etype: str, reason: str, message: str, component: str,
                       now: datetime) -> None:
        """client-go's EventCorrelator: the same Event again raises `count` on the existing object."""
        import hashlib

        meta = _meta(obj)
        key = "\x00".join((meta.get("uid") or "", reason, message))
        name = f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        stamp = rfc3339(now)
        try:
            existing = self.core.read_namespaced_event(name, meta["namespace"], _preload_content=False)
            current = json.loads(existing.data)
        except Exception as exc:  # noqa: BLE001 - 404: the first time
            if _http_status(exc) != 404:
                log.warning("could not read Event %s: %s", name, exc)
                return
            current = None
        try:
            if current is None:
                self.core.create_namespaced_event(meta["namespace"], {
                    "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": meta["namespace"]},
                    "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                                       "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
                    "type": etype, "reason": reason, "message": message, "source": {"component": component},
                    "reportingComponent": component, "reportingInstance": f"{component}-sim",
                    "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})
            else:
                self.core.patch_namespaced_event(name, meta["namespace"], {
                    "count": int(current.get("count") or 1) + 1, "lastTimestamp": stamp})
        except Exception as exc:  # noqa: BLE001 - best effort, as the real recorder
            log.warning("could not record Event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _owner_name(obj: Mapping, kind: str) -> str | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return ref.get("name")
    return None


Key = tuple[str, str]  # (namespace, name) of a VM and of its VMI (same name)


# --------------------------------------------------------------------------------------------
# The simulator: watches, a work queue, one worker that reconciles, guest actions
# --------------------------------------------------------------------------------------------

class KubeVirtSim:
    """virt-controller's VM controller + a minimal virt-handler/scheduler against the sim API server.

    `node_only` (the default where KubeVirt's own virt-controller runs, i.e. `cluster.runs_virt_controller`):
    it is then only the **node stand-in**, what a Harvester node does and nothing virt-controller decides —
    kube-scheduler binding launcher pods (pods/binding) by their device requests, kubelet running them and
    removing them once deleted, and virt-handler moving a Scheduled VMI to Running, shutting a deleted one
    down, and reporting the guest's power-off, crash and IO-error pauses (`_sync_node`).

    One worker thread does every write (controller, handler and guest actions), so the simulated
    components never race each other; watch threads and a periodic resync only enqueue keys.
    No lock is ever held across an API call.
    """

    def __init__(self, cluster: Any, version: str | None = None,
                 nodes: Mapping[str, Mapping[str, int]] | None = None,
                 step_delay: float = 0.05, resync_period: float = 0.5, io_time_scale: float = 1.0,
                 volumes: bool = False, node_only: bool | None = None):
        self.cluster = cluster
        self.node_only = bool(getattr(cluster, "runs_virt_controller", False)) if node_only is None else node_only
        self.version_string = str(version or cluster.kubevirt_version).lstrip("v")
        self.version = parse_version(self.version_string)
        self.nodes = {name: dict(devs) for name, devs in (nodes or DEFAULT_NODES).items()}
        if self.node_only:  # real launcher pods request virt-handler's permanent device plugins' devices too
            self.nodes = {name: {**PERMANENT_DEVICES, **devs} for name, devs in self.nodes.items()}
        self.step_delay = step_delay
        # node_only: the watches carry virt-controller's changes; the resync only repairs a missed watch event,
        # and a pass over every VMI must fit in it on a loaded machine.
        self.resync_period = max(resync_period, NODE_RESYNC_PERIOD) if self.node_only else resync_period
        # IO-error pauses and resumes run on KubeVirt's backoff times this factor (tests: 0.01).
        self.io_time_scale = io_time_scale
        # A missing PVC or NetworkAttachmentDefinition always keeps the launcher pod from being created, as in
        # KubeVirt (ErrorPvcNotFound; FailedCreate). `volumes` adds the scheduler's and the kubelet's reading of
        # the PVCs: an unbound one keeps the pod unscheduled, a faulted Longhorn volume fails the attach.
        self.volumes = volumes
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self._io: dict[Key, IOFault] = {}
        self._plans: dict[Key, nm.Plan] = {}      # node_only: how the next migration of a VMI goes
        self._runs: dict[str, nm.Run] = {}        # node_only: migrations under way, by migration uid
        self._aborted_at: dict[str, float] = {}   # node_only: when virt-launcher aborted a migration (monotonic)

        self._cond = threading.Condition()
        self._due: dict[Key, float] = {}          # key -> monotonic time it may run
        self._calls: list[tuple[Callable[[], Any], Future]] = []
        self._busy = False
        self._changes = 0                          # writes + failures; wait_idle compares it
        self._last_step: dict[Key, float] = {}
        self._stop = threading.Event()
        self._resync_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_responses: set[Any] = set()
        self._api_clients: list[Any] = []
        self._kube = self._new_kube()     # the worker's
        self._lister = self._new_kube()   # resync and wait_idle (listing only)
        self._instancetypes = Instancetypes(self._kube, self.version)

    # -- lifecycle
    def start(self) -> KubeVirtSim:
        if self._threads:
            return self
        self._stop.clear()
        if self.node_only:
            self.register_nodes()
        self._spawn("kubevirt-sim-worker", self._work)
        self._spawn("kubevirt-sim-resync", self._resync_loop)
        for kind in ("vm", "vmi", "pod"):
            # Clients are made here, one after the other: SimCluster.api_client() writes a
            # kubeconfig file, which is not safe to do from several threads at once.
            self._spawn(f"kubevirt-sim-watch-{kind}", self._watch_loop, kind, self._new_kube())
        return self

    def stop(self) -> None:
        self._stop.set()
        self._resync_now.set()
        with self._cond:
            self._cond.notify_all()
            responses = list(self._watch_responses)
        for resp in responses:
            _interrupt(resp)
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        for api_client in self._api_clients:
            try:
                api_client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._api_clients = []

    def __enter__(self) -> KubeVirtSim:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Return once a full pass over every VM/VMI made no change and nothing is scheduled.

        Each round enqueues every key itself (it does not trust a watch event to have arrived),
        waits for the queue to drain, and stops when the round wrote nothing.
        """
        if not self._threads:
            raise RuntimeError("KubeVirtSim is not running; call start() before wait_idle().")
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            with self._cond:
                before = self._changes
            try:
                self._enqueue_all()
            except Exception as exc:  # noqa: BLE001 - an injected fault: try again
                log.debug("wait_idle: listing failed: %s", exc)
                with self._cond:
                    self._changes += 1
            self._wait_drained(deadline)
            with self._cond:
                quiet = self._changes == before
            if quiet and not self.node_only:
                return
            if quiet:
                # virt-controller acts on its own: idle once nothing it or we own changed for a quiet period.
                now_seen = self._fingerprint()
                if now_seen == seen:
                    return
                seen = now_seen
                time.sleep(QUIET_PERIOD)
            if time.monotonic() > deadline:
                raise TimeoutError(f"KubeVirtSim still reconciling after {timeout}s")
            time.sleep(0.005)

    def _fingerprint(self) -> frozenset:
        """Every VM, VMI and launcher pod by uid and resourceVersion: equal twice means nothing moved."""
        objects = self._lister.list(VMS) + self._lister.list(VMIS) + self._lister.pods()
        return frozenset((_meta(o).get("uid"), _meta(o).get("resourceVersion")) for o in objects)

    # -- guest actions (what virt-handler reports when the guest does something)
    def guest_power_off(self, namespace: str, vmi_name: str) -> None:
        """The guest ran `poweroff`: VMI Succeeded, launcher pod Succeeded (Completed), devices freed."""
        self._call(lambda: self._guest_exit(namespace, vmi_name, "Succeeded"))

    def guest_crash(self, namespace: str, vmi_name: str) -> None:
        """The guest crashed (or qemu died): VMI Failed, launcher pod Failed."""
        self._call(lambda: self._guest_exit(namespace, vmi_name, "Failed"))

    def set_phase_time(self, namespace: str, vmi_name: str, phase: str, when: datetime) -> None:
        """Rewrite (or add) the phaseTransitionTimestamp of `phase`, e.g. to age a Succeeded VMI."""
        self._call(lambda: self._rewrite_phase_time(namespace, vmi_name, phase, when))

    def start_io_errors(self, namespace: str, vmi_name: str, volume: str, *, no_space: bool = False,
                        stuck: bool = False) -> None:
        """From now on the guest's IO to `volume` (a VMI volume name) fails: it pauses (PausedIOError,
        an IOerror Event), is resumed after a backoff, pauses again ... until `stop_io_errors`.
        `stuck`: it is never resumed (harvester#11585). Timers run at `io_time_scale`."""
        self._call(lambda: self._io_begin(namespace, vmi_name, IOFault(volume, no_space=no_space, stuck=stuck)))

    def stop_io_errors(self, namespace: str, vmi_name: str) -> None:
        """The storage works again (the rebuild completed): the next resume is the last one."""
        def stop() -> None:
            fault = self._io.get((namespace, vmi_name))
            if fault is not None:
                fault.active = False
        self._call(stop)

    def io_pauses(self, namespace: str, vmi_name: str) -> int:
        """How many times the guest paused on the current IO fault (0 when none is active)."""
        fault = self._io.get((namespace, vmi_name))
        return fault.pauses if fault else 0

    def plan_migration(self, namespace: str, vmi_name: str, outcome: str = nm.COMPLETE, took: int = 1) -> None:
        """node_only: how the next live migration of this VMI goes on its nodes (simcluster/node_migration.py):
        it completes after `took` seconds, or virt-launcher aborts it on its completion budget or its progress
        timeout, with the numbers KubeVirt's migration controller handed to the VMI. Time is compressed."""
        self._plans[(namespace, vmi_name)] = nm.Plan(outcome, took)

    # ------------------------------------------------------------------------------ internals
    def _new_kube(self) -> _Kube:
        api_client = self.cluster.api_client()
        self._api_clients.append(api_client)
        return _Kube(api_client, self._count_write)

    def _count_write(self) -> None:
        with self._cond:
            self._changes += 1

    def _spawn(self, name: str, target: Callable, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _enqueue(self, key: Key, delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._cond:
            if key not in self._due or self._due[key] > due:
                self._due[key] = due
            self._cond.notify_all()

    def _enqueue_all(self) -> None:
        keys: set[Key] = set()
        for plural in (VMS, VMIS):
            for obj in self._lister.list(plural):
                keys.add((_meta(obj)["namespace"], _meta(obj)["name"]))
        for pod in self._lister.pods():
            owner = _owner_name(pod, "VirtualMachineInstance")
            if owner:
                keys.add((_meta(pod)["namespace"], owner))
        for key in keys:
            self._enqueue(key)

    def _wait_drained(self, deadline: float) -> None:
        with self._cond:
            while self._due or self._calls or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    pending = sorted(f"{ns}/{name}" for ns, name in self._due)
                    raise TimeoutError(f"KubeVirtSim still has work pending: {pending}")
                self._cond.wait(timeout=min(left, 0.05))

    def _call(self, fn: Callable[[], Any]) -> Any:
        if not self._threads:
            return fn()
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify_all()
        return fut.result(timeout=30)

    # -- the worker
    def _work(self) -> None:
        while not self._stop.is_set():
            job = self._next_job()
            if job is None:
                continue
            kind, item = job
            try:
                if kind == "call":
                    fn, fut = item
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(exc)
                elif kind == "io":
                    self._io_step(item)
                else:
                    self._sync(item)
            except Exception as exc:  # noqa: BLE001 - API fault: retry shortly, as a workqueue would
                log.debug("sync %s failed, retrying: %s", item, exc)
                with self._cond:
                    self._changes += 1
                if kind == "io":
                    if item in self._io:
                        self._io[item].next_at = time.monotonic() + 0.05
                else:
                    self._enqueue(item, delay=max(self.step_delay, 0.02))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_job(self) -> tuple[str, Any] | None:
        with self._cond:
            while not self._stop.is_set():
                if self._calls:
                    self._busy = True
                    return "call", self._calls.pop(0)
                now = time.monotonic()
                ready = [k for k, due in self._due.items() if due <= now]
                if ready:
                    key = min(ready, key=lambda k: self._due[k])
                    del self._due[key]
                    self._busy = True
                    return "key", key
                # IO-fault timers are not in _due: wait_idle must not wait for a flapping guest.
                io_ready = [k for k, f in self._io.items() if f.next_at <= now]
                if io_ready:
                    self._io[io_ready[0]].next_at = float("inf")  # until the step sets the next one
                    self._busy = True
                    return "io", io_ready[0]
                dues = list(self._due.values()) + [f.next_at for f in self._io.values()]
                wait = min(dues) - now if dues else 0.2
                self._cond.wait(timeout=max(0.001, min(wait, 0.2)))
            return None

    def _sync(self, key: Key) -> None:
        """One pass for a name: the VM controller, then virt-handler, on freshly fetched objects."""
        ns, name = key
        with self._cond:
            before = self._changes
        vm = None if self.node_only else self._kube.get(VMS, ns, name)
        vmi = self._kube.get(VMIS, ns, name)
        fault = self._io.get(key)
        if fault is not None and (vmi is None or is_deleting(vmi) or _meta(vmi).get("uid") != fault.vmi_uid):
            self._io.pop(key, None)  # the guest is gone (stopped, restarted): so is its fault
        if self.node_only:
            step = self._sync_node(key, vmi)
        elif vm is not None and self._sync_vm(vm, vmi):
            vmi = self._kube.get(VMIS, ns, name)  # created or deleted: virt-handler sees the new state
            step = self._sync_vmi(key, vmi)
        else:
            step = self._sync_vmi(key, vmi)
        for _ in range(4):  # with no step delay, walk the next phases now rather than a pass each
            if step != 0.0 or self.step_delay > 0 or self.node_only:
                break
            step = self._sync_vmi(key, self._kube.get(VMIS, ns, name))
        with self._cond:
            wrote = self._changes != before
        if step is not None:
            self._enqueue(key, delay=step)
        elif wrote:
            self._enqueue(key)

    # -- VM controller
    def _sync_vm(self, vm: dict, vmi: dict | None) -> bool:
        """execute(): sync, then updateStatus. Answers whether the VMI was touched."""
        ns, name = _meta(vm)["namespace"], _meta(vm)["name"]
        if vmi is not None and _owner_name(vmi, "VirtualMachine") != name:
            vmi = None  # a standalone VMI of that name is not this VM's (ClaimVirtualMachineInstanceByName)
        if not is_deleting(vm):  # StoreControllerRevisions, before the run strategy (simcluster/instancetypes.py)
            vm = self._instancetypes.store(vm) or vm
        actions = reconcile(vm, vmi, self.version)
        vm_now = vm
        for action in actions:
            if action.verb != REMOVE_VMI_FINALIZER:
                log.debug("%s/%s: %s (%s)", ns, name, action.verb, action.why)
                vm_now = self._act(vm_now, vmi, action) or vm_now
        # updateStatus() runs with the VMI as it was fetched, then frees a final VMI of our finalizer.
        new_status = vm_status(vm_now, vmi, self.version, self.clock())
        patch = merge_patch_for(_status(vm_now), new_status)
        if patch:
            self._kube.patch(VMS, ns, name, {"status": patch}, status=True)
        if any(a.verb == REMOVE_VMI_FINALIZER for a in actions) and vmi is not None:
            self._remove_finalizer(VMIS, vmi, VM_CONTROLLER_FINALIZER)
        return any(a.verb in (START, STOP, REMOVE_VMI_FINALIZER) for a in actions)

    def _act(self, vm: dict, vmi: dict | None, action: Action) -> dict | None:
        """Carry out one action; answers the VM as written when the action wrote the VM."""
        ns, name = _meta(vm)["namespace"], _meta(vm)["name"]
        now = self.clock()
        if action.verb == START:
            try:
                created = self._kube.create(VMIS, ns, apply_to_vmi(vmi_from_vm(vm), self._instancetypes.spec(vm)))
            except Exception as exc:
                self._kube.record(vm, "Warning", "FailedCreate",
                                  f"Error creating virtual machine instance: {exc}", VM_CONTROLLER_COMPONENT, now)
                raise
            if created is not None:
                self._kube.record(vm, "Normal", "SuccessfulCreate",
                                  f"Started the virtual machine by creating the new virtual machine instance {name}",
                                  VM_CONTROLLER_COMPONENT, now)
        elif action.verb == STOP and vmi is not None:
            uid = _meta(vmi).get("uid")
            try:
                deleted = self._kube.delete(VMIS, ns, name, uid=uid)
            except Exception as exc:
                self._kube.record(vm, "Warning", "FailedDelete",
                                  f"Error deleting virtual machine instance {name}: {exc}", VM_CONTROLLER_COMPONENT,
                                  now)
                raise
            if deleted:
                self._kube.record(vm, "Normal", "SuccessfulDelete",
                                  f"Stopped the virtual machine by deleting the virtual machine instance {uid}",
                                  VM_CONTROLLER_COMPONENT, now)
        elif action.verb == ADD_START_REQUEST:
            requests = list(_status(vm).get("stateChangeRequests") or []) + [{"action": "Start"}]
            return self._kube.patch(VMS, ns, name, {"status": {"stateChangeRequests": requests}}, status=True)
        elif action.verb == SET_ALWAYS:
            spec = vm.get("spec") or {}
            body = {"spec": {"runStrategy": "Always"}} if "runStrategy" in spec else {"spec": {"running": True}}
            return self._kube.patch(VMS, ns, name, body)
        elif action.verb == ADD_VM_FINALIZER:
            finalizers = list(_meta(vm).get("finalizers") or []) + [VM_CONTROLLER_FINALIZER]
            return self._kube.patch(VMS, ns, name, _finalizer_patch(vm, finalizers))
        elif action.verb == REMOVE_VM_FINALIZER:
            return self._remove_finalizer(VMS, vm, VM_CONTROLLER_FINALIZER)
        return None

    def _remove_finalizer(self, plural: str, obj: Mapping, finalizer: str) -> dict | None:
        meta = _meta(obj)
        remaining = [f for f in meta.get("finalizers") or [] if f != finalizer]
        return self._kube.patch(plural, meta["namespace"], meta["name"], _finalizer_patch(obj, remaining))

    # -- the node stand-in (node_only: KubeVirt's virt-controller does the rest)
    def register_nodes(self) -> None:
        """The Node objects, as each node's kubelet registers it (virt-controller's migration controller
        looks the VMI's node up): allocatable devices, Ready, and virt-handler's schedulable label (every launcher
        pod's nodeSelector names it, pkg/virt-controller/services/template.go). kube-apiserver's
        TaintNodesByCondition puts `node.kubernetes.io/not-ready` on a new Node; the node lifecycle controller
        (not run here) lifts it from a Ready one: the stand-in does."""
        for name, devices in self.nodes.items():
            now = rfc3339(self.clock())
            resources = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "500Gi", "pods": "250",
                         **{k: str(v) for k, v in devices.items()}}
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                          "kubevirt.io/schedulable": "true"}},
                    "status": {"capacity": resources, "allocatable": resources, "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                         "lastTransitionTime": now}]}}
            try:
                self._kube.core.create_node(body)
            except Exception as exc:  # noqa: BLE001
                if _http_status(exc) != 409:  # registered by an earlier world: its devices may differ
                    raise
            self._kube.core.patch_node_status(name, {"status": body["status"]})
            self._kube.core.patch_node(name, {"metadata": {"labels": body["metadata"]["labels"]},
                                              "spec": {"taints": None, "unschedulable": None}})

    def _sync_node(self, key: Key, vmi: dict | None) -> float | None:
        """One step of scheduler, kubelet and virt-handler for the VMI of `key` and its launcher pods. Nothing
        runs on a node whose Node object is not Ready: its kubelet and virt-handler are down."""
        ns, name = key
        phase = vmi_phase(vmi) if vmi is not None else ""
        if vmi is not None and is_deleting(vmi) and phase in ("Scheduled", "Running") and not self._node_down(vmi):
            # virt-handler shuts the guest of a deleted VMI down gracefully (the VMI controller deletes the pod).
            now = self.clock()
            self._patch_vmi_status(vmi, with_phase(vmi, "Succeeded", now))
            return 0.0
        uid = _meta(vmi).get("uid") if vmi is not None else None
        down = self._nodes_down()
        for pod in self._kube.pods(ns):
            if _owner_name(pod, "VirtualMachineInstance") != name:
                continue
            pod_meta, pod_phase = _meta(pod), _status(pod).get("phase")
            if (pod.get("spec") or {}).get("nodeName") in down:
                continue  # its kubelet does not report
            if is_deleting(pod):
                # kubelet: the containers are stopped and the pod object removed.
                self._kube.delete_pod(ns, pod_meta["name"], pod_meta.get("uid"))
            elif pod_phase in FINAL_POD_PHASES:
                continue
            elif vmi is None or pod_meta.get("labels", {}).get(CREATED_BY_LABEL) != uid:
                continue  # the garbage collector deletes the pods of a VMI that is gone
            elif phase in FINAL_PHASES:
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")  # launcher exits
            elif self._failed_target(vmi, pod):
                self._finish_pod(pod, "Succeeded")  # the target launcher of an aborted migration exits
            elif not (pod.get("spec") or {}).get("nodeName"):
                self._schedule_pod(pod, vmi)
            elif pod_phase == "Pending":
                self._run_pod(pod, vmi)
        if vmi is None or is_deleting(vmi) or self._node_down(vmi):
            return None
        if phase == "Running":
            wait = self._step_wait(key)
            if wait > 0 and _migrating(vmi):
                return wait
            if self._migration_step(key, vmi):
                self._last_step[key] = time.monotonic()
                return self.step_delay
            if self._failed_target_pending(vmi):
                return max(self.step_delay, 0.5)
        if phase == "Scheduled":
            wait = self._step_wait(key)
            if wait > 0:
                return wait
            # virt-handler: the domain started (the VMI controller derives Ready from the pod's). It reports the
            # launcher's SELinux context, "none" on a node without SELinux; the migration controller needs it
            # for the target pod (migration.go setTargetPodSELinuxLevel).
            self._patch_vmi_status(vmi, {**with_phase(vmi, "Running", self.clock()), "selinuxContext": "none"})
            self._last_step[key] = time.monotonic()
        return None

    def _nodes_down(self) -> set[str]:
        return {_meta(n)["name"] for n in self._kube.nodes() if not _condition_is(n, "Ready", "True")}

    def _failed_target(self, vmi: Mapping, pod: Mapping) -> bool:
        """The target pod of this VMI's migration, which virt-launcher aborted a moment ago: once KubeVirt has
        seen the failure (a second later), the target virt-handler tears the target domain down."""
        state = _status(vmi).get("migrationState") or {}
        job = (_meta(pod).get("labels") or {}).get(MIGRATION_JOB_LABEL)
        if not state.get("failed") or job != state.get("migrationUid"):
            return False
        return time.monotonic() - self._aborted_at.get(str(job), 0.0) >= 1.0

    def _failed_target_pending(self, vmi: Mapping) -> bool:
        state = _status(vmi).get("migrationState") or {}
        if not state.get("failed"):
            return False
        return any(_status(p).get("phase") not in FINAL_POD_PHASES and not is_deleting(p)
                   for p in self._kube.pods(_meta(vmi)["namespace"], f"{MIGRATION_JOB_LABEL}={state['migrationUid']}"))

    def _migration_step(self, key: Key, vmi: dict) -> bool:
        """virt-handler's part of a live migration the migration controller handed to the VMI (its
        migrationState names the target node): the target prepares (targetNodeAddress), the source starts
        (startTimestamp), then it completes: the VMI runs on the target node, the source launcher exits; or,
        as planned (`plan_migration`), virt-launcher aborts it (simcluster/node_migration.py)."""
        if not _migrating(vmi):
            return False
        meta, state = _meta(vmi), dict(_status(vmi)["migrationState"])
        now = self.clock()
        patch: dict = {}
        uid = str(state["migrationUid"])
        if not state.get("targetNodeAddress"):
            state.update(targetNodeAddress="10.0.0.2", targetNodeDomainDetected=True)
        elif not state.get("startTimestamp"):
            run = nm.run_for(self._plans.pop(key, nm.Plan()), vmi, state, self.version)
            self._runs[uid] = run
            state.update(startTimestamp=rfc3339(now - timedelta(seconds=run.seconds)), mode="PreCopy")
        else:
            run = self._runs.get(uid) or nm.Run(uid, 0)
            start = parse_time(state["startTimestamp"]) or now
            if run.failure is not None:
                state = nm.failed_state(state, run, start, self.version)
                self._aborted_at[uid] = time.monotonic()
                self._kube.record(vmi, "Warning", "Migrated", nm.MIGRATED_FAILED.format(uid, run.failure),
                                  VIRT_HANDLER_COMPONENT, now)
                self._kube.patch(VMIS, meta["namespace"], meta["name"], {"status": {"migrationState": state}})
                return True
            end = rfc3339(min(now, start + timedelta(seconds=run.seconds)))
            state.update(completed=True, endTimestamp=end, targetNodeDomainReadyTimestamp=end)
            patch = {"metadata": {"labels": {NODE_NAME_LABEL: state["targetNode"]}}}
            self._kube.record(vmi, "Normal", "Migrated", f"The VirtualMachineInstance migrated to node "
                              f"{state['targetNode']}.", VIRT_HANDLER_COMPONENT, now)
            for pod in self._kube.pods(meta["namespace"], f"{CREATED_BY_LABEL}={meta['uid']}"):
                if (pod.get("spec") or {}).get("nodeName") != state["targetNode"]:
                    self._finish_pod(pod, "Succeeded")  # the source launcher exits once the guest left
        status = {"migrationState": state}
        if state.get("completed"):
            status["nodeName"] = state["targetNode"]
        self._kube.patch(VMIS, meta["namespace"], meta["name"], {**patch, "status": status})
        return True

    def _schedule_pod(self, pod: dict, vmi: Mapping) -> None:
        """kube-scheduler over the Node objects: bind the pod to the first node that passes its filters (cordon,
        taints, nodeSelector, cpu/memory/device room; `volumes`: every PVC bound), or mark it Unschedulable with
        the scheduler's FitError message and record FailedScheduling (the VMI controller copies the condition to
        the VMI). A migration target pod goes to another node than the VMI's other launcher (its pod
        anti-affinity on `kubevirt.io/created-by`, pkg/virt-controller/services/template.go)."""
        meta, now = _meta(pod), self.clock()
        nodes = self._kube.nodes()
        taken: set[str] = set()
        if MIGRATION_JOB_LABEL in (meta.get("labels") or {}):
            owner = (meta.get("labels") or {}).get(CREATED_BY_LABEL)
            taken = {(p.get("spec") or {}).get("nodeName") for p in self._kube.pods(meta["namespace"])
                     if _meta(p).get("labels", {}).get(CREATED_BY_LABEL) == owner and pod_holds_devices(p)}
        if self.volumes and self._unbound_pvc(vmi):
            node, why = None, f"0/{len(nodes)} nodes are available: {UNBOUND_PVC}."
        else:
            node, why = schedule_on_nodes(pod_requests(pod), nodes, self._kube.pods(), pod.get("spec") or {},
                                          anti_affinity=taken)
        if node is None:
            current = _condition(pod, "PodScheduled")
            self._kube.record_counted(as_pod(pod), "Warning", "FailedScheduling", str(why), "default-scheduler", now)
            if current and current.get("status") == "False" and current.get("message") == why:
                return
            self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                 "lastProbeTime": None, "lastTransitionTime": rfc3339(now)}]}}, status=True)
            return
        self._kube.bind_pod(meta["namespace"], meta["name"], node)

    def _run_pod(self, pod: dict, vmi: Mapping) -> None:
        """kubelet: every container of a bound launcher pod runs and is ready; the pod is Running. Unless an image
        cannot be pulled (the container waits ErrImagePull; the VMI controller copies the reason to the VMI's
        Synchronized condition, pkg/virt-controller/watch/vmi.go checkForContainerImageError) or, with `volumes`,
        a faulted Longhorn volume fails the attach (the attach/detach controller's FailedAttachVolume)."""
        meta, now = _meta(pod), rfc3339(self.clock())
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or []
        every = list(spec.get("initContainers") or []) + list(containers)
        bad = next((c for c in every if unpullable(str(c.get("image") or ""))), None)
        faulted = self._faulted_volume(vmi) if self.volumes and bad is None else None
        if bad is not None or faulted is not None:
            if (pod.get("status") or {}).get("containerStatuses"):
                return  # already reported: the kubelet's back-off retries change nothing here
            if bad is not None:
                image = bad["image"]
                message = (f'Failed to pull image "{image}": failed to resolve reference "{image}": dial tcp: lookup '
                           f'{image.split("/", 1)[0]}: no such host')
                waiting = {"reason": "ErrImagePull", "message": message}
                self._kube.record_counted(as_pod(pod), "Warning", "Failed", message, "kubelet", self.clock())
            else:
                message = (f'AttachVolume.Attach failed for volume "{faulted}" : rpc error: code = Aborted desc = '
                           f'volume {faulted} is not ready for workloads')
                waiting = {"reason": "ContainerCreating"}
                self._kube.record_counted(as_pod(pod), "Warning", "FailedAttachVolume", message,
                                          "attachdetach-controller", self.clock())
            def statuses(group: list) -> list[dict]:
                return [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                         "imageID": "", "state": {"waiting": waiting if bad is None or unpullable(
                             str(c.get("image") or "")) else {"reason": "PodInitializing"}}} for c in group]
            self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {
                "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                                    "lastTransitionTime": now}],
                "initContainerStatuses": statuses(list(spec.get("initContainers") or [])),
                "containerStatuses": statuses(list(containers))}}, status=True)
            return
        self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {
            "phase": "Running", "startTime": now, "hostIP": "10.0.0.1", "podIP": "10.52.0.10",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                                   "imageID": "", "state": {"running": {"startedAt": now}}} for c in containers],
        }}, status=True)

    # -- virt-handler + VMI controller + scheduler
    def _sync_vmi(self, key: Key, vmi: dict | None) -> float | None:
        """One step for the VMI of `key`; answers a delay when the next phase step is due later."""
        ns, name = key
        if vmi is None:
            # Launcher pods of a VMI that is gone (the API server may have no garbage collector).
            for pod in self._kube.pods(ns):
                if _owner_name(pod, "VirtualMachineInstance") == name:
                    self._kube.delete_pod(ns, _meta(pod)["name"], _meta(pod).get("uid"))
            return None
        uid = _meta(vmi)["uid"]
        pods = [p for p in self._kube.pods(ns, f"{CREATED_BY_LABEL}={uid}") if not is_deleting(p)]
        phase = vmi_phase(vmi)
        if is_deleting(vmi):
            return self._tear_down(vmi, pods)
        if phase in FINAL_PHASES:
            for pod in pods:  # the launcher exits with the guest
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")
            return None
        if phase == "Pending" and not pods and any(_condition_is(vmi, "Synchronized", "False", r)
                                                   for r in ("FailedPvcNotFound", "FailedCreate")):
            return self._admit(vmi, pods)  # waiting for its PVC or NetworkAttachmentDefinition (KubeVirt retries)
        if phase in ("Pending", "Scheduling", "Scheduled", "Running") and not pods:
            # The launcher pod vanished under a live VMI: the VMI fails (virt-handler / VMI controller).
            self._patch_vmi_status(vmi, with_phase(vmi, "Failed", self.clock()))
            return None
        wait = self._step_wait(key)
        if phase == "":
            return self._admit(vmi, pods)
        if wait > 0:
            return wait
        if phase == "Pending":
            self._patch_vmi_status(vmi, with_phase(vmi, "Scheduling", self.clock()))
        elif phase == "Scheduling":
            if not self._bind(vmi, pods[0]):
                return None  # stays unschedulable; every resync tries again
        elif phase == "Scheduled":
            now = self.clock()
            conditions = set_condition(drop_condition(_status(vmi).get("conditions"), "PodScheduled"),
                                       {"type": "Ready", "status": "True"}, now)
            self._patch_vmi_status(vmi, dict(with_phase(vmi, "Running", now), conditions=conditions))
        else:
            return None
        self._last_step[key] = time.monotonic()
        return self.step_delay if phase != "Scheduled" else None

    def _step_wait(self, key: Key) -> float:
        return max(0.0, self._last_step.get(key, 0.0) + self.step_delay - time.monotonic())

    def _admit(self, vmi: dict, pods: list[dict]) -> float:
        """A new VMI: the VMI controller adds its finalizer, creates the launcher pod, phase Pending."""
        meta = _meta(vmi)
        if not has_finalizer(vmi, VMI_FINALIZER):
            self._kube.patch(VMIS, meta["namespace"], meta["name"],
                             _finalizer_patch(vmi, list(meta.get("finalizers") or []) + [VMI_FINALIZER]))
        missing = self._missing_pvc(vmi)
        nad = self._missing_nad(vmi) if missing is None else None
        if nad is not None:
            # The launcher pod cannot be rendered without the Multus network's NetworkAttachmentDefinition
            # (v1.3.0 pkg/virt-controller/network/render.go; v1.8.3 pkg/network/multus/nad.go, lower-case from
            # v1.4.0): Synchronized=False FailedCreate, no Event, retried with the workqueue's backoff.
            word = "Failed" if self.version < (1, 4, 0) else "failed"
            why = f"failed to render launch manifest: {word} to locate network attachment definition {nad}"
            if not _condition_is(vmi, "Synchronized", "False", "FailedCreate"):
                status = with_phase(vmi, "Pending", self.clock()) if vmi_phase(vmi) != "Pending" else {}
                status["conditions"] = set_condition(_status(vmi).get("conditions"), {
                    "type": "Synchronized", "status": "False", "reason": "FailedCreate", "message": why},
                    self.clock())
                self._patch_vmi_status(vmi, status)
            return self.step_delay * 10
        if missing is not None:
            # datavolumes.go: "PVC ns/name does not exist, waiting for it to appear" (Synchronized=False)
            why = f"PVC {meta['namespace']}/{missing} does not exist, waiting for it to appear"
            if not _condition_is(vmi, "Synchronized", "False", "FailedPvcNotFound"):
                status = with_phase(vmi, "Pending", self.clock()) if vmi_phase(vmi) != "Pending" else {}
                status["conditions"] = set_condition(_status(vmi).get("conditions"), {
                    "type": "Synchronized", "status": "False", "reason": "FailedPvcNotFound", "message": why},
                    self.clock())
                self._patch_vmi_status(vmi, status)
                self._kube.record(vmi, "Normal", "FailedPvcNotFound", why, "virtualmachine-controller", self.clock())
            return self.step_delay * 10
        if any(_condition_is(vmi, "Synchronized", "False", r) for r in ("FailedPvcNotFound", "FailedCreate")):
            self._patch_vmi_status(vmi, {"conditions": drop_condition(_status(vmi).get("conditions"),
                                                                      "Synchronized")})
        if not pods:
            body = launcher_pod(vmi, self.version_string)
            body["status"] = {"phase": "Pending"}
            self._kube.create_pod(meta["namespace"], body)
        self._patch_vmi_status(vmi, with_phase(vmi, "Pending", self.clock()))
        self._last_step[(meta["namespace"], meta["name"])] = time.monotonic()
        return self.step_delay

    def _bind(self, vmi: dict, pod: dict) -> bool:
        """kube-scheduler for the launcher pod: bind it, or mark the VMI Unschedulable; then the kubelet starts
        it, unless its image cannot be pulled or (with `volumes`) a volume cannot be attached."""
        now = self.clock()
        meta = _meta(vmi)
        node = (pod.get("spec") or {}).get("nodeName")
        why = None
        if not node:
            node, why = self._place(vmi, pod)
        if node is None:
            unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
            if _condition_is(vmi, "PodScheduled", "False", "Unschedulable") and \
                    _condition(vmi, "PodScheduled").get("message") == why:
                return False
            conditions = set_condition(_status(vmi).get("conditions"), unschedulable, now)
            self._patch_vmi_status(vmi, {"conditions": conditions})
            pod_condition = dict(unschedulable, lastProbeTime=None, lastTransitionTime=rfc3339(now))
            self._kube.patch_pod(meta["namespace"], _meta(pod)["name"], {"status": {
                "phase": "Pending", "conditions": [pod_condition]}}, status=True)
            self._kube.record_counted(as_pod(pod), "Warning", "FailedScheduling", str(why), "default-scheduler", now)
            return False
        pod_name = _meta(pod)["name"]
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
        status["conditions"] = drop_condition(_status(vmi).get("conditions"), "PodScheduled")
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
            return None, f"0/{len(nodes) or len(self.nodes)} nodes are available: {UNBOUND_PVC}."
        if nodes:
            return schedule_on_nodes(pod_requests(pod), nodes, self._kube.pods(), spec)
        return schedule(device_requests(spec), self.nodes, self._kube.pods())

    def _claims(self, vmi: Mapping) -> list[str]:
        return [c for v in ((vmi.get("spec") or {}).get("volumes") or [])
                if (c := (v.get("persistentVolumeClaim") or {}).get("claimName")
                    or (v.get("dataVolume") or {}).get("name"))]

    def _missing_pvc(self, vmi: Mapping) -> str | None:
        ns = _meta(vmi)["namespace"]
        return next((c for c in self._claims(vmi) if self._kube.pvc(ns, c) is None), None)

    def _missing_nad(self, vmi: Mapping) -> str | None:
        """The first Multus network whose NetworkAttachmentDefinition does not exist, as "namespace/name" (a name
        without a namespace is the VMI's)."""
        ns = _meta(vmi)["namespace"]
        for network in (vmi.get("spec") or {}).get("networks") or []:
            name = (network.get("multus") or {}).get("networkName")
            if name:
                nad_ns, _, nad = str(name).rpartition("/")
                if self._kube.nad(nad_ns or ns, nad) is None:
                    return f"{nad_ns or ns}/{nad}"
        return None

    def _unbound_pvc(self, vmi: Mapping) -> str | None:
        ns = _meta(vmi)["namespace"]
        return next((c for c in self._claims(vmi) if _status(self._kube.pvc(ns, c)).get("phase") != "Bound"), None)

    def _kubelet_blocked(self, vmi: dict, pod: dict, node: str, now: datetime) -> bool:
        """The kubelet stand-in on a bound pod: an image it cannot pull leaves the container waiting ErrImagePull
        (the VMI controller copies it to the VMI's Synchronized condition, lifecycle.go); with `volumes`, a
        faulted Longhorn volume fails the attach (the attach/detach controller's FailedAttachVolume). Either
        keeps the VMI Scheduling; once it clears, the pod starts."""
        ns, pod_name = _meta(vmi)["namespace"], _meta(pod)["name"]
        images = [v["containerDisk"]["image"] for v in ((vmi.get("spec") or {}).get("volumes") or [])
                  if (v.get("containerDisk") or {}).get("image")]
        bad = next((i for i in images if unpullable(i)), None)
        if bad is not None:
            message = (f'Failed to pull image "{bad}": failed to resolve reference "{bad}": dial tcp: lookup '
                       f'{bad.split("/", 1)[0]}: no such host')
            if not _condition_is(vmi, "Synchronized", "False", "ErrImagePull"):
                scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                             "lastTransitionTime": rfc3339(now)}
                self._kube.patch_pod(ns, pod_name, {"status": {"phase": "Pending", "conditions": [scheduled],
                    "containerStatuses": [{"name": "compute", "ready": False, "restartCount": 0, "image": bad,
                                           "imageID": "", "state": {"waiting": {"reason": "ErrImagePull",
                                                                                "message": message}}}]}}, status=True)
                self._patch_vmi_status(vmi, {"nodeName": node, "conditions": set_condition(
                    drop_condition(_status(vmi).get("conditions"), "PodScheduled"),
                    {"type": "Synchronized", "status": "False", "reason": "ErrImagePull", "message": message}, now)})
                self._kube.record_counted(as_pod(pod), "Warning", "Failed", message, "kubelet", now)
            return True
        faulted = self._faulted_volume(vmi) if self.volumes else None
        if faulted is not None:
            message = (f'AttachVolume.Attach failed for volume "{faulted}" : rpc error: code = Aborted desc = volume '
                       f'{faulted} is not ready for workloads')
            if _status(pod).get("phase") != "Pending" or (pod.get("status") or {}).get("containerStatuses") is None:
                scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                             "lastTransitionTime": rfc3339(now)}
                creating = {"name": "compute", "ready": False, "restartCount": 0, "image": "virt-launcher",
                            "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}
                self._kube.patch_pod(ns, pod_name, {"status": {"phase": "Pending", "conditions": [scheduled],
                                                               "containerStatuses": [creating]}}, status=True)
                self._patch_vmi_status(vmi, {"nodeName": node, "conditions": drop_condition(
                    _status(vmi).get("conditions"), "PodScheduled")})
                self._kube.record_counted(as_pod(pod), "Warning", "FailedAttachVolume", message,
                                          "attachdetach-controller", now)
            return True
        if _condition_is(vmi, "Synchronized", "False", "ErrImagePull"):
            self._patch_vmi_status(vmi, {"conditions": drop_condition(_status(vmi).get("conditions"), "Synchronized")})
        return False

    def _faulted_volume(self, vmi: Mapping) -> str | None:
        ns = _meta(vmi)["namespace"]
        for claim in self._claims(vmi):
            name = ((self._kube.pvc(ns, claim) or {}).get("spec") or {}).get("volumeName")
            csi = (((self._kube.pv(name) or {}) if name else {}).get("spec") or {}).get("csi") or {}
            if csi.get("driver") == "driver.longhorn.io" and csi.get("volumeHandle"):
                volume = self._kube.longhorn_volume(csi["volumeHandle"])
                if _status(volume).get("robustness") == "faulted":
                    return str(csi["volumeHandle"])
        return None

    def _node_down(self, vmi: Mapping) -> bool:
        """The VMI's node has a Node object that is not Ready: its virt-handler does nothing (a node the simulator
        does not know as an object is always up)."""
        name = _status(vmi).get("nodeName")
        node = next((n for n in self._kube.nodes() if _meta(n).get("name") == name), None) if name else None
        return node is not None and not _condition_is(node, "Ready", "True")

    def _tear_down(self, vmi: dict, pods: list[dict]) -> float | None:
        """A VMI being deleted: shut the guest down, end and delete the pod, drop the finalizer. Nothing happens
        while its node is not Ready: virt-handler there cannot shut the guest down (the stop is not honoured)."""
        meta, phase = _meta(vmi), vmi_phase(vmi)
        if phase not in FINAL_PHASES and self._node_down(vmi):
            return None
        if phase not in FINAL_PHASES:
            # virt-handler shuts a running guest down gracefully (Succeeded); a VMI that never
            # ran fails (the VMI controller).
            final = "Succeeded" if phase in ("Scheduled", "Running") else "Failed"
            now = self.clock()
            status = with_phase(vmi, final, now)
            status["conditions"] = set_condition(_status(vmi).get("conditions"), {
                "type": "Ready", "status": "False", "reason": "PodTerminating"}, now)
            self._patch_vmi_status(vmi, status)
            return 0.0
        if pods:
            for pod in pods:
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")
                self._kube.delete_pod(meta["namespace"], _meta(pod)["name"], _meta(pod).get("uid"))
            return 0.0
        if has_finalizer(vmi, VMI_FINALIZER):
            self._remove_finalizer(VMIS, vmi, VMI_FINALIZER)
        owner = _owner_name(vmi, "VirtualMachine")
        if has_finalizer(vmi, VM_CONTROLLER_FINALIZER) and \
                (owner is None or self._kube.get(VMS, meta["namespace"], owner) is None):
            # No VM controller will ever see this VMI again (its VM is gone): the simulator frees it
            # rather than leave it stuck, which a real cluster's garbage collector would also end.
            self._remove_finalizer(VMIS, self._kube.get(VMIS, meta["namespace"], meta["name"]) or vmi,
                                   VM_CONTROLLER_FINALIZER)
        self._last_step.pop((meta["namespace"], meta["name"]), None)
        return None

    def _finish_pod(self, pod: dict, phase: str) -> None:
        if _status(pod).get("phase") == phase:
            return
        now = rfc3339(self.clock())
        reason, code = ("Completed", 0) if phase == "Succeeded" else ("Error", 1)
        self._kube.patch_pod(_meta(pod)["namespace"], _meta(pod)["name"], {"status": {
            "phase": phase,
            "conditions": [{"type": t, "status": "False", "reason": "PodCompleted", "lastProbeTime": None,
                            "lastTransitionTime": now} for t in ("Ready", "ContainersReady")],
            "containerStatuses": [{"name": "compute", "ready": False, "restartCount": 0, "image": "virt-launcher",
                                   "imageID": "", "state": {"terminated": {
                                       "exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}}}],
        }}, status=True)

    def _patch_vmi_status(self, vmi: Mapping, status: Mapping) -> None:
        # The VMI CRD has no status subresource: virt-handler writes the VMI itself.
        meta = _meta(vmi)
        self._kube.patch(VMIS, meta["namespace"], meta["name"], {"status": dict(status)})

    # -- guest actions, run on the worker
    def _guest_exit(self, ns: str, name: str, phase: str) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None:
            raise LookupError(f"VMI {ns}/{name} does not exist; a guest can only stop in a VMI that exists.")
        if vmi_phase(vmi) != "Running":
            raise RuntimeError(f"VMI {ns}/{name} is {vmi_phase(vmi) or 'new'}, not Running; "
                               "wait for Running (kv.wait_idle()) before acting as the guest.")
        now = self.clock()
        status = with_phase(vmi, phase, now)
        status["conditions"] = set_condition(_status(vmi).get("conditions"), {
            "type": "Ready", "status": "False", "reason": "PodTerminating"}, now)
        self._patch_vmi_status(vmi, status)
        for pod in self._kube.pods(ns, f"{CREATED_BY_LABEL}={_meta(vmi)['uid']}"):
            self._finish_pod(pod, phase)
        self._enqueue((ns, name))
        self._resync_now.set()  # devices were freed: blocked VMIs may schedule now

    def _rewrite_phase_time(self, ns: str, name: str, phase: str, when: datetime) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None:
            raise LookupError(f"VMI {ns}/{name} does not exist.")
        stamps = [dict(s) for s in _status(vmi).get("phaseTransitionTimestamps") or []]
        hits = [s for s in stamps if s.get("phase") == phase]
        if hits:
            hits[-1]["phaseTransitionTimestamp"] = rfc3339(when)
        else:
            stamps.append({"phase": phase, "phaseTransitionTimestamp": rfc3339(when)})
        self._patch_vmi_status(vmi, {"phaseTransitionTimestamps": stamps})
        self._enqueue((ns, name))

    def _io_begin(self, ns: str, name: str, fault: IOFault) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None or vmi_phase(vmi) != "Running":
            raise RuntimeError(f"VMI {ns}/{name} is {vmi_phase(vmi) or 'missing'}, not Running; "
                               "only a running guest can hit an IO error.")
        fault.next_at = time.monotonic()
        fault.vmi_uid = _meta(vmi)["uid"]
        self._io[(ns, name)] = fault

    def _io_step(self, key: Key) -> None:
        """One pause or one resume of a guest whose volume fails IO (virt-launcher + virt-handler)."""
        fault = self._io.get(key)
        if fault is None:
            return
        ns, name = key
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None or is_deleting(vmi) or vmi_phase(vmi) != "Running" or _meta(vmi).get("uid") != fault.vmi_uid:
            self._io.pop(key, None)  # the guest is gone: so is its fault
            return
        now, scale = self.clock(), self.io_time_scale
        conditions = _status(vmi).get("conditions")
        if _condition_is(vmi, "Paused", "True", "PausedIOError"):
            if fault.stuck:
                return  # stays paused: next_at stays at infinity
            self._patch_vmi_status(vmi, {"conditions": drop_condition(conditions, "Paused")})
            if fault.active:
                fault.next_at = time.monotonic() + IO_ERROR_AGAIN_AFTER * scale
            else:
                self._io.pop(key, None)
        elif fault.active:
            # The Event first, then the condition: virt-launcher sends both, the Event is recorded at once.
            self._kube.record_counted(vmi, "Warning", IO_ERROR_REASON, io_error_message(fault.volume, fault.no_space),
                                      VIRT_HANDLER_COMPONENT, now)
            self._patch_vmi_status(vmi, {"conditions": set_condition(conditions, PAUSED_IO_ERROR, now)})
            fault.pauses += 1
            fault.next_at = time.monotonic() + io_resume_backoff(fault.pauses) * scale
        else:
            self._io.pop(key, None)
        self._enqueue(key)  # the VM controller copies the condition (printableStatus Paused)

    # -- resync and watches (they only enqueue keys)
    def _resync_loop(self) -> None:
        while not self._stop.is_set():
            self._resync_now.wait(timeout=self.resync_period)
            self._resync_now.clear()
            if self._stop.is_set():
                return
            try:
                self._enqueue_all()
            except Exception as exc:  # noqa: BLE001 - the next resync tries again
                log.debug("resync failed: %s", exc)

    def _watch_loop(self, kind: str, kube: _Kube) -> None:
        while not self._stop.is_set():
            try:
                if kind == "pod":
                    resp = kube.core.list_pod_for_all_namespaces(
                        label_selector="kubevirt.io=virt-launcher", watch=True, _preload_content=False)
                else:
                    resp = kube.custom.list_cluster_custom_object(
                        GROUP, API_VERSION, VMS if kind == "vm" else VMIS, watch=True, _preload_content=False)
            except Exception as exc:  # noqa: BLE001 - server down or faulty: retry
                log.debug("watch %s could not start: %s", kind, exc)
                self._stop.wait(0.2)
                continue
            with self._cond:
                self._watch_responses.add(resp)
            try:
                self._consume(kind, resp)
            except Exception as exc:  # noqa: BLE001 - stream broke: re-watch (resync covers the gap)
                log.debug("watch %s ended: %s", kind, exc)
            finally:
                with self._cond:
                    self._watch_responses.discard(resp)
                _interrupt(resp)
            self._stop.wait(0.05)

    def _consume(self, kind: str, resp: Any) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        for line in iter_resp_lines(resp):
            if self._stop.is_set():
                return
            if not line:
                continue
            event = json.loads(line)
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                return
            meta = _meta(obj)
            if kind == "pod":
                owner = _owner_name(obj, "VirtualMachineInstance")
                if owner:
                    self._enqueue((meta.get("namespace", ""), owner))
                if event.get("type") == "DELETED" or _status(obj).get("phase") in FINAL_POD_PHASES:
                    self._resync_now.set()  # devices freed
            elif meta.get("name"):
                self._enqueue((meta.get("namespace", ""), meta["name"]))


def _migrating(vmi: Mapping) -> bool:
    """The migration controller handed a migration to the VMI (target node set) and it has not ended."""
    state = _status(vmi).get("migrationState") or {}
    return bool(state.get("targetNode") and state.get("migrationUid")) and not (state.get("completed")
                                                                                 or state.get("failed"))


def _finalizer_patch(obj: Mapping, finalizers: list[str]) -> list[dict]:
    """JSON patch replacing the finalizers, guarded by a test of the old list (as KubeVirt does)."""
    old = _meta(obj).get("finalizers")
    ops: list[dict] = []
    if old is None:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": finalizers})
    else:
        ops.append({"op": "test", "path": "/metadata/finalizers", "value": old})
        ops.append({"op": "replace", "path": "/metadata/finalizers", "value": finalizers})
    return ops


def _interrupt(resp: Any) -> None:
    """Unblock a thread reading a watch stream (urllib3 ≥ 2.3 has shutdown()), then close it."""
    for name in ("shutdown", "close", "release_conn"):
        try:
            getattr(resp, name, lambda: None)()
        except Exception:  # noqa: BLE001 - best effort
            pass

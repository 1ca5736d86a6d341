"""Stands in for virt-controller's VM controller (pkg/virt-controller/watch/vm.go; ≥v1.5 watch/vm/vm.go): it
decides what a VM's run strategy does with its VMI (`reconcile`), the VMI it creates (`vmi_from_vm`), and the status
it writes on the VM (`vm_status`, `printable_status`).

The decisions are pure (no client, no clock); `VMController` fetches, decides again on fresh objects and acts, as
one part of `KubeVirtSim`. Sources are cited next to each behaviour; docs/facts.md §2 is the summary.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from simcluster.instancetypes import apply_to_vmi
from simcluster.kubevirt.objects import (
    FINAL_PHASES,
    KUBEVIRT_API,
    VM_CONTROLLER_COMPONENT,
    VM_CONTROLLER_FINALIZER,
    VMIS,
    VMS,
    condition_is,
    condition_of,
    finalizer_patch,
    has_finalizer,
    is_deleting,
    merge_patch_for,
    meta_of,
    owner_name,
    parse_version,
    rfc3339,
    run_strategy,
    status_of,
    vmi_phase,
)

log = logging.getLogger(__name__)


# RerunOnFailure stopped restarting a guest that shut itself down in v1.2.0 (PR #10639, FACTS §2
# cites commit 0bb53947); v1.3.0 replaced its bookkeeping with status.runStrategy (PR #11963).
RERUN_DELETES_SUCCEEDED = (1, 2, 0)


def _first_request(vm: Mapping) -> Mapping | None:
    requests = status_of(vm).get("stateChangeRequests") or []
    return requests[0] if requests else None


def has_start_request(vm: Mapping) -> bool:
    first = _first_request(vm)
    return bool(first and first.get("action") == "Start")


def has_stop_request_for(vm: Mapping, vmi: Mapping | None) -> bool:
    first = _first_request(vm)
    return bool(vmi and first and first.get("action") == "Stop"
                and first.get("uid") and first.get("uid") == meta_of(vmi).get("uid"))


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
    last_seen = status_of(vm).get("runStrategy")
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
    status = copy.deepcopy(dict(status_of(vm)))
    created = vmi is not None
    ready = created and condition_is(vmi, "Ready", "True")
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
        return vmi is None or not first.get("uid") or first.get("uid") != meta_of(vmi).get("uid")
    if first.get("action") == "Start":
        return bool(vmi is not None and not is_deleting(vmi) and vmi_phase(vmi) not in FINAL_PHASES)
    return False


def _vm_conditions(current: list, vmi: Mapping | None, now: datetime) -> list:
    """Ready from the VMI (or VMINotExists), the VMI's other conditions copied (syncConditions)."""
    if vmi is None:
        wanted = [{"type": "Ready", "status": "False", "reason": "VMINotExists", "message": "VMI does not exist"}]
    else:
        ready = condition_of(vmi, "Ready") or {"type": "Ready", "status": "False", "reason": "VMIConditionMissing",
                                            "message": "VMI is missing the Ready condition"}
        wanted = [_cond_fields(ready)] + [_cond_fields(c) for c in status_of(vmi).get("conditions") or []
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
        return "Paused" if condition_is(vmi, "Paused", "True") else "Running"
    if vmi is not None and condition_is(vmi, "Synchronized", "False", "FailedPvcNotFound"):
        return "ErrorPvcNotFound"
    if vmi is not None and condition_is(vmi, "PodScheduled", "False", "Unschedulable"):
        return "ErrorUnschedulable"
    for reason in ("ErrImagePull", "ImagePullBackOff"):  # the VMI's Synchronized condition, from the pod's container
        if vmi is not None and condition_is(vmi, "Synchronized", "False", reason):
            return reason
    if phase in ("", "Pending", "Scheduling", "Scheduled") and vmi is not None:
        return "Starting"
    # A final VMI (the seed: a guest powered off, VMI Succeeded) or none: Stopped.
    return "Stopped"


# --------------------------------------------------------------------------------------------
# Decide (VM controller): the VMI it creates (startVMI)
# --------------------------------------------------------------------------------------------

def vmi_from_vm(vm: Mapping) -> dict:
    """setupVMIFromVM: same name and namespace, template metadata and spec, owned by the VM."""
    meta, template = meta_of(vm), (vm.get("spec") or {}).get("template") or {}
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


class VMController:
    """The VM controller's I/O, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py): its client, version and
    clock are the simulator's."""

    def _sync_vm(self, vm: dict, vmi: dict | None) -> bool:
        """execute(): sync, then updateStatus. Answers whether the VMI was touched."""
        ns, name = meta_of(vm)["namespace"], meta_of(vm)["name"]
        if vmi is not None and owner_name(vmi, "VirtualMachine") != name:
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
        patch = merge_patch_for(status_of(vm_now), new_status)
        if patch:
            self._kube.patch(VMS, ns, name, {"status": patch}, status=True)
        if any(a.verb == REMOVE_VMI_FINALIZER for a in actions) and vmi is not None:
            self._remove_finalizer(VMIS, vmi, VM_CONTROLLER_FINALIZER)
        return any(a.verb in (START, STOP, REMOVE_VMI_FINALIZER) for a in actions)

    def _act(self, vm: dict, vmi: dict | None, action: Action) -> dict | None:
        """Carry out one action; answers the VM as written when the action wrote the VM."""
        ns, name = meta_of(vm)["namespace"], meta_of(vm)["name"]
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
            uid = meta_of(vmi).get("uid")
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
            requests = list(status_of(vm).get("stateChangeRequests") or []) + [{"action": "Start"}]
            return self._kube.patch(VMS, ns, name, {"status": {"stateChangeRequests": requests}}, status=True)
        elif action.verb == SET_ALWAYS:
            spec = vm.get("spec") or {}
            body = {"spec": {"runStrategy": "Always"}} if "runStrategy" in spec else {"spec": {"running": True}}
            return self._kube.patch(VMS, ns, name, body)
        elif action.verb == ADD_VM_FINALIZER:
            finalizers = list(meta_of(vm).get("finalizers") or []) + [VM_CONTROLLER_FINALIZER]
            return self._kube.patch(VMS, ns, name, finalizer_patch(vm, finalizers))
        elif action.verb == REMOVE_VM_FINALIZER:
            return self._remove_finalizer(VMS, vm, VM_CONTROLLER_FINALIZER)
        return None

    def _remove_finalizer(self, plural: str, obj: Mapping, finalizer: str) -> dict | None:
        meta = meta_of(obj)
        remaining = [f for f in meta.get("finalizers") or [] if f != finalizer]
        return self._kube.patch(plural, meta["namespace"], meta["name"], finalizer_patch(obj, remaining))

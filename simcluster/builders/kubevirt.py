"""Small builders for KubeVirt test objects, shaped like the seed's objects (docs/facts.md §1–3).

Defaults describe the common case: a VM `vm1` in `default` whose guest powered itself off
(VMI phase Succeeded) at FINISHED.
"""
from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime, timedelta

FINISHED = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
STARTED = FINISHED - timedelta(hours=2)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_vm(name: str = "vm1", namespace: str = "default", *, run_strategy: str | None = "Manual",
            running: bool | None = None, annotations: dict | None = None, uid: str | None = None,
            state_change_requests: list | None = None, host_devices: list | None = None,
            resource_version: str = "100") -> dict:
    spec: dict = {"template": {"metadata": {"labels": {"harvesterhci.io/vmName": name}},
                               "spec": {"domain": {"devices": {}, "memory": {"guest": "1948Mi"},
                                                   "resources": {"requests": {"memory": "1365Mi"}}}}}}
    if run_strategy is not None:
        spec["runStrategy"] = run_strategy
    if running is not None:
        spec["running"] = running
    if host_devices:
        spec["template"]["spec"]["domain"]["devices"]["hostDevices"] = copy.deepcopy(host_devices)
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
          "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                       "resourceVersion": resource_version},
          "spec": spec, "status": {}}
    if annotations is not None:
        vm["metadata"]["annotations"] = dict(annotations)
    if state_change_requests:
        vm["status"]["stateChangeRequests"] = state_change_requests
    return vm


def make_vmi(name: str = "vm1", namespace: str = "default", *, phase: str = "Succeeded",
             finished: datetime | None = FINISHED, owner: dict | None = None, annotations: dict | None = None,
             deleting: bool = False, migration_state: dict | None = None, uid: str | None = None,
             resource_version: str = "200") -> dict:
    """A VMI; `owner` is the VM dict that controls it (None = standalone)."""
    transitions = [{"phase": "Running", "phaseTransitionTimestamp": stamp(STARTED)}]
    if phase in ("Succeeded", "Failed") and finished is not None:
        transitions.append({"phase": phase, "phaseTransitionTimestamp": stamp(finished)})
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                        "resourceVersion": resource_version},
           "spec": {"domain": {"devices": {}}},
           "status": {"phase": phase, "phaseTransitionTimestamps": transitions}}
    if owner is not None:
        vmi["metadata"]["ownerReferences"] = [{
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    if annotations is not None:
        vmi["metadata"]["annotations"] = dict(annotations)
    if deleting:
        vmi["metadata"]["deletionTimestamp"] = stamp(FINISHED)
    if migration_state is not None:
        vmi["status"]["migrationState"] = migration_state
    return vmi


def make_launcher_pod(vmi: dict, *, phase: str = "Succeeded", with_owner: bool = True) -> dict:
    meta = vmi["metadata"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"virt-launcher-{meta['name']}-tl46h", "namespace": meta["namespace"],
                        "uid": str(uuid.uuid4()),
                        "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": meta["uid"],
                                   "vm.kubevirt.io/name": meta["name"]}},
           "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}]},
           "status": {"phase": phase}}
    if with_owner:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                               "name": meta["name"], "uid": meta["uid"], "controller": True}]
    return pod

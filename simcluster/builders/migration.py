"""Small builders for live-migration objects, shaped after upstream/examples/CONSTRUCTED-vmim-failed.yaml
and CONSTRUCTED-vmi-failed-migration-timeout.yaml (constructed from KubeVirt's Go types, not captured), per
KubeVirt version:

- 1.1: migrationState has no failureReason (nor sourcePod); the reason is only in virt-handler's Warning Event
  `Migrated` on the VMI ("VirtualMachineInstance migration uid X failed. reason:..."). The final VMIM keeps a copy
  of the VMI's migrationState, as in every version (the real backend shows it).
- 1.3: failureReason in migrationState, the VMIM keeps a copy once final; default 800 s/GiB.
- 1.8: the same, default 150 s/GiB (from v1.4).
"""
from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime, timedelta

STARTED = datetime(2026, 11, 30, 9, 0, 5, tzinfo=UTC)
NOW = STARTED + timedelta(minutes=20)   # the fixed clock of the decision tests
NOT_COMPLETED = "Live migration is not completed after {} seconds and has been aborted"
STUCK = "Live migration stuck for {} seconds and has been aborted"
ABORTED_19 = "Live migration has been aborted"


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_vmi(name: str = "vm1", namespace: str = "default", *, guest: str | None = "2Gi",
             requests: str | None = None, labels: dict | None = None, method: str = "LiveMigration",
             state: dict | None = None, uid: str | None = None, owner_uid: str | None = None,
             phase: str = "Running", created: datetime | None = None) -> dict:
    domain: dict = {"devices": {}}
    if guest:
        domain["memory"] = {"guest": guest}
    if requests:
        domain["resources"] = {"requests": {"memory": requests}}
    meta: dict = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                  "labels": {"kubevirt.io/nodeName": "node-a", **(labels or {})},
                  "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
                                       "uid": owner_uid or str(uuid.uuid4()), "controller": True,
                                       "blockOwnerDeletion": True}]}
    if created is not None:
        meta["creationTimestamp"] = stamp(created)
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
           "spec": {"domain": domain},
           "status": {"phase": phase, "nodeName": "node-a", "migrationMethod": method}}
    if state is not None:
        vmi["status"]["migrationState"] = copy.deepcopy(state)
    return vmi


def make_state(uid: str, *, took: int, failed: bool = True, reason: str | None = None, version: str = "1.8",
               started: datetime = STARTED, policy: str | None = None, configuration: dict | None = None,
               abort_requested: bool = False, mode: str = "PreCopy") -> dict:
    """VMI status.migrationState at the end of a migration that ran `took` seconds."""
    state = {"migrationUid": uid, "sourceNode": "node-a", "targetNode": "node-b",
             "sourcePod": "virt-launcher-vm1-abcde", "targetPod": "virt-launcher-vm1-fghij",
             "targetNodeAddress": "10.52.1.23", "startTimestamp": stamp(started),
             "endTimestamp": stamp(started + timedelta(seconds=took)), "mode": mode, "completed": True,
             "failed": failed}
    if failed:
        state["abortStatus"] = "Succeeded"
    if abort_requested:
        state["abortRequested"] = True
    if reason is not None and version != "1.1":   # failureReason exists from v1.3.0 only
        state["failureReason"] = reason
    if policy:
        state["migrationPolicyName"] = policy
    if configuration is not None:
        state["migrationConfiguration"] = configuration
    return state


def make_vmim(vmi: str = "vm1", namespace: str = "default", *, phase: str = "Failed", took: int = 451,
              state: dict | None = None, uid: str | None = None, name: str | None = None, version: str = "1.8",
              started: datetime = STARTED, reached_running: bool = True, created: datetime | None = None,
              conditions: list | None = None) -> dict:
    """A VMIM that went Pending → ... → Running for `took` seconds → `phase`. With `version` 1.1 the
    status carries no migrationState copy."""
    uid = uid or str(uuid.uuid4())
    at = started - timedelta(seconds=5)
    phases = [("Pending", at), ("Scheduling", at), ("Scheduled", at + timedelta(seconds=3)),
              ("PreparingTarget", at + timedelta(seconds=3)), ("TargetReady", at + timedelta(seconds=4))]
    if reached_running:
        phases.append(("Running", started))
    phases.append((phase, started + timedelta(seconds=took + 1)))
    meta = {"name": name or f"{vmi}-mig-{uid[:5]}", "namespace": namespace, "uid": uid,
            "labels": {"kubevirt.io/vmi-name": vmi}}
    if created is not None:
        meta["creationTimestamp"] = stamp(created)
    vmim = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration", "metadata": meta,
            "spec": {"vmiName": vmi},
            "status": {"phase": phase, "phaseTransitionTimestamps": [
                {"phase": p, "phaseTransitionTimestamp": stamp(t)} for p, t in phases]}}
    if state is not None and version != "1.1":
        vmim["status"]["migrationState"] = {k: v for k, v in state.items()
                                            if k not in ("sourcePod", "targetNodeAddress", "mode",
                                                         "migrationConfiguration")}
    if conditions:
        vmim["status"]["conditions"] = conditions
    return vmim


def make_kubevirt(version: str = "1.8.3", migrations: dict | None = None) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"migrations": migrations or {}}},
            "status": {"observedKubeVirtVersion": f"v{version}"}}


def make_policy(name: str, *, vmi: dict | None = None, namespace: dict | None = None, selectors: bool = True,
                **fields) -> dict:
    spec: dict = dict(fields)
    if selectors:
        spec["selectors"] = {}
        if vmi is not None:
            spec["selectors"]["virtualMachineInstanceSelector"] = vmi
        if namespace is not None:
            spec["selectors"]["namespaceSelector"] = namespace
    return {"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
            "metadata": {"name": name}, "spec": spec}


def make_namespace(name: str = "default", labels: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def make_event(involved: dict, reason: str, message: str, *, type_: str = "Warning",
               component: str = "virt-controller", when: datetime = STARTED) -> dict:
    meta = involved["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                               "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": type_, "source": {"component": component},
            "firstTimestamp": stamp(when), "lastTimestamp": stamp(when), "count": 1}


def migrated_event(vmi: dict, migration_uid: str, reason: str) -> dict:
    """virt-handler's Event on the VMI when a migration failed (every version)."""
    return make_event(vmi, "Migrated", f"VirtualMachineInstance migration uid {migration_uid} failed. reason:{reason}",
                      component="virt-handler")


# -- playing KubeVirt's part on a SimCluster (the simulated KubeVirt does not model live migration) --
def create_guest(cluster, name: str, *, guest: str = "8Gi", labels: dict | None = None,
                 namespace: str = "default") -> tuple[dict, dict]:
    """A Running VM and its VMI, created directly."""
    vm = cluster.create({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": namespace},
        "spec": {"runStrategy": "Manual", "template": {
            "metadata": {"labels": labels or {}},
            "spec": {"domain": {"devices": {}, "memory": {"guest": guest}}}}}})
    vmi = make_vmi(name, namespace, guest=guest, labels=labels, owner_uid=vm["metadata"]["uid"])
    vmi["metadata"].pop("uid")
    return vm, cluster.create(vmi)


def recorded_configuration(shape: str, **policy) -> dict:
    """migrationState.migrationConfiguration as virt-controller writes it at the hand-off, in every version: the
    cluster's migration configuration (its defaults here), with a matched MigrationPolicy's fields applied
    (pkg/virt-controller/watch/migration/migration.go; as the real backend shows it)."""
    return {"allowAutoConverge": False, "allowPostCopy": False, "bandwidthPerMigration": "0",
            "completionTimeoutPerGiB": 800 if shape in ("1.1", "1.3") else 150,
            "nodeDrainTaintKey": "kubevirt.io/drain", "parallelMigrationsPerCluster": 5,
            "parallelOutboundMigrationsPerNode": 2, "progressTimeout": 150, "unsafeMigrationOverride": False, **policy}


def create_migration(cluster, shape: str, vmi: dict, *, took: int, phase: str = "Failed", reason: str | None = None,
                     kubevirt_events=(), reached_running: bool = True, state: bool = True, policy: str | None = None,
                     policy_fields: dict | None = None) -> dict:
    """What KubeVirt `shape` ("1.1", "1.3", "1.8") leaves behind for a migration of `vmi` that ran `took`
    seconds and ended just now in `phase`: the VMIM created Running, the VMI's migrationState (with the
    configuration virt-controller recorded, `policy` the MigrationPolicy it matched), KubeVirt's own Events
    (callables (vmim, vmi) → Event; virt-handler's `Migrated` and the migration controller's `FailedMigration` for
    a failure), then the VMIM's final status (an update event) with its copy of the migrationState (≥ 1.3)."""
    meta = vmi["metadata"]
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=took + 2)
    final = make_vmim(meta["name"], meta["namespace"], phase=phase, took=took, version=shape, started=started,
                      reached_running=reached_running)
    running = copy.deepcopy(final)
    running["metadata"].pop("uid")
    running["metadata"]["name"] = f"{meta['name']}-mig-{uuid.uuid4().hex[:5]}"
    running["status"] = {"phase": "Running",
                         "phaseTransitionTimestamps": final["status"]["phaseTransitionTimestamps"][:-1]}
    vmim = cluster.create(running)
    uid = vmim["metadata"]["uid"]
    st = make_state(uid, took=took, failed=phase == "Failed", reason=reason, version=shape, started=started,
                    policy=policy, configuration=recorded_configuration(shape, **(policy_fields or {}))) \
        if state else None
    if st is not None:
        cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", meta["namespace"], meta["name"],
                      {"status": {"migrationState": st}})
    for build in kubevirt_events:
        cluster.create(build(vmim, vmi))
    if reason:  # virt-handler records it in every version (v1.1.1 vm.go, v1.8.3 migration-source.go)
        cluster.create(migrated_event(vmi, uid, reason))
    if st is not None and phase == "Failed":
        cluster.create(make_event(vmim, "FailedMigration", "source node reported migration failed",
                                  component="virtualmachine-controller"))
    status = {"phase": phase, "phaseTransitionTimestamps": final["status"]["phaseTransitionTimestamps"]}
    # The final VMIM keeps a copy of the VMI's migrationState, whole (migration.go updateStatus; v1.1.1's CRD has
    # no sourcePod or failureReason). Up to v1.5 it copies whatever the VMI holds: for a migration never handed
    # to the VMI, the previous migration's state (v1.6.0 checks the uid, commit ada65cb7d9).
    held = st if st is not None else ((cluster.get("kubevirt.io/v1", "VirtualMachineInstance", meta["namespace"],
                                                   meta["name"]) or {}).get("status") or {}).get("migrationState")
    if held is not None and (st is not None or shape in ("1.1", "1.3")):
        status["migrationState"] = {k: v for k, v in held.items()
                                    if shape != "1.1" or k not in ("sourcePod", "failureReason")}
    return cluster.patch("kubevirt.io/v1", "VirtualMachineInstanceMigration", meta["namespace"],
                         vmim["metadata"]["name"], {"status": status}, subresource="status")


def unschedulable_events(message: str):
    """KubeVirt's Event on the VMIM and the scheduler's on the target pod, for create_migration."""
    def kubevirt_says(vmim, vmi):
        return make_event(vmim, "migrationTargetPodUnschedulable",
                          f"Migration target pod for VMI [{vmi['metadata']['namespace']}/{vmi['metadata']['name']}] "
                          f"is currently unschedulable.")

    def scheduler_says(vmim, vmi):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"virt-launcher-{vmi['metadata']['name']}-q8z2k",
                            "namespace": vmi["metadata"]["namespace"], "uid": str(uuid.uuid4())}}
        return make_event(pod, "FailedScheduling", message, component="default-scheduler")
    return kubevirt_says, scheduler_says

"""vm-stuck-report on what KubeVirt, the scheduler and the kubelet write, written here as they write it (docs/facts.md
§7, each builder names its upstream file), on both backends: the API server (simulated, or a real kube-apiserver
with no virt-controller, scheduler or kubelet: nothing but the test writes) and the function's own handler, with
the credentials of its own ServiceAccount. The e2e suite (test_e2e.py) lets KubeVirt's virt-controller and the
node's stand-in (or the real node) write the same objects; here each is written exactly, and quickly.

A stuck VM's clock: VM_STUCK_AFTER is 1s and the function's clock runs an hour ahead, so every state is past its
threshold."""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from functions.vm_stuck_report import handler
from functions.vm_stuck_report.settings import load
from shared.kinds import EVENT
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders import stuck as b
from simcluster.kubevirt.node import pull_error
from tests import backends
from tests.rbac import used

pytestmark = pytest.mark.e2e
SA = "vmevents/vm-stuck-report"
FUNCTION = "vm-stuck-report"
AHEAD = timedelta(hours=1)
_names = itertools.count(1)


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    found = backends.cluster(request.param, "1.3.1", virt_controller=False)
    yield found
    found.stop()


def context(cluster, ahead: timedelta = AHEAD, **env) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    return KubeContext(function=FUNCTION, settings=load({"VM_STUCK_AFTER": "1s", **env}),
                       clock=lambda: datetime.now(UTC) + ahead, kube=kube, recorder=Recorder(kube, FUNCTION))


def report(outcome) -> dict:
    """The finding a converge announced (`.detected`)."""
    assert outcome.reply is not None, f"no notice: {outcome.verdict} {outcome.effect}: {outcome.reason}"
    data = outcome.reply.data
    [found] = [f for f in data.get("findings", [data]) if f.get("state") == "detected"]
    return found


def stuck_vm(cluster, status: str, *, vmi_phase: str = "Scheduling", conditions=(), finalizers=(),
             **vm_kw) -> tuple[dict, dict]:
    """A VM whose status KubeVirt wrote as `status`, and its VMI in `vmi_phase` with `conditions`."""
    name = f"written{next(_names)}"
    manifest = b.vm(name, status=None, **vm_kw)
    manifest["metadata"] = {"name": name, "namespace": "default"}
    manifest.pop("status")
    vm = cluster.create(manifest)
    vm = cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name, {"status": {"printableStatus": status}},
                       subresource="status")
    instance = b.vmi(vm, phase=vmi_phase, finalizers=finalizers)
    instance["metadata"] = {k: v for k, v in instance["metadata"].items() if k not in ("uid", "creationTimestamp")}
    if conditions:
        instance["status"]["conditions"] = [dict(c) for c in conditions]
    return vm, cluster.create(instance)


def create_pod(cluster, manifest: dict) -> dict:
    """A pod as the kubelet reports it: created, then its status written (kube-apiserver drops a posted status)."""
    status = manifest.pop("status", None)
    manifest["metadata"].pop("uid", None)
    manifest["metadata"].pop("creationTimestamp", None)
    created = cluster.create(manifest)
    if status:
        created = cluster.patch("v1", "Pod", "default", created["metadata"]["name"], {"status": status},
                                subresource="status")
    return created


def converge(cluster, vm, ctx=None, delivery: str | None = None, *, tick: bool = True):
    found = handler.Target("default", vm["metadata"]["name"])
    return handler.converge(found, ctx or context(cluster), delivery or f"ce-{next(_names)}", tick=tick)


# -- 1. the image a containerDisk VM cannot pull, in KubeVirt's init container ------------------------------------
def test_an_image_pulled_in_the_init_container_is_the_cause_with_kubevirts_condition_and_the_kubelets_events(cluster):
    """KubeVirt pulls a containerDisk's image in the init container `volume<name>-init`; the kubelet leaves it
    waiting ErrImagePull and the containers after it PodInitializing; the VMI controller copies the reason and
    message to the VMI's Synchronized condition; the kubelet records Failed and BackOff on the pod."""
    image = "registry.example.invalid/vms/fedora:41"
    message = pull_error(image)
    vm, vmi = stuck_vm(cluster, "ErrImagePull", image=image, conditions=[
        {"type": "Synchronized", "status": "False", "reason": "ErrImagePull", "message": message}])
    pod = create_pod(cluster, b.launcher(vmi, pull=("ErrImagePull", message)))
    now = datetime.now(UTC)
    cluster.create(b.kubelet_event(pod, "volumecontainerdisk-init", "Failed", f'Failed to pull image "{image}": '
                                   f'{message}', count=3, when=now))
    cluster.create(b.kubelet_event(pod, "volumecontainerdisk-init", "BackOff", f'Back-off pulling image "{image}"',
                                   count=5, kind="Normal", when=now))
    d = report(converge(cluster, vm))["details"]
    assert d["cause"] == "image-pull", (d["cause"], d["checked"])
    evidence = "\n".join(d["evidence"])
    assert "Synchronized=False (ErrImagePull)" in evidence, evidence  # KubeVirt's own status logic
    assert f"init container volumecontainerdisk-init (image {image}) waits: ErrImagePull" in evidence, evidence
    assert f"Failed ×3: Failed to pull image \"{image}\"" in evidence and "BackOff ×5" in evidence, evidence
    assert f"`kubectl -n default edit vm {vm['metadata']['name']}`" in d["nextStep"], d["nextStep"]
    assert image in d["nextStep"] and "containerDisk volume containerdisk" in d["nextStep"], d["nextStep"]


# -- 2. a migration a ResourceQuota on limits has no room for ------------------------------------------------
def test_a_migration_refused_by_a_quota_on_limits_names_the_quota_and_the_command_to_raise_it(cluster):
    """Harvester's and Rancher's namespace quotas are on limits.memory: the admission refuses the target pod with
    "exceeded quota: <name>, requested: …, used: …, limited: …" (k8s.io/apiserver plugin/resourcequota), and the
    migration controller records it on the VMI as FailedCreate "Error creating pod: …" (migration.go)."""
    vm, vmi = stuck_vm(cluster, "Running", vmi_phase="Running", memory="2Gi")
    create_pod(cluster, b.pod(vmi, node="node-a", phase="Running"))
    quota = f"tenant{next(_names)}"
    cluster.create(b.quota(quota, hard={"limits.memory": "16Gi"}))
    migration = b.vmim(vmi, name=f"{vm['metadata']['name']}-mig", phase=None)
    migration["metadata"] = {"name": migration["metadata"]["name"], "namespace": "default"}
    migration = cluster.create(migration)
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default", migration["metadata"]["name"],
                  {"status": {"phase": "Pending"}}, subresource="status")
    cluster.create(b.event(vmi, "FailedCreate", f'Error creating pod: pods "virt-launcher-{vm["metadata"]["name"]}-'
                           f'x" is forbidden: exceeded quota: {quota}, requested: limits.memory=2262Mi, used: '
                           f'limits.memory=15Gi, limited: limits.memory=16Gi', component="virtualmachine-controller",
                           when=datetime.now(UTC)))
    found = handler.Target("default", vm["metadata"]["name"], migration["metadata"]["name"])
    try:
        d = report(handler.converge(found, context(cluster), f"ce-{next(_names)}", tick=True))["details"]
    finally:  # a quota on limits refuses every later pod without limits in the namespace
        cluster.delete("v1", "ResourceQuota", "default", quota)
    assert d["cause"] == "quota-exceeded", (d["cause"], d["checked"])
    assert f"ResourceQuota {quota}: limits.memory used 15Gi of 16Gi, the migration target pod asked 2262Mi" in \
        d["evidence"], d["evidence"]
    assert f"`kubectl -n default edit resourcequota {quota}`" in d["nextStep"], d["nextStep"]


# -- 3. stuck starting, then stopped, and the stop hangs: the group changed ---------------------------------
def notices(outcome) -> list[dict]:
    data = outcome.reply.data if outcome.reply is not None else {}
    return [f for f in data.get("findings", [data] if data.get("state") else [])]


def test_a_vm_stuck_starting_then_stuck_stopping_ends_the_starting_finding_once(cluster):
    """A VM handed over to its node stays Starting (virt-handler there never starts the guest, and nothing the
    cluster wrote says why); it is stopped, and the stop hangs there too (KubeVirt prints Stopping: the VMI, marked
    for deletion, is not final). The stuck-starting finding ends once, with one notice, when the stuck-stopping one
    opens; later ticks announce nothing and do not rewrite the stopping finding's Event. (The node is Ready: a node
    that stopped answering is evacuation-report's, and vm-stuck-report defers its VMs.)"""
    node = f"quiet{next(_names)}"
    cluster.create(b.node(node))
    vm, vmi = stuck_vm(cluster, "Starting", vmi_phase="Scheduled",
                       finalizers=("kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"))
    name = vm["metadata"]["name"]
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", name, {"status": {"nodeName": node}})
    create_pod(cluster, b.pod(vmi, node=node, phase="Running", scheduled=("True", "", "")))
    [starting] = notices(converge(cluster, vm))
    assert (starting["category"], starting["state"], starting["details"]["cause"]) == \
        ("stuck-starting", "detected", "unknown")
    # the VM is stopped: virt-controller deletes the VMI and prints Stopping; virt-handler on the node is down
    cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name, {"status": {"printableStatus": "Stopping"}},
                  subresource="status")
    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    changed = notices(converge(cluster, vm))
    assert sorted((n["category"], n["state"]) for n in changed) == \
        [("stuck-starting", "resolved"), ("stuck-stopping", "detected")], changed
    stopping = next(n for n in changed if n["state"] == "detected")
    assert stopping["details"]["cause"] == "unknown", stopping["details"]
    assert "Stopping now" in next(n for n in changed if n["state"] == "resolved")["details"]["because"]
    events = {e["metadata"]["labels"]["vmevents.io/finding-state"]: e for e in findings_of(cluster, name)}
    for _ in range(2):  # later ticks: nothing announced, nothing rewritten
        assert notices(converge(cluster, vm)) == []
    after = {e["metadata"]["labels"]["vmevents.io/finding-state"]: e for e in findings_of(cluster, name)}
    assert sorted(after) == ["open", "resolved"]
    assert after["open"]["metadata"]["resourceVersion"] == events["open"]["metadata"]["resourceVersion"]
    assert after["resolved"]["metadata"]["resourceVersion"] == events["resolved"]["metadata"]["resourceVersion"]


def findings_of(cluster, name: str) -> list[dict]:
    return [e for e in cluster.list("v1", "Event", "default", label_selector=f"vmevents.io/finding={FUNCTION}")
            if e["involvedObject"]["name"] == name]


# -- 4. the tail of a drain's migration queue -----------------------------------------------------------------
def migration(cluster, vmi: dict, phase: str) -> dict:
    """A VMIM of `vmi` in `phase`, as the migration controller writes it (a status subresource)."""
    manifest = b.vmim(vmi, name=f"{vmi['metadata']['name']}-mig{next(_names)}", phase=None)
    manifest["metadata"] = {"name": manifest["metadata"]["name"], "namespace": "default"}
    created = cluster.create(manifest)
    return cluster.patch("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default", created["metadata"]["name"],
                         {"status": {"phase": phase}}, subresource="status")


@pytest.mark.parametrize("running,node,limits,reported", [
    pytest.param(5, "spread", None, None, id="five-running-of-the-clusters-five"),
    pytest.param(2, "node-a", None, None, id="two-out-of-the-node-of-two"),
    pytest.param(0, "node-a", {"parallelOutboundMigrationsPerNode": 0}, "migration-queued", id="a-limit-of-zero"),
])
def test_a_migration_kubevirt_keeps_queued_is_reported_as_queued_or_not_at_all(cluster, running, node, limits,
                                                                                reported):
    """Draining a node, KubeVirt keeps the VMIMs beyond its limits Pending (migration.go handleTargetPodCreation):
    parallelMigrationsPerCluster (5) and parallelOutboundMigrationsPerNode (2), from the KubeVirt CR's
    spec.configuration.migrations or its defaults. Such a migration is queued: not reported (never as unknown at
    warning severity); held by a limit of 0, it is reported as queued, with the numbers."""
    made: list[tuple[str, str]] = []
    if limits:
        kubevirt = cluster.list("kubevirt.io/v1", "KubeVirt")[0]["metadata"]
        cluster.patch("kubevirt.io/v1", "KubeVirt", kubevirt["namespace"], kubevirt["name"],
                      {"spec": {"configuration": {"migrations": limits}}})
    try:
        for i in range(running):
            vm, vmi = stuck_vm(cluster, "Migrating", vmi_phase="Running")
            cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", vmi["metadata"]["name"],
                          {"status": {"nodeName": f"node-{'abcdefgh'[i]}" if node == "spread" else node}})
            made.append(("VirtualMachineInstanceMigration", migration(cluster, vmi, "Running")["metadata"]["name"]))
        vm, vmi = stuck_vm(cluster, "Running", vmi_phase="Running")
        cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", vmi["metadata"]["name"],
                      {"status": {"nodeName": "node-a"}})
        queued = migration(cluster, vmi, "Pending")
        made.append(("VirtualMachineInstanceMigration", queued["metadata"]["name"]))
        found = handler.Target("default", vm["metadata"]["name"], queued["metadata"]["name"])
        outcome = handler.converge(found, context(cluster), f"ce-{next(_names)}", tick=True)
    finally:
        for kind, name in made:  # the queue is cluster-wide: nothing of it may outlive the test
            cluster.delete("kubevirt.io/v1", kind, "default", name)
        if limits:
            cluster.patch("kubevirt.io/v1", "KubeVirt", kubevirt["namespace"], kubevirt["name"],
                          {"spec": {"configuration": {"migrations": None}}})
    if reported is None:
        assert outcome.reply is None and outcome.verdict == "settled", (outcome.verdict, outcome.reason)
        assert "queued" in outcome.reason and (f"{running} migration(s) running of parallelMigrationsPerCluster 5"
                                               in outcome.reason), outcome.reason
        assert not findings_of(cluster, vm["metadata"]["name"])
    else:
        d = report(outcome)["details"]
        assert d["cause"] == reported and any("parallelOutboundMigrationsPerNode 0" in e for e in d["evidence"])
        assert "`kubectl -n" in d["nextStep"] and "edit kubevirt" in d["nextStep"], d["nextStep"]


# -- 5. states with no live VMI: timed from what CDI and KubeVirt record -------------------------------------
DATAVOLUME_GRANT = ("get", "cdi.kubevirt.io", "datavolumes")  # test_e2e.py's KubeVirt never prints DataVolume states

def test_a_vm_whose_datavolume_never_imports_is_timed_from_it_and_reported(cluster):
    """KubeVirt creates no VMI until the VM's DataVolumes are ready (vm.go handleDataVolumes) and prints
    DataVolumeError while CDI's importer fails (pkg/storage/types/dv.go HasDataVolumeErrors): the episode is the
    DataVolume's, from its creation; the cause is CDI's Running condition."""
    name = f"written{next(_names)}"
    dv = cluster.create(b.datavolume(f"{name}-rootdisk"))
    cluster.patch("cdi.kubevirt.io/v1beta1", "DataVolume", "default", dv["metadata"]["name"],
                  {"status": b.import_failing()}, subresource="status")
    manifest = b.vm(name, status=None, datavolumes=(dv["metadata"]["name"],))
    manifest["metadata"] = {"name": name, "namespace": "default"}
    manifest.pop("status")
    cluster.create(manifest)
    vm = cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name,
                       {"status": {"printableStatus": "DataVolumeError"}}, subresource="status")
    found = report(converge(cluster, vm))
    d = found["details"]
    assert (d["cause"], d["instance"]) == ("volume-import", dv["metadata"]["uid"]), (d["cause"], d["checked"])
    assert any(f"DataVolume {name}-rootdisk: phase ImportInProgress, Running=False (Error): Unable to connect" in e
               and "4 restart(s)" in e for e in d["evidence"]), d["evidence"]
    assert f"`kubectl -n default describe datavolume {name}-rootdisk`" in d["nextStep"], d["nextStep"]
    assert DATAVOLUME_GRANT in used(cluster.requests, SA), "read with the function's own grant"


def test_a_vm_in_a_crash_loop_is_timed_from_kubevirts_back_off_and_reported(cluster):
    """Every VMI fails before it runs: KubeVirt counts them in status.startFailure and prints CrashLoopBackOff, with
    no live VMI, while it waits out its back-off (vm.go syncStartFailureStatus, calculateStartBackoffTime)."""
    vm, vmi = stuck_vm(cluster, "CrashLoopBackOff", vmi_phase="Failed")
    now = datetime.now(UTC)
    vm = cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", vm["metadata"]["name"], {"status": {
        "startFailure": {"consecutiveFailCount": 7, "lastFailedVMIUID": vmi["metadata"]["uid"],
                         "retryAfterTimestamp": b.stamp(now + timedelta(minutes=4))}}}, subresource="status")
    failed = b.pod(vmi, node="node-a", phase="Failed")
    failed["status"]["containerStatuses"] = [{
        "name": "compute", "image": b.LAUNCHER_IMAGE, "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "could not open disk image"}}}]
    pod = create_pod(cluster, failed)
    d = report(converge(cluster, vm))["details"]
    assert (d["cause"], d["instance"]) == ("crash-loop", vm["metadata"]["uid"]), (d["cause"], d["checked"])
    assert any("KubeVirt counted 7 start(s) in a row" in e for e in d["evidence"]), d["evidence"]
    assert any("container compute ended: Error (exit code 1): could not open disk image" in e for e in d["evidence"])
    assert f"`kubectl -n default logs {pod['metadata']['name']} -c compute`" in d["nextStep"], d["nextStep"]


# -- 6. records before state: a slowed sighting does not reopen what a later look resolved --------------------
class HeldAtItsFinding:
    """The function's client, whose first GET of an Event (the ledger reading the finding it is about to write) is
    held until the test lets it go: a delivery that read everything, then waits (its API server waiting for etcd)."""

    def __init__(self, kube: Kube):
        self._kube = kube
        self.reached, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def get(self, kind, *args, **kwargs):
        if kind is EVENT and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60), "the test never let the delivery go on"
        return self._kube.get(kind, *args, **kwargs)


def test_a_slowed_sighting_does_not_reopen_what_a_later_look_resolved_whatever_the_clocks(cluster):
    """A delivery reads the VM stuck and is slowed before it writes; meanwhile the VM runs and a tick resolves the
    episode. The tick's clock runs 5 s behind the delivery's (two pods): compared by stamps, the resolution looked
    older than the delivery's look, and the delivery reopened a second episode for a VM that runs. The function
    reads the finding's record before the state, and the ledger compares its resourceVersion."""
    message = b.insufficient("memory", nodes=1)
    vm, vmi = stuck_vm(cluster, "ErrorUnschedulable", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}])
    create_pod(cluster, b.pod(vmi, scheduled=("False", "Unschedulable", message)))
    name = vm["metadata"]["name"]
    [opened] = notices(converge(cluster, vm))
    assert opened["state"] == "detected"
    slow = HeldAtItsFinding(Kube(cluster.api_client(service_account=SA)))
    ctx = context(cluster)
    held = KubeContext(function=FUNCTION, settings=ctx.settings, clock=ctx.clock, kube=cast(Kube, slow),
                       recorder=Recorder(cast(Kube, slow), FUNCTION))
    with ThreadPoolExecutor(1) as pool:
        sighting = pool.submit(handler.converge, handler.Target("default", name), held, f"ce-slow-{name}")
        assert slow.reached.wait(60), "the delivery read the VM and came to its finding"
        try:  # meanwhile the VM runs, and a tick whose clock is 5 s behind resolves the episode
            cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name,
                          {"status": {"printableStatus": "Running"}}, subresource="status")
            cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", name,
                          {"status": {"phase": "Running", "conditions": None}})
            [ended] = notices(converge(cluster, vm, context(cluster, AHEAD - timedelta(seconds=5))))
            assert ended["state"] == "resolved"
        finally:
            slow.go.set()
        late = sighting.result(timeout=60)
    assert notices(late) == [], f"the slowed sighting reopened the episode: {late.reason}"
    [record] = findings_of(cluster, name)
    assert record["metadata"]["labels"]["vmevents.io/finding-state"] == "resolved"


# -- issue 34 point 6: the scheduler's Events count their repeats in series.count -------------------------------
def test_the_schedulers_repeats_are_its_series_count(cluster):
    """kube-scheduler records FailedScheduling with the events.k8s.io recorder: one Event whose `series.count`
    rises, with no `count` (client-go tools/events). Retried 23 times, the evidence says ×23."""
    message = b.insufficient("memory", nodes=1)
    vm, vmi = stuck_vm(cluster, "ErrorUnschedulable", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}])
    unschedulable = b.pod(vmi, scheduled=("False", "Unschedulable", message))
    pod = create_pod(cluster, unschedulable)
    now = datetime.now(UTC)
    cluster.create(b.scheduler_event(pod, message, repeats=23, first=now - timedelta(minutes=20), last=now))
    d = report(converge(cluster, vm))["details"]
    assert d["cause"] == "insufficient-resources"
    assert any(f"FailedScheduling ×23: {message}" in e for e in d["evidence"]), d["evidence"]


@pytest.fixture(scope="module", params=[p for p in backends.params() if p.id == backends.REAL])
def real_cluster(request):
    found = backends.cluster(request.param, "1.3.1", virt_controller=False)
    yield found
    found.stop()


def test_an_events_k8s_io_series_reads_through_core_v1_as_the_function_reads_it(real_cluster):
    """The fact scheduler_event rests on, asked of a real kube-apiserver: an Event written through events.k8s.io/v1
    with a series reads through core/v1 with `series.count`, `eventTime`, no `count` and no `lastTimestamp`
    (pkg/apis/events/v1/conversion.go). The simulator serves core/v1 Events only."""
    from kubernetes import client as k8s

    now = datetime.now(UTC)
    name = f"series{next(_names)}"
    k8s.EventsV1Api(real_cluster.api_client()).create_namespaced_event("default", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "FailedScheduling", "note": "0/1 nodes are available", "type": "Warning", "action": "Scheduling",
        "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-x",
        "eventTime": b.micro(now), "series": {"count": 23, "lastObservedTime": b.micro(now)}})
    read = real_cluster.get("v1", "Event", "default", name)
    assert read["series"]["count"] == 23 and read["message"] == "0/1 nodes are available"
    assert not read.get("count") and not read.get("lastTimestamp") and read.get("eventTime")

"""The simulated KubeVirt behaves like the real one where vmi-cleanup's safety depends on it.

First the pure decisions (docs/facts.md §2 table, row by row, per KubeVirt version), then the same rows
end to end: a VM on the simulated API server, its guest powered off, the leftover VMI deleted.
"""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from simcluster.kubevirt.objects import VM_CONTROLLER_FINALIZER, condition_is, condition_of, parse_version, vmi_phase
from simcluster.kubevirt.scheduler import NO_VICTIMS, schedule
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.kubevirt.vm_controller import (
    ADD_START_REQUEST,
    ADD_VM_FINALIZER,
    REMOVE_VM_FINALIZER,
    REMOVE_VMI_FINALIZER,
    SET_ALWAYS,
    START,
    STOP,
    printable_status,
    reconcile,
    vm_status,
    vmi_from_vm,
)
from simcluster.kubevirt.vmi_controller import launcher_pod

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
OLD, NEW = "1.1.1", "1.3.1"
VF = "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"
SEED_HOST_DEVICE = {"deviceName": VF, "name": "harvester-ktmg4-000004102"}


# --------------------------------------------------------------------------------- builders

def make_vm(name="vm1", *, strategy="RerunOnFailure", running=None, requests=None, last_strategy=None,
            deleting=False, finalized=True, host_devices=None, hostname=None, namespace="default"):
    """A VM shaped like the seed's (template labels/annotations, optional seed host device)."""
    spec = {"template": {"metadata": {"labels": {"harvesterhci.io/vmName": name},
                                      "annotations": {"harvesterhci.io/sshNames": "[]"}},
                         "spec": {"domain": {"cpu": {"cores": 1}, "devices": {},
                                             "resources": {"requests": {"memory": "64Mi"}}}}}}
    if strategy is not None:
        spec["runStrategy"] = strategy
    if running is not None:
        spec["running"] = running
    if host_devices:
        spec["template"]["spec"]["domain"]["devices"]["hostDevices"] = host_devices
    if hostname:
        spec["template"]["spec"]["hostname"] = hostname
    meta = {"name": name, "namespace": namespace}
    if finalized:
        meta["finalizers"] = [VM_CONTROLLER_FINALIZER]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:00:00Z"
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": meta, "spec": spec}
    status = {}
    if requests:
        status["stateChangeRequests"] = requests
    if last_strategy:
        status["runStrategy"] = last_strategy
    if status:
        vm["status"] = status
    return vm


def make_vmi(phase="Running", *, uid="vmi-uid-1", deleting=False, conditions=None, finalizers=None):
    meta = {"name": "vm1", "namespace": "default", "uid": uid,
            "finalizers": ([VM_CONTROLLER_FINALIZER, "foregroundDeleteVirtualMachine"] if finalizers is None
                           else finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:00:00Z"
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "status": {"phase": phase, "conditions": conditions or []}}


def verbs(actions):
    return [a.verb for a in actions if a.verb not in (REMOVE_VMI_FINALIZER, ADD_VM_FINALIZER)]


# ------------------------------------------------------------ FACTS §2, the pure decision

# (strategy, version, VMI phase or None, VM status.runStrategy) -> what the controller does
TABLE = [
    # Always (and spec.running: true): a final VMI is deleted, and with none a new one starts.
    pytest.param("Always", OLD, "Succeeded", None, [STOP], id="always-succeeded-deleted"),
    pytest.param("Always", NEW, "Succeeded", None, [STOP], id="always-succeeded-deleted-new"),
    pytest.param("Always", NEW, None, None, [START], id="always-no-vmi-starts"),
    pytest.param("Always", NEW, "Running", None, [], id="always-running-kept"),
    # RerunOnFailure ≤ 1.1.1: a Succeeded VMI is left, and deleting it boots the guest again.
    pytest.param("RerunOnFailure", OLD, "Succeeded", "RerunOnFailure", [], id="rerun-old-succeeded-left"),
    pytest.param("RerunOnFailure", OLD, None, "RerunOnFailure", [START], id="rerun-old-no-vmi-restarts"),
    pytest.param("RerunOnFailure", OLD, "Failed", None, [STOP], id="rerun-old-failed-deleted"),
    # RerunOnFailure ≥ 1.2.0: the controller deletes a Succeeded VMI itself and does not restart.
    pytest.param("RerunOnFailure", NEW, "Succeeded", "RerunOnFailure", [STOP], id="rerun-new-succeeded-deleted"),
    pytest.param("RerunOnFailure", NEW, None, "RerunOnFailure", [], id="rerun-new-no-vmi-stays-stopped"),
    pytest.param("RerunOnFailure", "1.2.0", None, "RerunOnFailure", [], id="rerun-1.2.0-no-vmi-stays-stopped"),
    pytest.param("RerunOnFailure", NEW, "Failed", "RerunOnFailure", [STOP, ADD_START_REQUEST],
                 id="rerun-new-failed-rerun"),
    pytest.param("RerunOnFailure", NEW, None, None, [START], id="rerun-new-first-start"),
    pytest.param("RerunOnFailure", NEW, None, "Halted", [START], id="rerun-new-switched-from-halted-starts"),
    # Manual: a final VMI is left; with none, nothing happens without a start request.
    pytest.param("Manual", OLD, "Succeeded", None, [], id="manual-succeeded-left"),
    pytest.param("Manual", NEW, "Succeeded", None, [], id="manual-succeeded-left-new"),
    pytest.param("Manual", NEW, None, "Manual", [], id="manual-no-vmi-nothing"),
    # Once: a final VMI is left; with none, it starts (`if vmi == nil { startVMI }`).
    pytest.param("Once", OLD, "Succeeded", None, [], id="once-succeeded-left"),
    pytest.param("Once", NEW, "Succeeded", None, [], id="once-succeeded-left-new"),
    pytest.param("Once", NEW, None, "Once", [START], id="once-no-vmi-starts-again"),
    # Halted (and spec.running: false): any VMI is deleted; with none, nothing.
    pytest.param("Halted", NEW, "Succeeded", None, [STOP], id="halted-succeeded-deleted"),
    pytest.param("Halted", OLD, "Running", None, [STOP], id="halted-running-deleted"),
    pytest.param("Halted", NEW, None, None, [], id="halted-no-vmi-nothing"),
]


@pytest.mark.parametrize("strategy, version, phase, last, expected", TABLE)
def test_reconcile_follows_the_run_strategy_table(strategy, version, phase, last, expected):
    vm = make_vm(strategy=strategy, last_strategy=last)
    vmi = make_vmi(phase) if phase else None
    assert verbs(reconcile(vm, vmi, version)) == expected


@pytest.mark.parametrize("running, expected_none, expected_final", [
    pytest.param(True, [START], [STOP], id="running-true-is-always"),
    pytest.param(False, [], [STOP], id="running-false-is-halted"),
])
def test_legacy_spec_running(running, expected_none, expected_final):
    vm = make_vm(strategy=None, running=running)
    assert verbs(reconcile(vm, None, NEW)) == expected_none
    assert verbs(reconcile(vm, make_vmi("Succeeded"), NEW)) == expected_final


@pytest.mark.parametrize("strategy", ["Always", "RerunOnFailure", "Halted"])
def test_a_vmi_already_being_deleted_is_not_deleted_again(strategy):
    vm = make_vm(strategy=strategy, last_strategy=strategy)
    assert STOP not in verbs(reconcile(vm, make_vmi("Succeeded", deleting=True), NEW))


@pytest.mark.parametrize("requests, phase, expected", [
    pytest.param([{"action": "Start"}], None, [START], id="start-request-starts"),
    pytest.param([{"action": "Stop", "uid": "vmi-uid-1"}], "Running", [STOP], id="stop-request-for-this-vmi"),
    pytest.param([{"action": "Stop", "uid": "other-uid"}], "Running", [], id="stop-request-for-another-vmi"),
    pytest.param([{"action": "Stop", "uid": "vmi-uid-1"}, {"action": "Start"}], "Succeeded", [STOP],
                 id="restart-stops-first"),
])
def test_manual_honours_state_change_requests(requests, phase, expected):
    vm = make_vm(strategy="Manual", requests=requests)
    assert verbs(reconcile(vm, make_vmi(phase) if phase else None, NEW)) == expected


def test_halted_with_a_start_request_becomes_always():
    assert verbs(reconcile(make_vm(strategy="Halted", requests=[{"action": "Start"}]), None, NEW)) == [SET_ALWAYS]


def test_finalizers_vm_gets_one_final_vmi_loses_ours():
    actions = [a.verb for a in reconcile(make_vm(strategy="Manual", finalized=False), make_vmi("Succeeded"), NEW)]
    assert actions == [ADD_VM_FINALIZER, REMOVE_VMI_FINALIZER]


@pytest.mark.parametrize("vmi, expected", [
    pytest.param(make_vmi("Running"), [STOP], id="stops-the-vmi"),
    pytest.param(None, [REMOVE_VM_FINALIZER], id="then-drops-its-finalizer"),
])
def test_a_deleted_vm_stops_its_vmi_first(vmi, expected):
    actions = reconcile(make_vm(strategy="Always", deleting=True), vmi, NEW)
    assert [a.verb for a in actions if a.verb != REMOVE_VMI_FINALIZER] == expected


@pytest.mark.parametrize("given, expected", [
    ("1.1.1", (1, 1, 1)), ("v1.3.1", (1, 3, 1)), ("1.4", (1, 4, 0)), ("1.10.0-rc.1", (1, 10, 0)),
])
def test_versions_compare_numerically(given, expected):
    assert parse_version(given) == expected
    assert parse_version("1.10.0") > parse_version("1.9.9") > parse_version("1.2.0") > parse_version("1.1.1")


def test_a_bad_version_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="use one like 1.3.1"):
        parse_version("latest")


# ------------------------------------------------------------------- VM status, pure

@pytest.mark.parametrize("vm, vmi, expected", [
    pytest.param(make_vm(), None, "Stopped", id="no-vmi"),
    pytest.param(make_vm(), make_vmi(""), "Starting", id="new-vmi"),
    pytest.param(make_vm(), make_vmi("Scheduling"), "Starting", id="scheduling"),
    pytest.param(make_vm(), make_vmi("Running"), "Running", id="running"),
    pytest.param(make_vm(), make_vmi("Succeeded"), "Stopped", id="succeeded-shows-stopped-as-in-the-seed"),
    pytest.param(make_vm(), make_vmi("Failed"), "Stopped", id="failed"),
    pytest.param(make_vm(), make_vmi("Running", deleting=True), "Stopping", id="running-being-deleted"),
    pytest.param(make_vm(deleting=True), make_vmi("Running"), "Terminating", id="vm-being-deleted"),
    pytest.param(make_vm(), make_vmi("Running", conditions=[{"type": "Paused", "status": "True"}]), "Paused",
                 id="paused"),
    pytest.param(make_vm(), make_vmi("Scheduling", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]),
        "ErrorUnschedulable", id="unschedulable"),
])
def test_printable_status(vm, vmi, expected):
    assert printable_status(vm, vmi) == expected


def test_vm_status_records_created_ready_and_the_last_run_strategy():
    vmi = make_vmi("Running", conditions=[{"type": "Ready", "status": "True"}])
    status = vm_status(make_vm(), vmi, NEW, NOW)
    assert status["created"] is True and status["ready"] is True
    assert status["runStrategy"] == "RerunOnFailure"  # written once a VMI exists (≥1.3)
    assert status["conditions"][0] == {"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-11-30T12:00:00Z"}
    assert "runStrategy" not in vm_status(make_vm(), vmi, OLD, NOW)  # no such field before 1.2


def test_vm_status_without_vmi_is_not_created_not_ready():
    status = vm_status(make_vm(), None, NEW, NOW)
    assert "created" not in status and "ready" not in status and "runStrategy" not in status
    assert status["conditions"][0]["reason"] == "VMINotExists"
    assert status["printableStatus"] == "Stopped"


STOP_1 = {"action": "Stop", "uid": "vmi-uid-1"}
START_REQ = {"action": "Start"}


@pytest.mark.parametrize("requests, vmi, remaining", [
    pytest.param([STOP_1], None, [], id="stop-done-once-vmi-gone"),
    pytest.param([STOP_1], make_vmi("Running"), [STOP_1], id="stop-pending"),
    pytest.param([START_REQ], make_vmi("Running"), [], id="start-done-once-vmi-runs"),
    pytest.param([START_REQ], make_vmi("Failed"), [START_REQ], id="start-pending-while-vmi-final"),
    pytest.param([{"action": "Stop", "uid": "x"}, START_REQ], make_vmi("Running"), [START_REQ],
                 id="only-the-first-is-trimmed"),
])
def test_state_change_requests_are_trimmed_when_done(requests, vmi, remaining):
    status = vm_status(make_vm(strategy="Manual", requests=requests), vmi, NEW, NOW)
    assert status.get("stateChangeRequests", []) == remaining


def test_condition_transition_time_is_kept_while_unchanged():
    vm = make_vm()
    vm["status"] = vm_status(vm, None, NEW, NOW)
    later = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
    assert vm_status(vm, None, NEW, later) == vm["status"]


# ----------------------------------------------------------------- scheduling, pure

def bound_pod(node="harvester-ktmg4", phase="Running", devices=1):
    pod = launcher_pod({"metadata": {"name": "holder", "namespace": "default", "uid": "u"},
                        "spec": {"domain": {"devices": {"hostDevices": [SEED_HOST_DEVICE] * devices}}}}, NEW)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


@pytest.mark.parametrize("pods, expected", [
    pytest.param([], ("harvester-ktmg4", None), id="free"),
    pytest.param([bound_pod()], (None, f"0/1 nodes are available: 1 Insufficient {VF}. preemption: 0/1 nodes are "
                                      f"available: 1 {NO_VICTIMS}."), id="taken"),
    pytest.param([bound_pod(phase="Succeeded")], ("harvester-ktmg4", None), id="freed-by-completed-pod"),
    pytest.param([bound_pod(phase="Failed")], ("harvester-ktmg4", None), id="freed-by-failed-pod"),
])
def test_schedule_counts_devices_of_live_pods(pods, expected):
    assert schedule({VF: 1}, {"harvester-ktmg4": {VF: 1}}, pods) == expected


def test_schedule_message_counts_every_node():
    nodes = {"a": {VF: 1}, "b": {}, "c": {VF: 1}}
    node, why = schedule({VF: 1}, nodes, [bound_pod("a"), bound_pod("c")])
    assert node is None and why == f"0/3 nodes are available: 3 Insufficient {VF}. preemption: 0/3 nodes are " \
                                   f"available: 3 {NO_VICTIMS}."
    assert schedule({VF: 1}, nodes, [bound_pod("a")]) == ("c", None)


def test_launcher_pod_shape():
    vmi = {"metadata": {"name": "vm1", "namespace": "default", "uid": "vmi-uid", "labels": {"app": "x"}},
           "spec": {"hostname": "vm", "domain": {
               "devices": {"hostDevices": [SEED_HOST_DEVICE], "gpus": [{"name": "g", "deviceName": "nvidia.com/A2"}]},
               "resources": {"requests": {"memory": "1365Mi", "cpu": "125m"}, "limits": {"memory": "2Gi"}}}}}
    pod = launcher_pod(vmi, NEW)
    meta = pod["metadata"]
    assert meta["generateName"] == "virt-launcher-vm1-"
    # vm.kubevirt.io/name is the guest's hostname (template.go); the seed's vm1 has hostname "vm".
    assert meta["labels"] == {"app": "x", "kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "vmi-uid",
                              "vm.kubevirt.io/name": "vm"}
    assert meta["ownerReferences"] == [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                        "name": "vm1", "uid": "vmi-uid", "controller": True,
                                        "blockOwnerDeletion": True}]
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"memory": "1365Mi", "cpu": "125m", VF: "1", "nvidia.com/A2": "1"}
    assert resources["limits"] == {"memory": "2Gi", VF: "1", "nvidia.com/A2": "1"}


def test_vmi_from_vm_copies_the_template_and_points_at_the_vm():
    vm = make_vm(strategy="Always")
    vm["metadata"].update(uid="vm-uid", generation=3)
    vmi = vmi_from_vm(vm)
    assert vmi["metadata"]["name"] == "vm1" and vmi["spec"] == vm["spec"]["template"]["spec"]
    assert vmi["metadata"]["labels"] == {"harvesterhci.io/vmName": "vm1"}
    assert vmi["metadata"]["annotations"] == {"harvesterhci.io/sshNames": "[]", "kubevirt.io/vm-generation": "3"}
    assert vmi["metadata"]["ownerReferences"] == [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                                   "name": "vm1", "uid": "vm-uid", "controller": True,
                                                   "blockOwnerDeletion": True}]
    assert vmi["metadata"]["finalizers"] == [VM_CONTROLLER_FINALIZER]


# ------------------------------------------------- end to end on the simulated API server

VM_API, VMI_KIND, VM_KIND = "kubevirt.io/v1", "VirtualMachineInstance", "VirtualMachine"
NODE = "harvester-ktmg4"


class World:
    """A simulated cluster with KubeVirt of one version, one node with one VF, and helpers."""

    def __init__(self, version: str):
        from simcluster.apiserver import SimCluster

        self.version = version
        self.cluster = SimCluster(kubevirt_version=version).start()
        self.kubevirt = KubeVirtSim(self.cluster, nodes={NODE: {VF: 1}}, step_delay=0.0,
                                       resync_period=0.2).start()

    def close(self):
        self.kubevirt.stop()
        self.cluster.stop()

    def create_vm(self, name, strategy="RerunOnFailure", running=None, host_devices=None, hostname=None):
        vm = make_vm(name, strategy=strategy, running=running, host_devices=host_devices, hostname=hostname,
                     finalized=False)
        self.cluster.create(vm)
        self.kubevirt.wait_idle()

    def vm(self, name):
        return self.cluster.get(VM_API, VM_KIND, "default", name)

    def vmi(self, name):
        return self.cluster.get(VM_API, VMI_KIND, "default", name)

    def phase(self, name):
        return vmi_phase(self.vmi(name)) if self.vmi(name) else None

    def uid(self, name):
        return self.vmi(name)["metadata"]["uid"]

    def pods(self, vmi_uid):
        return self.cluster.list("v1", "Pod", "default", label_selector=f"kubevirt.io/created-by={vmi_uid}")

    def events(self, name):
        return [(e["reason"], e["message"]) for e in self.cluster.list("v1", "Event", "default")
                if e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == VM_KIND]

    def delete_vmi(self, name):
        self.cluster.delete(VM_API, VMI_KIND, "default", name)
        self.kubevirt.wait_idle()

    def lifecycle(self, name, action):
        """PUT the VM's start/stop subresource over HTTP, as virtctl does."""
        api_client = self.cluster.api_client()
        request = api_client.param_serialize(
            "PUT", f"/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/{name}/{action}",
            header_params={"Content-Type": "application/json", "Accept": "application/json"}, body={},
            auth_settings=["BearerToken"])
        response = api_client.call_api(*request)
        response.read()
        assert response.status == 202, response.data
        self.kubevirt.wait_idle()


def started(version: str):
    """A World of this KubeVirt version for one test, closed after it."""
    pytest.importorskip("simcluster.apiserver")
    w = World(version)
    yield w
    w.close()


@pytest.fixture(params=[OLD, NEW])
def world(request):
    yield from started(request.param)


@pytest.fixture
def new_world():
    yield from started(NEW)


@pytest.fixture
def old_world():
    yield from started(OLD)


def start_and_power_off(world, name, strategy, **vm):
    world.create_vm(name, strategy, **vm)
    assert world.phase(name) == "Running"
    first = world.uid(name)
    world.kubevirt.guest_power_off("default", name)
    world.kubevirt.wait_idle()
    return first


def outcome(world, name, first_uid):
    vmi = world.vmi(name)
    if vmi is None:
        return "deleted"
    if vmi["metadata"]["uid"] == first_uid:
        return f"left {vmi_phase(vmi)}"
    return f"replaced, new VMI {vmi_phase(vmi)}"


# FACTS §2, row by row: (strategy, version) -> after `poweroff`, and after deleting a leftover VMI.
ROWS = [
    pytest.param("Always", OLD, "replaced, new VMI Running", None, id="always-1.1.1"),
    pytest.param("Always", NEW, "replaced, new VMI Running", None, id="always-1.3.1"),
    pytest.param("RerunOnFailure", OLD, "left Succeeded", "boots again", id="rerun-1.1.1"),
    pytest.param("RerunOnFailure", NEW, "deleted", None, id="rerun-1.3.1"),
    pytest.param("Manual", OLD, "left Succeeded", "stays stopped", id="manual-1.1.1"),
    pytest.param("Manual", NEW, "left Succeeded", "stays stopped", id="manual-1.3.1"),
    pytest.param("Once", OLD, "left Succeeded", "boots again", id="once-1.1.1"),
    pytest.param("Once", NEW, "left Succeeded", "boots again", id="once-1.3.1"),
]


@pytest.mark.parametrize("strategy, version, after_poweroff, after_delete", ROWS)
def test_guest_power_off_per_run_strategy(strategy, version, after_poweroff, after_delete):
    pytest.importorskip("simcluster.apiserver")
    world = World(version)
    try:
        if strategy == "Manual":
            world.create_vm("vm1", "Manual")
            assert world.vmi("vm1") is None  # Manual waits for a start request
            world.lifecycle("vm1", "start")
            first = world.uid("vm1")
            world.kubevirt.guest_power_off("default", "vm1")
            world.kubevirt.wait_idle()
        else:
            first = start_and_power_off(world, "vm1", strategy)
        assert outcome(world, "vm1", first) == after_poweroff
        vm = world.vm("vm1")
        if after_poweroff.startswith("left"):
            assert vm["status"]["printableStatus"] == "Stopped"  # as the seed shows for a Succeeded VMI
            [pod] = world.pods(first)
            assert pod["status"]["phase"] == "Succeeded"
            assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
            # The VM controller has recorded the VMI's status and let go of it.
            assert world.vmi("vm1")["metadata"]["finalizers"] == ["foregroundDeleteVirtualMachine"]
        if after_poweroff == "deleted":
            assert vm["status"]["printableStatus"] == "Stopped"
            assert world.pods(first) == []
            assert ("SuccessfulDelete", f"Stopped the virtual machine by deleting the virtual machine instance {first}"
                    ) in world.events("vm1")
        if after_delete is None:
            return
        world.delete_vmi("vm1")
        if after_delete == "boots again":
            assert world.phase("vm1") == "Running" and world.uid("vm1") != first
            assert world.vm("vm1")["status"]["printableStatus"] == "Running"
        else:
            assert world.vmi("vm1") is None
            assert world.vm("vm1")["status"]["printableStatus"] == "Stopped"
        assert world.pods(first) == []
    finally:
        world.close()


@pytest.mark.parametrize("strategy", ["Once", "RerunOnFailure"])
def test_halting_the_vm_removes_the_leftover_without_a_restart(old_world, strategy):
    """The safe clean-up where deleting would reboot: set runStrategy Halted (FACTS §2)."""
    first = start_and_power_off(old_world, "vm1", strategy)
    assert outcome(old_world, "vm1", first) == "left Succeeded"
    old_world.cluster.patch(VM_API, VM_KIND, "default", "vm1", {"spec": {"runStrategy": "Halted"}})
    old_world.kubevirt.wait_idle()
    assert old_world.vmi("vm1") is None
    assert old_world.vm("vm1")["status"]["printableStatus"] == "Stopped"


def test_legacy_running_true_behaves_as_always(world):
    first = start_and_power_off(world, "vm1", None, running=True)
    assert outcome(world, "vm1", first) == "replaced, new VMI Running"
    world.cluster.patch(VM_API, VM_KIND, "default", "vm1", {"spec": {"running": False}})
    world.kubevirt.wait_idle()
    assert world.vmi("vm1") is None


def test_rerun_on_failure_reruns_a_crashed_guest(world):
    world.create_vm("vm1", "RerunOnFailure")
    first = world.uid("vm1")
    world.kubevirt.guest_crash("default", "vm1")
    world.kubevirt.wait_idle()
    assert outcome(world, "vm1", first) == "replaced, new VMI Running"
    assert "stateChangeRequests" not in world.vm("vm1")["status"]  # the Start request was consumed


def test_running_vmi_and_launcher_pod_look_like_kubevirts(new_world):
    new_world.create_vm("vm1", "Always", host_devices=[SEED_HOST_DEVICE], hostname="vm")
    vm, vmi = new_world.vm("vm1"), new_world.vmi("vm1")
    assert [s["phase"] for s in vmi["status"]["phaseTransitionTimestamps"]] == \
        ["Pending", "Scheduling", "Scheduled", "Running"]
    for stamp in vmi["status"]["phaseTransitionTimestamps"]:
        datetime.strptime(stamp["phaseTransitionTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    assert vmi["status"]["nodeName"] == NODE and vmi["metadata"]["labels"]["kubevirt.io/nodeName"] == NODE
    assert vmi["metadata"]["ownerReferences"][0]["uid"] == vm["metadata"]["uid"]
    assert vmi["metadata"]["finalizers"] == [VM_CONTROLLER_FINALIZER, "foregroundDeleteVirtualMachine"]
    assert condition_is(vmi, "Ready", "True")
    [pod] = new_world.pods(vmi["metadata"]["uid"])
    assert pod["metadata"]["name"].startswith("virt-launcher-vm1-") and len(pod["metadata"]["name"]) == 23
    assert pod["metadata"]["labels"]["vm.kubevirt.io/name"] == "vm"
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Running"
    assert pod["spec"]["containers"][0]["resources"]["limits"][VF] == "1"
    assert vm["status"]["printableStatus"] == "Running" and vm["status"]["ready"] is True
    assert vm["metadata"]["finalizers"] == [VM_CONTROLLER_FINALIZER]
    assert new_world.events("vm1") == [
        ("SuccessfulCreate", "Started the virtual machine by creating the new virtual machine instance vm1")]
    [event] = [e for e in new_world.cluster.list("v1", "Event", "default") if e["reason"] == "SuccessfulCreate"]
    assert event["source"] == {"component": "virtualmachine-controller"}
    assert event["reportingComponent"] == "virtualmachine-controller"


def test_a_taken_device_blocks_scheduling_until_its_holder_powers_off(world):
    """The seed: vm2 took vm1's VF while vm1 was off; vm1 cannot start until vm2 lets go."""
    world.create_vm("vm2", "RerunOnFailure", host_devices=[SEED_HOST_DEVICE])
    assert world.phase("vm2") == "Running"
    world.create_vm("vm1", "Always", host_devices=[SEED_HOST_DEVICE])
    vmi = world.vmi("vm1")
    assert vmi_phase(vmi) == "Scheduling"
    assert condition_of(vmi, "PodScheduled") == {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": f"0/1 nodes are available: 1 Insufficient {VF}. preemption: 0/1 nodes are available: "
                   f"1 {NO_VICTIMS}.",
        "lastTransitionTime": condition_of(vmi, "PodScheduled")["lastTransitionTime"]}
    assert world.vm("vm1")["status"]["printableStatus"] == "ErrorUnschedulable"
    [pod] = world.pods(vmi["metadata"]["uid"])
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")

    world.kubevirt.guest_power_off("default", "vm2")
    world.kubevirt.wait_idle()
    assert world.phase("vm1") == "Running"
    assert condition_of(world.vmi("vm1"), "PodScheduled") is None
    assert world.vm("vm1")["status"]["printableStatus"] == "Running"


def test_seed_old_kubevirt_deleting_vm1s_leftover_boots_it_into_an_unschedulable_vmi(old_world):
    """On 1.1.1 deleting a RerunOnFailure VM's Succeeded VMI restarts it: here it can no longer run."""
    first = start_and_power_off(old_world, "vm1", "RerunOnFailure", host_devices=[SEED_HOST_DEVICE])
    assert outcome(old_world, "vm1", first) == "left Succeeded"
    old_world.create_vm("vm2", "RerunOnFailure", host_devices=[SEED_HOST_DEVICE])
    assert old_world.phase("vm2") == "Running"  # the Completed launcher pod holds no device
    old_world.delete_vmi("vm1")
    assert old_world.phase("vm1") == "Scheduling"
    assert old_world.vm("vm1")["status"]["printableStatus"] == "ErrorUnschedulable"


def test_manual_start_and_stop_subresources(world):
    world.create_vm("vm1", "Manual")
    assert world.vmi("vm1") is None and world.vm("vm1")["status"]["printableStatus"] == "Stopped"
    world.lifecycle("vm1", "start")
    first = world.uid("vm1")
    assert world.phase("vm1") == "Running"
    assert "stateChangeRequests" not in world.vm("vm1")["status"]
    world.lifecycle("vm1", "stop")
    assert world.vmi("vm1") is None and world.pods(first) == []
    assert "stateChangeRequests" not in world.vm("vm1")["status"]
    assert world.vm("vm1")["status"]["printableStatus"] == "Stopped"
    # A guest that powered off leaves its VMI; start replaces it (the server asks Stop uid + Start).
    world.lifecycle("vm1", "start")
    second = world.uid("vm1")
    world.kubevirt.guest_power_off("default", "vm1")
    world.kubevirt.wait_idle()
    assert outcome(world, "vm1", second) == "left Succeeded"
    world.lifecycle("vm1", "start")
    assert outcome(world, "vm1", second) == "replaced, new VMI Running"
    assert "stateChangeRequests" not in world.vm("vm1")["status"]


def test_deleting_a_vm_stops_its_vmi_and_releases_everything(new_world):
    new_world.create_vm("vm1", "Always")
    first = new_world.uid("vm1")
    new_world.cluster.delete(VM_API, VM_KIND, "default", "vm1")
    new_world.kubevirt.wait_idle()
    assert new_world.vm("vm1") is None and new_world.vmi("vm1") is None and new_world.pods(first) == []


def test_set_phase_time_ages_a_succeeded_vmi(new_world):
    first = start_and_power_off(new_world, "vm1", "Once")
    long_ago = datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC)
    new_world.kubevirt.set_phase_time("default", "vm1", "Succeeded", long_ago)
    stamps = new_world.vmi("vm1")["status"]["phaseTransitionTimestamps"]
    assert {"phase": "Succeeded", "phaseTransitionTimestamp": "2026-01-02T03:04:05Z"} in stamps
    assert new_world.uid("vm1") == first


def test_guest_actions_need_a_running_vmi(new_world):
    with pytest.raises(LookupError, match="does not exist"):
        new_world.kubevirt.guest_power_off("default", "nope")
    first = start_and_power_off(new_world, "vm1", "Once")
    with pytest.raises(RuntimeError, match="not Running"):
        new_world.kubevirt.guest_crash("default", "vm1")
    assert new_world.uid("vm1") == first


def test_api_faults_are_retried_until_the_cluster_converges(new_world):
    new_world.cluster.faults.add(path="/virtualmachineinstances", status=503, times=5)
    new_world.cluster.faults.add(method="PATCH", path="/virtualmachines/", status=500, times=3)
    new_world.cluster.faults.add(path="/pods", kind="drop", times=2)
    new_world.create_vm("vm1", "Always")
    assert new_world.phase("vm1") == "Running"
    assert new_world.vm("vm1")["status"]["printableStatus"] == "Running"

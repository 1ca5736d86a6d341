"""Where the simulated KubeVirt and KubeVirt's own virt-controller must agree, asked of both.

Each case runs on the simulator (simcluster.kubevirt.sim.KubeVirtSim plays every controller) and on the real
control plane, where virt-controller built from kubevirt.io/kubevirt at that version decides and KubeVirtSim is
only the node stand-in (scheduler, kubelet, virt-handler). The cases are the rows of vmi-cleanup's decision
table (docs/facts.md §2): per version and run strategy, what follows a guest power-off (VMI Succeeded), a
crash (Failed), the deletion of a final VMI (what vmi-cleanup does) and a start or stop request; then the
launcher pod's device requests and an unschedulable VMI, and (real backend only: the simulator has no migration
controller) a live migration driven by KubeVirt's migration controller. One expectation per case, the same on
both backends: where they disagreed, KubeVirt was right and the simulator was fixed (docs/control-plane.md).
"""
from __future__ import annotations

import itertools
import time

import pytest

from simcluster.builders.devices import SEED_DEVICE, VF, host_device
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.play import virtctl_start
from tests import backends
from tests.e2e import eventually, kubevirt_versions

pytestmark = pytest.mark.e2e
NODE, OTHER_NODE = "harvester-node-0", "harvester-node-1"
_names = itertools.count(1)
KUBEVIRT = "kubevirt.io/v1"
# How long a case watches for KubeVirt to start a VMI it must not start (the VM controller acts within
# milliseconds of the change it reacts to; the rest is margin for a loaded machine).
HOLD = 2.0


class World:
    def __init__(self, version: str, backend: str):
        self.version, self.backend = version, backend
        self.made: list[str] = []
        self.cluster = backends.cluster(backend, version)
        try:
            self.kubevirt = KubeVirtSim(self.cluster, step_delay=0.01, nodes={NODE: {VF: 1}, OTHER_NODE: {}}).start()
        except BaseException:
            self.cluster.stop()
            raise

    def stop(self):
        self.kubevirt.stop()
        self.cluster.stop()

    @property
    def new(self) -> bool:
        """KubeVirt ≥ 1.2: RerunOnFailure deletes a final VMI itself (docs/facts.md §2)."""
        return tuple(int(p) for p in self.version.split(".")[:2]) >= (1, 2)

    def vm(self, strategy: str, *, devices: list | None = None, start: bool = True) -> str:
        name = f"fid{next(_names)}"
        self.made.append(name)
        domain: dict = {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}
        if devices:
            domain["devices"]["hostDevices"] = devices
        self.cluster.create({"apiVersion": KUBEVIRT, "kind": "VirtualMachine",
                             "metadata": {"name": name, "namespace": "default"},
                             "spec": {"runStrategy": strategy, "template": {"spec": {"domain": domain}}}})
        if strategy == "Manual" and start:
            eventually(lambda: self.get_vm(name).get("status", {}).get("printableStatus") == "Stopped",
                       what=f"VM {name} Stopped", timeout=30)
            virtctl_start(self.cluster, "default", name)
        return name

    def get_vm(self, name: str) -> dict:
        return self.cluster.get(KUBEVIRT, "VirtualMachine", "default", name) or {}

    def vmi(self, name: str) -> dict | None:
        return self.cluster.get(KUBEVIRT, "VirtualMachineInstance", "default", name)

    def running(self, name: str) -> str:
        """Wait for the VM's VMI to run; answers its uid."""
        vmi = eventually(lambda: (v := self.vmi(name)) and v.get("status", {}).get("phase") == "Running" and v,
                         what=f"VMI {name} Running", timeout=30)
        return vmi["metadata"]["uid"]

    def outcome(self, name: str, uid: str) -> str:
        """What became of VMI `uid` once KubeVirt is done: kept (same VMI, final), deleted (none),
        restarted (another VMI of the VM)."""
        self.kubevirt.wait_idle(timeout=30)
        time.sleep(HOLD)
        self.kubevirt.wait_idle(timeout=30)
        vmi = self.vmi(name)
        if vmi is None:
            return "deleted"
        return "kept" if vmi["metadata"]["uid"] == uid else "restarted"

    def launcher_pods(self, vmi: dict) -> list[dict]:
        uid = vmi["metadata"]["uid"]
        return self.cluster.list("v1", "Pod", "default", label_selector=f"kubevirt.io/created-by={uid}")


@pytest.fixture(scope="module", **kubevirt_versions("1.1.1", "1.3.1", "1.8.3"))
def module_world(request):
    w = World(*request.param)
    yield w
    w.stop()


@pytest.fixture
def world(module_world):
    """The module's world; the VMs a test made are deleted after it (KubeVirt removes their VMIs)."""
    yield module_world
    for name in module_world.made:
        module_world.cluster.delete(KUBEVIRT, "VirtualMachine", "default", name)
    module_world.made.clear()


# -- a guest power-off and a crash, per run strategy ---------------------------------------------------------
POWER_OFF = {"Always": "restarted", "Manual": "kept", "Once": "kept"}
CRASH = {"Always": "restarted", "RerunOnFailure": "restarted", "Manual": "kept", "Once": "kept"}


@pytest.mark.parametrize("strategy", ["Always", "RerunOnFailure", "Manual", "Once"])
def test_guest_power_off(world, strategy):
    name = world.vm(strategy)
    uid = world.running(name)
    world.kubevirt.guest_power_off("default", name)
    want = POWER_OFF.get(strategy) or ("deleted" if world.new else "kept")
    got = world.outcome(name, uid)
    assert got == want, f"{strategy} on KubeVirt {world.version}: a power-off left the VMI {got}, not {want}"
    vm = world.get_vm(name)
    if got != "restarted":
        assert vm["status"].get("printableStatus") == "Stopped"
        assert not vm["status"].get("ready")
    if got == "kept":
        vmi = world.vmi(name)
        assert vmi["status"]["phase"] == "Succeeded"
        # The VM controller lets go of a final VMI (its finalizer goes), the VMI controller keeps its own
        # while the launcher pod (Completed) is there.
        assert "kubevirt.io/virtualMachineControllerFinalize" not in (vmi["metadata"].get("finalizers") or [])
        # Every container of its launcher pod ended Completed, not compute alone (KubeVirt's pod also runs
        # guest-console-log): what the real node writes (docs/facts.md §9), `0/N Completed` in kubectl.
        (pod,) = world.launcher_pods(vmi)
        assert pod["status"]["phase"] == "Succeeded"
        ended = {c["name"]: (c["state"].get("terminated") or {}).get("reason")
                 for c in pod["status"]["containerStatuses"]}
        assert ended == {c["name"]: "Completed" for c in pod["spec"]["containers"]}


@pytest.mark.parametrize("strategy", ["Always", "RerunOnFailure", "Manual", "Once"])
def test_guest_crash(world, strategy):
    name = world.vm(strategy)
    uid = world.running(name)
    world.kubevirt.guest_crash("default", name)
    got = world.outcome(name, uid)
    assert got == CRASH[strategy], f"{strategy} on KubeVirt {world.version}: a crash left the VMI {got}"


# -- deleting a final VMI: what vmi-cleanup does (and why it halts some VMs instead) --------------------------
AFTER_DELETE = {"Manual": "deleted", "Once": "restarted"}


@pytest.mark.parametrize("strategy", ["Manual", "Once", "RerunOnFailure"])
def test_deleting_a_succeeded_vmi(world, strategy):
    if strategy == "RerunOnFailure" and world.new:
        pytest.skip("KubeVirt >= 1.2 deletes a Succeeded RerunOnFailure VMI itself (test_guest_power_off)")
    name = world.vm(strategy)
    uid = world.running(name)
    world.kubevirt.guest_power_off("default", name)
    assert world.outcome(name, uid) == "kept"
    world.cluster.delete(KUBEVIRT, "VirtualMachineInstance", "default", name, uid=uid)
    eventually(lambda: (v := world.vmi(name)) is None or v["metadata"]["uid"] != uid, what="the VMI gone",
               timeout=30)
    want = AFTER_DELETE.get(strategy, "restarted")  # RerunOnFailure < 1.2: a new guest boots
    got = world.outcome(name, uid)
    assert got == want, f"{strategy} on KubeVirt {world.version}: deleting the Succeeded VMI: {got}, not {want}"


def test_halting_a_vm_removes_its_succeeded_vmi(world):
    name = world.vm("Once")
    uid = world.running(name)
    world.kubevirt.guest_power_off("default", name)
    assert world.outcome(name, uid) == "kept"
    world.cluster.patch(KUBEVIRT, "VirtualMachine", "default", name, {"spec": {"runStrategy": "Halted"}})
    eventually(lambda: world.vmi(name) is None, what="KubeVirt deletes the VMI of a halted VM", timeout=30)
    assert world.outcome(name, uid) == "deleted"


# -- start and stop requests -------------------------------------------------------------------------------
def test_starting_a_manual_vm_whose_guest_powered_off_boots_a_new_vmi(world):
    name = world.vm("Manual")
    uid = world.running(name)
    world.kubevirt.guest_power_off("default", name)
    assert world.outcome(name, uid) == "kept"
    virtctl_start(world.cluster, "default", name)
    new = eventually(lambda: (v := world.vmi(name)) and v["metadata"]["uid"] != uid and v, what="a new VMI",
                     timeout=30)
    assert new["metadata"]["uid"] != uid
    world.running(name)


def test_a_manual_vm_is_not_started_without_a_request(world):
    name = world.vm("Manual", start=False)
    world.kubevirt.wait_idle(timeout=30)
    time.sleep(HOLD)
    assert world.vmi(name) is None
    vm = world.get_vm(name)
    assert vm["status"]["printableStatus"] == "Stopped"
    assert "kubevirt.io/virtualMachineControllerFinalize" in vm["metadata"]["finalizers"]


def test_status_run_strategy_is_recorded_from_1_3(world):
    name = world.vm("Always")
    world.running(name)
    # The VM's status is virt-controller's own write after the VMI's (vm.go updateStatus): wait for the one that says
    # the VM runs, which is where status.runStrategy is first synced (when status.created).
    vm = eventually(lambda: (v := world.get_vm(name)) and (v.get("status") or {}).get("printableStatus") == "Running"
                    and v, what=f"VM {name} printableStatus Running", timeout=30)
    recorded = vm["status"].get("runStrategy")
    assert recorded == ("Always" if tuple(int(p) for p in world.version.split(".")[:2]) >= (1, 3) else None)


# -- the launcher pod's device requests, and a VMI that cannot be scheduled --------------------------------
def test_launcher_pod_requests_the_host_devices_and_the_second_vm_cannot_schedule(world):
    first = world.vm("Always", devices=[host_device(SEED_DEVICE, VF)])
    world.running(first)
    vmi = world.vmi(first)
    pods = world.launcher_pods(vmi)
    assert len(pods) == 1
    compute = next(c for c in pods[0]["spec"]["containers"] if c["name"] == "compute")
    assert compute["resources"]["requests"][VF] == "1" and compute["resources"]["limits"][VF] == "1"
    assert pods[0]["spec"]["nodeName"] == NODE and vmi["status"]["nodeName"] == NODE
    second = world.vm("Always", devices=[host_device(SEED_DEVICE, VF)])
    blocked = eventually(
        lambda: (v := world.vmi(second)) and [c for c in v.get("status", {}).get("conditions") or []
                                               if c["type"] == "PodScheduled" and c["status"] == "False"],
        what="the second VMI unschedulable", timeout=30)
    assert blocked[0]["reason"] == "Unschedulable"
    assert f"Insufficient {VF}" in blocked[0]["message"]
    assert world.vmi(second)["status"]["phase"] == "Scheduling"


# -- a live migration: KubeVirt's migration controller, the node stand-in's source and target ---------------
PHASES = ["Pending", "Scheduling", "Scheduled", "PreparingTarget", "TargetReady", "Running", "Succeeded"]


def test_a_live_migration_moves_the_vmi_to_another_node(world):
    if world.backend == backends.SIM:
        pytest.skip("the simulator has no migration controller (docs/control-plane.md: left to do)")
    name = world.vm("Always")
    world.running(name)
    source = world.vmi(name)["status"]["nodeName"]
    world.cluster.create({"apiVersion": KUBEVIRT, "kind": "VirtualMachineInstanceMigration",
                          "metadata": {"name": f"{name}-mig", "namespace": "default"}, "spec": {"vmiName": name}})
    vmim = eventually(lambda: (m := world.cluster.get(KUBEVIRT, "VirtualMachineInstanceMigration", "default",
                                                        f"{name}-mig"))
                      and (m.get("status") or {}).get("phase") in ("Succeeded", "Failed") and m,
                      what="the migration ended", timeout=60)
    assert vmim["status"]["phase"] == "Succeeded", vmim["status"]
    seen = [t["phase"] for t in vmim["status"].get("phaseTransitionTimestamps") or []]
    assert [p for p in PHASES if p in seen] == seen, seen  # in KubeVirt's order, none repeated
    vmi = world.vmi(name)
    assert vmi["status"]["phase"] == "Running" and vmi["status"]["nodeName"] not in ("", source)
    assert vmi["status"]["migrationState"]["completed"] is True
    targets = [p for p in world.launcher_pods(vmi)
               if p["metadata"]["labels"].get("kubevirt.io/migrationJobUID") == vmim["metadata"]["uid"]]
    assert len(targets) == 1 and targets[0]["spec"]["nodeName"] == vmi["status"]["nodeName"]

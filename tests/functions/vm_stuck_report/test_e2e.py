"""vm-stuck-report end to end, on both backends: the API server (simulated, or a real kube-apiserver), KubeVirt
writing each VM's printableStatus and conditions (the simulated one; on the real backend KubeVirt's own
virt-controller, with the node stand-in playing the scheduler, the kubelet and virt-handler), the local broker
routing by the Trigger in deploy/, the PingSource, and the function as a real functions-framework server with the
credentials of its own ServiceAccount.

Each test sets a cause up through the cluster's objects — Nodes, PVCs, StorageClasses, PVs, Longhorn volumes,
ResourceQuotas, an image the kubelet cannot pull — lets KubeVirt's part (and the scheduler's and the kubelet's
stand-ins) put the VM in the state KubeVirt names, waits past the threshold, and checks the report's cause, evidence
and next step, one `.detected` over several ticks, then removes the cause and checks one `.resolved`. The tests
rely only on the status words KubeVirt writes. The simulated KubeVirt does not model migration: on the simulator
the migration tests play its migration controller's part (the VMIM, its condition and the VMI's FailedCreate Event,
as migration.go writes them); on the real backend KubeVirt's migration controller runs the VMIM, and a
ResourceQuota (kube-apiserver's ResourceQuota admission, kube-controller-manager's resourcequota controller) refuses
its target pod for real.
"""
from __future__ import annotations

import itertools
import json
import re
import time
from datetime import UTC, datetime

import pytest

from simcluster.builders import stuck as b
from tests import e2e
from tests.e2e import backends_only, eventually
from tests.functions.vm_stuck_report.test_written import DATAVOLUME_GRANT
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION = "vm-stuck-report"
FUNCTION_SA = "vmevents/vm-stuck-report"
AFTER = 2.0  # VM_STUCK_AFTER in these tests, seconds
GPU = "nvidia.com/NVIDIA_L40S-8Q"
BASE = "stuck-base"  # the node stand-in's own node on the real backend, off while a test brings its own
_names = itertools.count(1)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    function_sa = FUNCTION_SA

    def __init__(self, version: str, backend: str):
        # On the real backend KubeVirt's virt-controller writes every status; the causes are set up through the
        # node stand-in's scheduler (Node objects), kubelet (images, volume attach) and virt-handler (NotReady).
        super().__init__(version, backend=backend,
                         kubevirt={"step_delay": 0.01, "volumes": True, "nodes": {BASE: {}}},
                         env_overrides={FUNCTION: {"VM_STUCK_AFTER": f"{AFTER:.0f}s"}})

    @property
    def real(self) -> bool:
        return self.kubevirt.node_only

    # -- set-up --------------------------------------------------------------------------------
    def create_vm(self, **kw) -> str:
        name = f"stuck{next(_names)}"
        obj = b.vm(name, status=None, **kw)
        obj["metadata"] = {"name": name, "namespace": "default"}
        obj.pop("status")
        self.cluster.create(obj)
        return name

    def vm(self, name):
        return self.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)

    def status(self, name):
        return ((self.vm(name) or {}).get("status") or {}).get("printableStatus")

    def wait_status(self, name, *wanted):
        return eventually(lambda: self.status(name) in wanted, timeout=20, what=f"VM {name} {'/'.join(wanted)}")

    def halt(self, name):
        self.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name, {"spec": {"runStrategy": "Halted"}})

    def node_status(self, name, patch):
        self.cluster.patch("v1", "Node", None, name, {"status": patch}, subresource="status")

    # -- looking -------------------------------------------------------------------------------
    def notices(self, name, state="detected"):
        """The finding data of every notice in that state about VM `name`, alone or in a re-scan's summary."""
        found = []
        for event in list(self.knative.broker.received):
            if event["source"] != f"/vmevents/{FUNCTION}":
                continue
            data = e2e.data_of(event)
            for item in data.get("findings", [data]):
                if item.get("details", {}).get("vm") == f"default/{name}" and item.get("state") == state:
                    found.append(item)
        return found

    def events(self, name):
        return [e for e in self.cluster.list("v1", "Event", "default")
                if (e.get("source") or {}).get("component") == FUNCTION and e["involvedObject"]["name"] == name]

    def finding(self, name):
        """The finding on record about VM `name`, as its Event holds it now (docs/findings.md)."""
        [event] = [e for e in self.events(name) if "vmevents.io/finding" in (e["metadata"].get("annotations") or {})]
        return json.loads(event["metadata"]["annotations"]["vmevents.io/finding"])

    def reported(self, name):
        """Past the threshold, ticks until the one `.detected` notice; then two more ticks announce nothing."""
        time.sleep(AFTER + 1)
        for _ in range(20):
            self.tick()
            if self.notices(name):
                break
        [notice] = eventually(lambda: self.notices(name), what=f"a .detected notice about {name}")
        self.tick()
        self.tick()
        assert len(self.notices(name)) == 1, "a stuck VM is announced once per episode"
        [event] = self.events(name)
        assert event["reason"] == "VMStuck" and event["type"] == "Warning"
        return notice

    def resolved(self, name):
        """Ticks until the one `.resolved` notice; a further tick announces nothing."""
        for _ in range(20):
            self.tick()
            if self.notices(name, "resolved"):
                break
        [notice] = eventually(lambda: self.notices(name, "resolved"), what=f"a .resolved notice about {name}")
        self.tick()
        assert len(self.notices(name, "resolved")) == 1 and len(self.notices(name)) == 1, \
            [(n["details"]["state"], n["details"]["instance"], n["key"], n.get("episode")) for n in self.notices(name)]
        # kubectl describe vm: the episode as it was reported, and its end in a row of its own (issue 34: the
        # finding's Event turned "Normal VMStuck")
        stuck, end = sorted(self.events(name), key=lambda e: e["reason"])
        assert (stuck["reason"], stuck["type"]) == ("VMStuck", "Warning")
        assert (end["reason"], end["type"], end["count"]) == ("VMStuckResolved", "Normal", 1)
        assert end["message"] == notice["summary"]
        return notice


@pytest.fixture(scope="module", **backends_only())
def world(request):
    with World(*request.param) as w:
        yield w


@pytest.fixture
def nodes(world):
    """Node objects for a test (the scheduler stand-in places on them), removed after it. On the real backend the
    stand-in's own node is deleted meanwhile (its VMs' pods stay, as on a node whose kubelet is gone), so the
    scheduler sees the test's nodes alone, and registered again after."""
    made: list[str] = []

    def make(*objs):
        if world.real and world.cluster.get("v1", "Node", None, BASE) is not None:
            world.cluster.delete("v1", "Node", None, BASE)
        for obj in objs:
            world.cluster.create(obj)
            made.append(obj["metadata"]["name"])
            # kube-apiserver's TaintNodesByCondition gave it node.kubernetes.io/not-ready; the node lifecycle
            # controller (not running here) removes it from a Ready node: the test plays it
            world.cluster.patch("v1", "Node", None, obj["metadata"]["name"],
                                {"spec": {"taints": (obj.get("spec") or {}).get("taints") or None}})

    yield make
    for name in made:
        world.cluster.delete("v1", "Node", None, name)
    if world.real:
        world.kubevirt.register_nodes()


def _check(notice, state, cause, evidence, step):
    d = notice["details"]
    assert state in (d["state"], d["group"]), d
    assert d["cause"] == cause, (d["cause"], d["evidence"], d["checked"])
    assert any(evidence in e for e in d["evidence"]), d["evidence"]
    assert step.lower() in d["nextStep"].lower(), d["nextStep"]
    assert notice["advice"] == [d["nextStep"]] and notice["category"] == f"stuck-{d['group']}"


# -- starting ---------------------------------------------------------------------------------------
@pytest.mark.node
def test_insufficient_memory(world, nodes):
    nodes(b.node("mem-a", allocatable={"cpu": "8", "memory": "4Gi", "pods": "110"}))
    name = world.create_vm(memory="16Gi")
    world.wait_status(name, "ErrorUnschedulable")
    notice = world.reported(name)
    _check(notice, "ErrorUnschedulable", "insufficient-resources", "1 Insufficient memory", "lower the VM's request")
    # the scheduler's Event, read: kube-scheduler counts its tries in series.count (docs/facts.md §7)
    [failed] = [e for e in world.cluster.list("v1", "Event", "default") if e["reason"] == "FailedScheduling"
                and e["involvedObject"]["name"].startswith(f"virt-launcher-{name}-")]
    assert failed.get("series") and not failed.get("count"), failed
    assert any(re.search(r"FailedScheduling ×([2-9]|\d\d+): ", e) for e in notice["details"]["evidence"]), \
        notice["details"]["evidence"]  # its tries, not ×1
    world.node_status("mem-a", {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}})
    world.wait_status(name, "Running")
    assert "Running" in world.resolved(name)["details"]["because"]


@pytest.mark.node
def test_a_device_only_one_node_has(world, nodes):
    nodes(b.node("gpu-a"), b.node("gpu-b", allocatable={"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "1"}))
    name = world.create_vm(devices=(GPU, GPU))
    world.wait_status(name, "ErrorUnschedulable")
    notice = world.reported(name)
    _check(notice, "ErrorUnschedulable", "device-on-one-node", "only node gpu-b of 2 has any", "Only node gpu-b has")
    world.halt(name)
    world.wait_status(name, "Stopped")
    world.resolved(name)


@pytest.mark.node
def test_a_node_selector_no_node_matches(world, nodes):
    nodes(b.node("sel-a"))
    name = world.create_vm(node_selector={"disktype": "nvme"})
    world.wait_status(name, "ErrorUnschedulable")
    _check(world.reported(name), "ErrorUnschedulable", "node-placement", "didn't match Pod's node affinity/selector",
           "nodeSelector")
    world.cluster.patch("v1", "Node", None, "sel-a", {"metadata": {"labels": {"disktype": "nvme"}}})
    world.wait_status(name, "Running")
    world.resolved(name)


@pytest.mark.node
def test_a_taint_the_vm_does_not_tolerate(world, nodes):
    nodes(b.node("taint-a", taints=({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},)))
    name = world.create_vm()
    world.wait_status(name, "ErrorUnschedulable")
    _check(world.reported(name), "ErrorUnschedulable", "node-placement", "untolerated taint {dedicated: gpu}",
           "toleration")
    world.cluster.patch("v1", "Node", None, "taint-a", {"spec": {"taints": None}})
    world.wait_status(name, "Running")
    world.resolved(name)


@pytest.mark.node
def test_every_node_that_fits_is_cordoned(world, nodes):
    nodes(b.node("cordon-a", unschedulable=True))
    name = world.create_vm()
    world.wait_status(name, "ErrorUnschedulable")
    _check(world.reported(name), "ErrorUnschedulable", "node-unschedulable", "1 node(s) were unschedulable",
           "uncordon")
    world.cluster.patch("v1", "Node", None, "cordon-a", {"spec": {"unschedulable": None}})
    world.wait_status(name, "Running")
    world.resolved(name)


def test_a_start_blocked_by_a_device_another_vm_holds_is_device_conflicts_finding(world, nodes):
    resource = "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"
    nodes(b.node("vf-a", allocatable={"cpu": "8", "memory": "32Gi", "pods": "110", resource: "1"}))
    holder = world.create_vm(devices=(resource,))
    world.wait_status(holder, "Running")
    blocked = world.create_vm(devices=(resource,))  # names the same host device (dev0)
    world.wait_status(blocked, "ErrorUnschedulable")
    time.sleep(AFTER + 1)
    for _ in range(3):
        world.tick()
    conflict = eventually(lambda: [e for e in world.cluster.list("v1", "Event", "default")
                                   if (e.get("source") or {}).get("component") == "device-conflict"
                                   and e["involvedObject"]["name"] == blocked], what="device-conflict's finding")
    assert conflict and not world.notices(blocked) and not world.events(blocked)
    world.halt(blocked)
    world.halt(holder)
    world.wait_status(blocked, "Stopped")


def test_a_pvc_that_does_not_exist(world):
    name = world.create_vm(claims=("missing-disk",))
    world.wait_status(name, "ErrorPvcNotFound")
    notice = world.reported(name)
    _check(notice, "ErrorPvcNotFound", "volume-missing", "PVC missing-disk, which does not exist",
           "Create PVC missing-disk")
    assert any("FailedPvcNotFound" in e for e in notice["details"]["evidence"])  # KubeVirt's own Event, read
    world.cluster.create(b.pvc("missing-disk", phase="Bound", volume="pv-missing-disk"))
    world.wait_status(name, "Running")
    world.resolved(name)


def test_a_pvc_whose_storage_class_does_not_exist(world):
    world.cluster.create(b.pvc("unbound-disk", storage_class="fast-nvme"))
    name = world.create_vm(claims=("unbound-disk",))
    world.wait_status(name, "ErrorUnschedulable")
    # KubeVirt prints WaitingForVolumeBinding until the scheduler's condition says Unschedulable: on a loaded machine
    # the first report may come under either word, both the starting group's
    _check(world.reported(name), "starting", "volume-unbound", "StorageClass fast-nvme does not exist",
           "Create StorageClass fast-nvme")
    world.cluster.patch("v1", "PersistentVolumeClaim", "default", "unbound-disk", {"status": {"phase": "Bound"}},
                        subresource="status")
    world.wait_status(name, "Running")
    world.resolved(name)


def test_a_pvc_its_provisioner_never_binds(world):
    world.cluster.create(b.storage_class("slow-nfs", provisioner="nfs.csi.k8s.io"))
    world.cluster.create(b.pvc("nfs-disk", storage_class="slow-nfs"))
    name = world.create_vm(claims=("nfs-disk",))
    world.wait_status(name, "ErrorUnschedulable")
    _check(world.reported(name), "starting", "volume-unbound", "provisioner nfs.csi.k8s.io",  # either word, as above
           "Check provisioner nfs.csi.k8s.io")
    world.halt(name)
    world.wait_status(name, "Stopped")
    world.resolved(name)


def test_a_faulted_longhorn_volume_fails_the_attach(world):
    world.cluster.create(b.pvc("lh-disk", phase="Bound", volume="pvc-lh-disk"))
    world.cluster.create(b.pv("pvc-lh-disk", "pvc-lh-disk", "lh-disk"))
    world.cluster.create(b.longhorn_volume("pvc-lh-disk", state="detached", robustness="faulted"))
    name = world.create_vm(claims=("lh-disk",))
    world.wait_status(name, "Starting")
    world.reported(name)
    # KubeVirt prints Starting before the attach is tried: on a loaded machine the first report can precede the
    # attach/detach controller's FailedAttachVolume (cause unknown). The finding's cause then changes, its details
    # with it (no second notice): read them from its Event once a tick has seen the attach fail.
    notice = eventually(lambda: (world.tick(), world.finding(name))[1]["details"]["cause"] == "volume-attach"
                        and world.finding(name), timeout=60, what="the finding's cause volume-attach")
    _check(notice, "Starting", "volume-attach", "FailedAttachVolume", "Salvage")
    assert any("Longhorn volume pvc-lh-disk: state detached, robustness faulted" in e
               for e in notice["details"]["evidence"])
    world.cluster.patch("longhorn.io/v1beta2", "Volume", b.LONGHORN_NS, "pvc-lh-disk",
                        {"status": {"robustness": "healthy", "state": "attached"}}, subresource="status")
    world.wait_status(name, "Running")
    world.resolved(name)


@pytest.mark.node
def test_an_image_the_kubelet_cannot_pull(world):
    """KubeVirt pulls a containerDisk's image in the launcher's init container `volumecontainerdisk-init`; the kubelet
    leaves it waiting ErrImagePull (the containers after it PodInitializing) and records Failed on the pod; KubeVirt's
    VMI controller copies it to the VMI's Synchronized condition and prints ErrImagePull (docs/facts.md §7)."""
    image = "registry.example.invalid/vms/fedora:41"
    name = world.create_vm(image=image)
    world.wait_status(name, "ErrImagePull", "ImagePullBackOff")
    world.reported(name)
    # On a loaded machine the first report can come while the VM still reads Starting, before the kubelet's statuses
    # (cause unknown); the finding's cause and details follow (no second notice): read them as on record.
    notice = eventually(lambda: (world.tick(), world.finding(name))[1]["details"]["cause"] == "image-pull"
                        and world.finding(name), timeout=60, what="the finding's cause image-pull")
    _check(notice, "starting", "image-pull", "waits: ErrImagePull", f"cannot pull image {image}")
    evidence = "\n".join(notice["details"]["evidence"])
    assert f"init container volumecontainerdisk-init (image {image}) waits: ErrImagePull" in evidence, evidence
    assert f"VirtualMachineInstance/{name}: Synchronized=False (ErrImagePull)" in evidence, evidence
    assert f'Failed ×1: Failed to pull image "{image}"' in evidence, evidence  # the kubelet's Event
    assert "containerDisk volume containerdisk" in notice["details"]["nextStep"]
    world.halt(name)
    world.wait_status(name, "Stopped")
    world.resolved(name)


# -- stopping ---------------------------------------------------------------------------------------
def test_a_stop_its_node_never_completes_is_left_to_evacuation_report(world, nodes):
    """The VM stays Stopping: its node stopped answering and nothing there shuts the guest down. That is one of the
    dead node's VMs, which evacuation-report speaks for (docs/evacuation-report.md, who speaks for what): past its
    threshold, tick after tick, vm-stuck-report announces nothing, and the VM stops once the node is back."""
    nodes(b.node("down-a"))
    name = world.create_vm()
    world.wait_status(name, "Running")
    world.node_status("down-a", {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                                 "lastHeartbeatTime": b.stamp(b.NOW),
                                                 "lastTransitionTime": b.stamp(b.NOW)}]})
    world.halt(name)
    world.wait_status(name, "Stopping")
    time.sleep(AFTER + 1)
    for _ in range(3):
        world.tick()
    assert world.notices(name) == [] and world.events(name) == []
    world.node_status("down-a", {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                 "lastHeartbeatTime": b.stamp(b.NOW),
                                                 "lastTransitionTime": b.stamp(b.NOW)}]})
    world.wait_status(name, "Stopped")


# -- migrations that do not start: the test plays KubeVirt's migration controller -------------------
def _migrate(world, name, **kw):
    vmi = eventually(lambda: (v := world.vmi(name)) and (v.get("status") or {}).get("phase") == "Running" and v,
                     what=f"VMI {name} Running")
    obj = b.vmim(vmi, name=f"{name}-mig", **kw)
    obj["metadata"] = {"name": obj["metadata"]["name"], "namespace": "default"}  # the server names the rest
    if world.real:
        obj.pop("status")  # KubeVirt's migration controller writes it
    return vmi, world.cluster.create(obj)


@pytest.mark.node
def test_a_migration_a_resource_quota_has_no_room_for(world):
    name = world.create_vm(memory="2Gi")
    world.wait_status(name, "Running")
    if world.real:  # the quota refuses KubeVirt's target pod for real: virt-controller's FailedCreate Event
        vmi, vmim, evidence = _quota_refuses_the_target_pod(world, name)
    else:
        world.cluster.create(b.quota("vm-quota", hard={"requests.memory": "4Gi"}, used={"requests.memory": "3Gi"}))
        vmi, vmim = _migrate(world, name, rejected_by_quota=True)
        world.cluster.create(b.event(vmi, "FailedCreate", f'Error creating pod: pods "virt-launcher-{name}-x" is '
                                     f'forbidden: exceeded quota: vm-quota, requested: requests.memory=2200Mi, used: '
                                     f'requests.memory=3Gi, limited: requests.memory=4Gi',
                                     component="virtualmachine-controller",
                                     when=datetime.now(UTC)))
        evidence = "ResourceQuota vm-quota: requests.memory used 3Gi of 4Gi"
    notice = world.reported(name)
    _check(notice, "MigrationPending", "quota-exceeded", evidence, "`kubectl -n default edit resourcequota vm-quota`")
    assert notice["details"]["migration"] == vmim["metadata"]["name"]
    world.cluster.delete("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default", vmim["metadata"]["name"])
    assert "no longer exists" in world.resolved(name)["details"]["because"]
    world.cluster.delete("v1", "ResourceQuota", "default", "vm-quota")


def _quota_refuses_the_target_pod(world, name):
    """A ResourceQuota with room for what runs in the namespace now and half a launcher more; then a VMIM, whose
    target pod kube-apiserver refuses (403 exceeded quota), which KubeVirt's migration controller records."""
    [pod] = [p for p in world.cluster.list("v1", "Pod", "default", label_selector="kubevirt.io=virt-launcher")
             if (p["metadata"].get("labels") or {}).get("vm.kubevirt.io/name") == name]
    launcher = sum(b.mebibytes(c["resources"]["requests"]["memory"]) for c in pod["spec"]["containers"]
                   if (c.get("resources") or {}).get("requests", {}).get("memory"))
    world.cluster.create(b.quota("vm-quota", hard={"requests.memory": "1Ti"}))
    used = eventually(lambda: ((world.cluster.get("v1", "ResourceQuota", "default", "vm-quota") or {})
                               .get("status") or {}).get("used", {}).get("requests.memory"),
                      what="the resourcequota controller's usage")
    hard = f"{b.mebibytes(used) + launcher // 2}Mi"
    world.cluster.patch("v1", "ResourceQuota", "default", "vm-quota", {"spec": {"hard": {"requests.memory": hard}}})
    eventually(lambda: (world.cluster.get("v1", "ResourceQuota", "default", "vm-quota") or {})
               .get("status", {}).get("hard", {}).get("requests.memory") == hard, what="the quota's new hard")
    vmi, vmim = _migrate(world, name)
    eventually(lambda: [e for e in world.cluster.list("v1", "Event", "default")
                        if e["reason"] == "FailedCreate" and "exceeded quota: vm-quota" in e["message"]
                        and e["involvedObject"].get("uid") == vmi["metadata"]["uid"]],
               what="virt-controller's FailedCreate Event on the VMI", timeout=30)
    quota = world.cluster.get("v1", "ResourceQuota", "default", "vm-quota")["status"]
    return vmi, vmim, (f"ResourceQuota vm-quota: requests.memory used {quota['used']['requests.memory']} of "
                       f"{quota['hard']['requests.memory']}")


def test_a_migration_held_by_a_migration_limit_of_zero_is_reported_as_queued(world):
    """KubeVirt keeps a VMIM Pending while its migration limits are in use (migration.go handleTargetPodCreation);
    with migrations.parallelOutboundMigrationsPerNode 0 in the KubeVirt CR, for ever. On the real backend KubeVirt's
    migration controller holds it; the function reads the same CR and reports it as queued, with the numbers."""
    name = world.create_vm()
    world.wait_status(name, "Running")
    _kubevirt_migrations(world, {"parallelOutboundMigrationsPerNode": 0})
    try:
        _, vmim = _migrate(world, name)
        d = world.reported(name)["details"]
        assert d["cause"] == "migration-queued", (d["cause"], d["checked"])
        assert any("0 out of node" in e and "parallelOutboundMigrationsPerNode 0" in e for e in d["evidence"])
        assert "`kubectl -n kubevirt edit kubevirt kubevirt`" in d["nextStep"], d["nextStep"]
        world.cluster.delete("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default", vmim["metadata"]["name"])
        world.resolved(name)
    finally:
        _kubevirt_migrations(world, {"parallelOutboundMigrationsPerNode": None})


def _kubevirt_migrations(world, settings):
    world.cluster.patch("kubevirt.io/v1", "KubeVirt", "kubevirt", "kubevirt",
                        {"spec": {"configuration": {"migrations": settings}}})


def test_a_vm_that_settles_in_time_is_never_reported(world):
    name = world.create_vm()
    world.wait_status(name, "Running")
    world.tick()
    assert not world.notices(name) and not world.events(name)


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    # KubeVirt prints Provisioning and DataVolumeError only with CDI, which neither backend's KubeVirt runs here:
    # test_written.py writes DataVolumes as CDI does, and checks the function reads them with its grant
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA, elsewhere=[DATAVOLUME_GRANT])

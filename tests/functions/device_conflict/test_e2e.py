"""device-conflict end to end: the simulated API server and KubeVirt (one node, harvester-ktmg4, with
device capacity per resource), the local broker routing by the Trigger in deploy/, the
ApiServerSources for VMs and VMIs, the PingSource, and the function as a real functions-framework
server with the credentials of its own ServiceAccount.

The seed's story is replayed with the seed's own vm1 and vm2 (simcluster/builders/devices.py). Other
tests use their own resource names, so the node's capacity of one does not couple them.
"""
from __future__ import annotations

import itertools
import json

import pytest

from simcluster.builders.devices import SEED_DEVICE, SEED_NODE, VF, host_device, seed_vm1, seed_vm2
from simcluster.builders.io_pause import make_pvc
from simcluster.play import virtctl_start
from tests import e2e
from tests.e2e import eventually
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION_SA = "vmevents/device-conflict"
PREFIX = "io.vmevents.device-conflict."
# A resource of its own per test and world (capacity 2 each): the tests here and the image tests that replay them
# (tests/deploy/test_image.py imports this module) draw from one iterator for the whole session.
RESOURCES = {f"example.com/dev-{i}": 2 for i in range(32)}
_resources = iter(sorted(RESOURCES))
_names = itertools.count(1)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    function_sa = FUNCTION_SA
    settle = e2e.World.settle_with_kubevirt

    def __init__(self, version: str, backend: str, repair_every: str = "0s"):
        """repair_every: DEVICE_REPAIR_EVERY; these tests make every tick a full repair, as every tick was before
        light ticks (test_light_tick.py tests those)."""
        super().__init__(version, backend=backend,
                         kubevirt={"nodes": {SEED_NODE: {VF: 1, **RESOURCES}}, "step_delay": 0.01},
                         env_overrides={"device-conflict": {"DEVICE_REPAIR_EVERY": repair_every}})

    # -- helpers ------------------------------------------------------------------------------
    def create(self, manifest, run_strategy=None):
        if run_strategy:
            manifest["spec"]["runStrategy"] = run_strategy
        # The seed's disks are PVCs, there in Harvester: without one KubeVirt's VMI controller creates no
        # launcher pod (FailedPvcNotFound, "PVC … does not exist, waiting for it to appear").
        namespace = manifest["metadata"].get("namespace", "default")
        for network in manifest["spec"]["template"]["spec"].get("networks") or []:
            # Its NIC is on a Multus network: KubeVirt renders no launcher pod without the NetworkAttachmentDefinition
            # ("Failed to locate network attachment definition"), on both backends.
            nad_ns, _, nad = (network.get("multus") or {}).get("networkName", "").rpartition("/")
            if nad and self.cluster.get("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition", nad_ns or namespace,
                                        nad) is None:
                self.cluster.create({
                    "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": nad, "namespace": nad_ns or namespace},
                    "spec": {"config": json.dumps({"cniVersion": "0.3.1", "name": nad, "type": "bridge"})}})
        for volume in manifest["spec"]["template"]["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and self.cluster.get("v1", "PersistentVolumeClaim", namespace, claim) is None:
                self.cluster.create(make_pvc(claim, f"pvc-{claim}", namespace))
        self.cluster.create(manifest)
        return manifest["metadata"]["name"]

    def vm(self, name):
        return self.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)

    def phase(self, name):
        vmi = self.vmi(name)
        return vmi and (vmi.get("status") or {}).get("phase")

    def wait_phase(self, name, phase):
        return self.wait_vmi_phase(name, phase)

    def events(self, name, reason="HostDeviceConflict"):
        return [e for e in self.cluster.list("v1", "Event", "default")
                if e["involvedObject"]["name"] == name and e["reason"] == reason]

    def conflict_events(self, name, kind):
        """The finding's Event (on the first VM it keeps from starting) and the plain ones on the others."""
        def category(e):
            notes = e["metadata"].get("annotations") or {}
            if "vmevents.io/finding" in notes:
                return json.loads(notes["vmevents.io/finding"])["category"]
            return notes.get("vmevents.io/finding-category")
        return [e for e in self.events(name) if category(e) == kind]

    def replies(self, what=None):
        """(id, state, details + severity) of every finding replied; summary items with their own ids."""
        found = []
        for e in list(self.knative.broker.received):
            if not e["type"].startswith(PREFIX):
                continue
            data = e2e.data_of(e)
            for item in data["findings"] if "findings" in data else [dict(data, id=e["id"])]:
                found.append((item["id"], item["state"], dict(item["details"], severity=item["severity"])))
        return [r for r in found if what is None or r[1] == what]

    def reply_about(self, what, kind, device):
        return [r for r in self.replies(what) if r[2]["kind"] == kind and r[2]["device"] == device]


@pytest.fixture(scope="module", **e2e.backends_only())
def world(request):
    with World(*request.param) as w:
        yield w


def small_vm(name, device, resource, run_strategy="Always"):
    """A VM shaped like the seed's vm1, naming its own device of its own resource."""
    manifest = seed_vm1(name, host_devices=[host_device(device, resource)])
    manifest["spec"]["runStrategy"] = run_strategy
    return manifest


def conflict_every_event_misses(w, holder: str, other: str, device: str, resource: str) -> dict:
    """`holder` runs with `device` and stopped `other` names it, while device-conflict cannot read a VM: every
    delivery about them fails, so nothing was reported. Returns `other` as created; the fault is cleared."""
    fault = w.cluster.faults.add(method="GET", path="/virtualmachines(/[^/]+)?$", service_account=FUNCTION_SA,
                                 status=503, times=None)
    assert fault is not None
    w.create(small_vm(holder, device, resource))
    w.wait_phase(holder, "Running")
    created = w.create(small_vm(other, device, resource, "Halted"))
    w.settle()
    assert not w.events(created), "every delivery failed: the events were missed"
    w.cluster.faults.clear()
    return created


def power_off_seed_vm1(w) -> None:
    """vm1 has the PCI device and powers itself off: its pod completes and frees the device."""
    w.create(seed_vm1())
    w.wait_phase("vm1", "Running")
    w.kubevirt.guest_power_off("default", "vm1")
    eventually(lambda: w.vmi("vm1") is None, what="KubeVirt >= 1.2 removes vm1's Succeeded VMI")


# -- the seed, end to end -------------------------------------------------------------------------
def test_the_seed_each_situation_and_its_resolution(world):
    w = world
    power_off_seed_vm1(w)
    # vm2 is created naming the same device, and starts.
    w.create(seed_vm2())
    w.wait_phase("vm2", "Running")
    taken = eventually(lambda: w.reply_about("detected", "taken-while-stopped", SEED_DEVICE),
                       what="taken-while-stopped reported")
    assert taken[0][2] == {"kind": "taken-while-stopped", "device": SEED_DEVICE, "resourceName": VF,
                           "node": SEED_NODE, "holder": "default/vm2", "blocked": ["default/vm1"],
                           "severity": "warning"}
    for name in ("vm1", "vm2"):
        [event] = eventually(lambda n=name: w.conflict_events(n, "taken-while-stopped"), what=f"Event on {name}")
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "VirtualMachine"
        assert event["message"] == (f"default/vm2 holds {SEED_DEVICE} ({VF}) on {SEED_NODE}; stopped VM default/vm1 "
                                    f"names it too and cannot start while default/vm2 runs.")

    # vm1 can no longer start: "0/1 nodes are available: 1 Insufficient intel.com/...".
    virtctl_start(w.cluster, "default", "vm1")
    eventually(lambda: w.vm("vm1")["status"].get("printableStatus") == "ErrorUnschedulable", what="vm1 unschedulable")
    blocked = eventually(lambda: w.reply_about("detected", "start-blocked", SEED_DEVICE), what="start-blocked")
    assert blocked[0][2]["severity"] == "critical" and blocked[0][2]["holder"] == "default/vm2"
    [event] = w.conflict_events("vm1", "start-blocked")
    assert "Stop default/vm2, or edit default/vm1" in event["message"]

    # The next re-scan says taken-while-stopped ended: it became start-blocked.
    w.tick()
    ended = w.reply_about("resolved", "taken-while-stopped", SEED_DEVICE)
    assert [r[2]["because"] for r in ended] == ["it is now start-blocked"]
    assert ended[0][0] != taken[0][0]
    assert {e["reason"] for e in w.events("vm1", "HostDeviceConflictResolved")} == {"HostDeviceConflictResolved"}

    # vm2 powers off: vm1 gets the device and starts; start-blocked ends at the next re-scan, and
    # now vm1 holds what stopped vm2 names.
    w.kubevirt.guest_power_off("default", "vm2")
    w.wait_phase("vm1", "Running")
    eventually(lambda: [r for r in w.reply_about("detected", "taken-while-stopped", SEED_DEVICE)
                        if r[2]["holder"] == "default/vm1"], what="the roles swapped")
    w.tick()
    assert [r[2]["because"] for r in w.reply_about("resolved", "start-blocked", SEED_DEVICE)] == [
        "it is now taken-while-stopped"]
    # A further tick says nothing new: what ended is said once.
    before = len(w.replies("resolved"))
    w.tick()
    assert len(w.replies("resolved")) == before
    assert not [r for verb in ("update", "patch", "delete") for r in w.function_requests(verb)
                if r.resource not in ("events", "configmaps")], "it never changes a VM"
    assert_describe_reads_as_the_story(w, "vm1", "vm2")


def assert_describe_reads_as_the_story(w, *names: str) -> None:
    """`kubectl describe vm` of each VM reads as the story (issue 34): no more rows than the transitions of the
    findings that name the VM (a Warning HostDeviceConflict when one opens, its count the sightings, rewritten when it
    reopens; a Normal HostDeviceConflictResolved when it ends), every finding shown, and none contradicting another.
    Before, the finding's own Event turned "Normal HostDeviceConflict: No longer in conflict", beside a
    HostDeviceConflictResolved row saying the same."""
    from functions.device_conflict.handler import _people

    for name in names:
        rows = [(e["type"], e["reason"], e["message"]) for e in w.cluster.list("v1", "Event", "default")
                if e["involvedObject"]["name"] == name
                and (e.get("source") or {}).get("component") == "device-conflict"]
        notices = [(state, reply, details) for reply, state, details in w.replies()
                   if f"default/{name}" in _people(details)]
        transitions = {(state, reply) for state, reply, _ in notices}
        findings = {(d["kind"], d["device"], d["holder"], tuple(d["blocked"])) for _, _, d in notices}
        assert len(findings) <= sum(1 for row in rows if row[0] == "Warning"), (name, rows, findings)
        assert 0 < len(rows) <= len(transitions), (name, rows, transitions)
        assert sum(1 for row in rows if row[0] == "Normal") <= sum(1 for state, _ in transitions if state == "resolved")
        for kind, reason, message in rows:
            assert (kind, reason) in (("Warning", "HostDeviceConflict"), ("Normal", "HostDeviceConflictResolved")), rows
            assert (kind == "Normal") == message.startswith("No longer in conflict"), rows


def test_double_assigned_warns_on_both_before_anyone_starts_and_resolves_when_a_spec_changes(world):
    w, resource = world, next(_resources)
    device = f"{SEED_NODE}-00000{next(_names):04d}"
    a = w.create(small_vm(f"dbl-a{next(_names)}", device, resource, "Halted"))
    b = w.create(small_vm(f"dbl-b{next(_names)}", device, resource, "Halted"))
    found = eventually(lambda: w.reply_about("detected", "double-assigned", device), what="double-assigned")
    assert found[0][2]["blocked"] == [f"default/{a}", f"default/{b}"] and found[0][2]["holder"] is None
    for name in (a, b):
        eventually(lambda n=name: w.conflict_events(n, "double-assigned"), what=f"Event on {name}")
    # b's spec is edited to name another device: the next re-scan says it ended.
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", b, {"spec": {"template": {"spec": {"domain": {
        "devices": {"hostDevices": [host_device(device + "9", resource)]}}}}}})
    w.tick()
    ended = w.reply_about("resolved", "double-assigned", device)
    assert ended and ended[0][2]["because"] == f"default/{b} no longer names or holds {device}"
    assert ended[0][0] != found[0][0]


def test_the_same_conflict_seen_again_counts_up_and_keeps_its_reply_id(world):
    w, resource = world, next(_resources)
    device = f"{SEED_NODE}-00001{next(_names):04d}"
    a = w.create(small_vm(f"dup-a{next(_names)}", device, resource, "Halted"))
    b = w.create(small_vm(f"dup-b{next(_names)}", device, resource, "Halted"))
    eventually(lambda: w.conflict_events(a, "double-assigned"), what="the first report")
    w.settle()
    first = w.conflict_events(a, "double-assigned")[0]["count"]
    payload = w.vm(b)
    for _ in range(2):  # b's update delivered again, twice
        w.send(payload)
        w.settle()
    [event] = w.conflict_events(a, "double-assigned")
    assert event["count"] == first + 2
    ids = {r[0] for r in w.reply_about("detected", "double-assigned", device)}
    assert len(ids) == 1


def test_nothing_is_reported_when_nothing_conflicts(world):
    w, resource = world, next(_resources)  # capacity 2
    base = next(_names)
    a = w.create(small_vm(f"ok-a{base}", f"{SEED_NODE}-00002{base:04d}", resource))
    b = w.create(small_vm(f"ok-b{base}", f"{SEED_NODE}-00003{base:04d}", resource))  # same resource, other device
    w.wait_phase(a, "Running")
    w.wait_phase(b, "Running")
    # a migrates to another node (one VMI throughout; virt-controller writes migrationState)
    vmi = w.vmi(a)
    w.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", a, {"status": {
        "migrationState": {"startTimestamp": vmi["status"]["phaseTransitionTimestamps"][-1]["phaseTransitionTimestamp"],
                           "sourceNode": SEED_NODE, "targetNode": "harvester-node-2"}}})
    w.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", a, {"status": {
        "nodeName": "harvester-node-2", "migrationState": {"completed": True, "endTimestamp":
                                                           vmi["status"]["phaseTransitionTimestamps"][-1]["phaseTransitionTimestamp"]}}})
    # b restarts (runStrategy Always: KubeVirt boots a new VMI for the same VM)
    old = w.vmi(b)["metadata"]["uid"]
    w.kubevirt.guest_power_off("default", b)
    eventually(lambda: (v := w.vmi(b)) and v["metadata"]["uid"] != old
               and (v.get("status") or {}).get("phase") == "Running", what="b restarted")
    w.tick()
    assert not w.events(a) and not w.events(b)
    assert not [r for r in w.replies() if {f"default/{a}", f"default/{b}"} & set(r[2].get("blocked", []))]


def test_a_missed_event_is_caught_by_the_next_tick(world):
    w, resource = world, next(_resources)
    device = f"{SEED_NODE}-00004{next(_names):04d}"
    holder = f"miss-a{next(_names)}"
    other = conflict_every_event_misses(w, holder, f"miss-b{next(_names)}", device, resource)
    w.tick()
    found = w.reply_about("detected", "taken-while-stopped", device)
    assert found and found[0][2]["holder"] == f"default/{holder}" and w.conflict_events(other, "taken-while-stopped")


# -- devices an instancetype gives a VM (issue 26) ---------------------------------------------------
INSTANCETYPE_KINDS = {"namespaced": "VirtualMachineInstancetype", "cluster": "VirtualMachineClusterInstancetype"}


def instancetype(kind: str, name: str, device: str, resource: str) -> dict:
    """An instancetype giving one PCI device (instancetype.kubevirt.io/v1beta1: cpu.guest and memory.guest are
    required)."""
    meta = {"name": name} | ({"namespace": "default"} if kind == "namespaced" else {})
    return {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": INSTANCETYPE_KINDS[kind], "metadata": meta,
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "1Gi"}, "hostDevices": [host_device(device, resource)]}}


def instancetype_vm(name: str, kind: str, instancetype_name: str) -> dict:
    """The seed's vm1 shape, stopped, with no device, CPU or memory of its own: its instancetype gives them
    (KubeVirt refuses a template that sets what the instancetype does: ApplyToVmi's conflicts)."""
    manifest = small_vm(name, "unused", "unused", "Halted")
    domain = manifest["spec"]["template"]["spec"]["domain"]
    for key in ("cpu", "memory", "resources"):
        domain.pop(key, None)
    domain["devices"].pop("hostDevices")
    manifest["spec"]["instancetype"] = {"name": instancetype_name, "kind": INSTANCETYPE_KINDS[kind]}
    return manifest


@pytest.mark.parametrize("kind", sorted(INSTANCETYPE_KINDS))
def test_a_stopped_vm_whose_instancetype_gives_a_device_another_vm_takes_is_reported(world, kind):
    """The stopped VM names its device only through its instancetype, created after it (its first event finds no
    instancetype to read); KubeVirt then records the revision it will apply, and the VM names the device. Another VM
    takes the device: one taken-while-stopped notice, and one resolved when the stopped VM is gone."""
    w, resource = world, next(_resources)
    device = f"{SEED_NODE}-00005{next(_names):04d}"
    it_name, stopped = f"it-{kind}-{next(_names)}", f"it-stopped{next(_names)}"
    w.tick()  # the parameter object is there (a repair writes it): the VM's event reads it, not every VM
    w.create(instancetype_vm(stopped, kind, it_name))
    w.settle()
    w.cluster.create(instancetype(kind, it_name, device, resource))
    eventually(lambda: (w.vm(stopped)["spec"]["instancetype"].get("revisionName")
                        or ((w.vm(stopped).get("status") or {}).get("instancetypeRef") or {}).get(
                            "controllerRevisionRef")), timeout=60, what="KubeVirt recorded the instancetype's revision")
    w.settle()
    holder = w.create(small_vm(f"it-holder{next(_names)}", device, resource))
    w.wait_phase(holder, "Running")
    found = eventually(lambda: w.reply_about("detected", "taken-while-stopped", device), what="taken-while-stopped")
    assert len(found) == 1 and found[0][2]["blocked"] == [f"default/{stopped}"], found
    assert found[0][2]["holder"] == f"default/{holder}"
    assert w.conflict_events(stopped, "taken-while-stopped")
    w.tick()  # a full repair reads the instancetypes too: it sees the conflict, and resolves nothing
    assert not w.reply_about("resolved", "taken-while-stopped", device)
    # The stopped VM goes (its seed finalizer is Harvester's, which nothing here removes: dropped after the DELETE).
    w.cluster.delete("kubevirt.io/v1", "VirtualMachine", "default", stopped)
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", stopped, {"metadata": {"finalizers": None}})
    eventually(lambda: w.vm(stopped) is None, what="the stopped VM is gone")
    w.tick()
    ended = w.reply_about("resolved", "taken-while-stopped", device)
    assert [r[2]["because"] for r in ended] == [f"default/{stopped} no longer names or holds {device}"]
    w.tick()
    assert len(w.reply_about("detected", "taken-while-stopped", device)) == 1, "detected once"
    assert len(w.reply_about("resolved", "taken-while-stopped", device)) == 1, "resolved once"


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    """Last in this module: by now every path has run. Exactly the shipped permissions were used."""
    world.settle()
    denied = [r for r in world.cluster.requests if r.service_account == FUNCTION_SA and not r.allowed]
    assert not denied, denied
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

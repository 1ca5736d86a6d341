"""device-conflict's pure parts: what the VMs and VMIs of a cluster make of each device, which
events are worth a look, and what a re-scan does with the conflicts it reported before."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from functions.device_conflict.decide import Category, Facts, decide, find_conflicts
from functions.device_conflict.handler import target, worth_decoding
from functions.device_conflict.index import Index, Ref, about_to_start
from functions.device_conflict.settings import Settings
from functions.device_conflict.wording import conflict_message, details, finding, why_resolved
from shared.intake import Incoming
from shared.ledger import record_of
from simcluster.builders.devices import (
    NOW,
    SEED_DEVICE,
    SEED_NODE,
    VF,
    host_device,
    insufficient,
    seed_vm1,
    seed_vm2,
    vm,
    vmi,
)

TAKEN, BLOCKED, DOUBLE = Category.TAKEN, Category.BLOCKED, Category.DOUBLE
GPU = "nvidia.com/NVIDIA_A2-4Q"
D1, D2 = host_device(), host_device("harvester-ktmg4-000004103")


def conflicts(*objects):
    index = Index()
    for obj in objects:
        (index.add_vm if obj["kind"] == "VirtualMachine" else index.add_vmi)(obj)
    return find_conflicts(index.workloads())


def summary(found):
    return [(c.category, c.device, c.holder.name if c.holder else None, [b.name for b in c.blocked]) for c in found]


# -- the decision table -----------------------------------------------------------------------------
@pytest.mark.parametrize("objects,expected", [
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1)], [(TAKEN, SEED_DEVICE, "vm2", ["vm1"])],
                 id="seed-vm2-runs-with-vm1s-device-while-vm1-is-off"),
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1), vmi("vm1", D1, phase="Succeeded")],
                 [(TAKEN, SEED_DEVICE, "vm2", ["vm1"])], id="seed-on-kubevirt-1.1-vm1s-succeeded-vmi-stays"),
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1, phase="Pending", node=None)],
                 [(TAKEN, SEED_DEVICE, "vm2", ["vm1"])], id="a-starting-vm-already-counts-as-the-holder"),
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1),
                  vmi("vm1", D1, phase="Scheduling", unschedulable=insufficient())],
                 [(BLOCKED, SEED_DEVICE, "vm2", ["vm1"])], id="seed-vm1-cannot-start-anymore"),
    pytest.param([seed_vm1(), seed_vm2()], [(DOUBLE, SEED_DEVICE, None, ["vm1", "vm2"])],
                 id="two-specs-name-one-device-and-neither-runs"),
    pytest.param([seed_vm1(), seed_vm2(), seed_vm1("vm3")], [(DOUBLE, SEED_DEVICE, None, ["vm1", "vm2", "vm3"])],
                 id="three-specs-name-one-device"),
    pytest.param([vm("a", D1), vm("b", D1), vmi("a", D1), vm("c", D1)],
                 [(TAKEN, SEED_DEVICE, "a", ["b"]), (TAKEN, SEED_DEVICE, "a", ["c"])], id="one-holder-two-stopped"),
    pytest.param([vm("a", host_device("gpu-1", GPU)), vmi("a", host_device("gpu-1", GPU)),
                  vm("b", host_device("gpu-1", GPU))],
                 [(TAKEN, "gpu-1", "a", ["b"])], id="a-vgpu-too"),
    # the real allocation wins over the spec for a running VM (docs/facts.md §3, harvester#5823)
    pytest.param([vm("a", D1, allocation={"hostdevices": {VF: [D2["name"]]}}), vmi("a", D1), vm("b", D1)], [],
                 id="allocation-says-the-runner-got-another-device"),
    pytest.param([vm("a", D1, allocation={"hostdevices": {VF: [D2["name"]]}}), vmi("a", D1), vm("b", D2)],
                 [(TAKEN, D2["name"], "a", ["b"])], id="allocation-says-the-runner-holds-what-a-stopped-vm-names"),
    pytest.param([vm("a", D1, allocation={"hostdevices": {VF: [D2["name"]]}}), vm("b", D2)], [],
                 id="a-stale-allocation-of-a-stopped-vm-is-ignored"),
    # nothing is reported when nothing conflicts
    pytest.param([vm("a", D1), vmi("a", D1), vm("b", D2)], [], id="same-resource-different-devices"),
    pytest.param([vm("a", D1), vm("b", D2)], [], id="same-resource-different-devices-both-stopped"),
    pytest.param([vm("a", D1), vmi("a", D1, migration={"startTimestamp": "2026-11-30T11:00:00Z",
                                                       "sourceNode": SEED_NODE, "targetNode": "harvester-node-2"})],
                 [], id="a-vm-migrating-between-nodes"),
    pytest.param([vm("a", D1), vmi("a", D1, phase="Succeeded")], [], id="the-same-vm-restarting"),
    pytest.param([vm("a", D1), vmi("a", D1), vm("b", D1), vmi("b", D1)], [],
                 id="both-run-kubelet-gave-them-different-vfs"),
    pytest.param([vm("a", D1), vmi("a", D1), vm("b", D1), vmi("b", D1, phase="Scheduling", unschedulable=
                 "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.")],
                 [], id="blocked-for-another-reason"),
    pytest.param([vm("a", D1), vm("b", D1), vmi("b", D1, phase="Scheduling", unschedulable=insufficient()),
                  vmi("a", D1, phase="Pending", node=None)], [], id="blocked-while-the-other-is-only-starting"),
    pytest.param([vm("a"), vm("b")], [], id="no-devices"),
])
def test_conflicts(objects, expected):
    assert summary(conflicts(*objects)) == expected


def test_a_vmi_holding_a_device_its_vm_no_longer_names_is_still_the_holder():
    edited = vm("a")  # the spec was edited while it ran; the VMI still has the device
    assert summary(conflicts(edited, vmi("a", D1), vm("b", D1))) == [(TAKEN, SEED_DEVICE, "a", ["b"])]


def test_a_standalone_vmi_can_hold_a_device():
    [found] = conflicts(vmi("lone", D1, owned=False), vm("b", D1))
    assert found.holder == Ref("default", "lone", "VirtualMachineInstance")


def test_cross_namespace_conflicts_name_the_namespaces():
    [found] = conflicts(vm("a", D1, namespace="team-a"), vmi("a", D1, namespace="team-a"),
                        vm("b", D1, namespace="team-b"))
    assert details(found) == {"kind": TAKEN, "device": SEED_DEVICE, "resourceName": VF, "node": SEED_NODE,
                              "holder": "team-a/a", "blocked": ["team-b/b"]}
    assert found.severity == "warning"


@pytest.mark.parametrize("objects,message", [
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1)],
                 f"default/vm2 holds {SEED_DEVICE} ({VF}) on {SEED_NODE}; stopped VM default/vm1 names it too and "
                 f"cannot start while default/vm2 runs.", id=TAKEN),
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1),
                  vmi("vm1", D1, phase="Scheduling", unschedulable=insufficient())],
                 f"default/vm1 cannot start (Insufficient {VF}): default/vm2 holds {SEED_DEVICE} ({VF}) "
                 f"on {SEED_NODE}, "
                 f"which default/vm1 names too. Stop default/vm2, or edit default/vm1 to name another free {VF} "
                 f"device, and default/vm1 can start.", id=BLOCKED),
    pytest.param([seed_vm1(), seed_vm2()],
                 f"default/vm1 and default/vm2 both name {SEED_DEVICE} ({VF}) on {SEED_NODE} and none of them runs "
                 f"yet: only one can run at a time. Edit the others to name another {VF} device.", id=DOUBLE),
])
def test_messages(objects, message):
    [found] = conflicts(*objects)
    assert conflict_message(found) == message


def test_the_key_is_the_conflicts_identity_and_not_its_node():
    a = conflicts(vm("a", D1), vmi("a", D1, node="n1"), vm("b", D1))[0]
    b = conflicts(vm("a", D1), vmi("a", D1, node="n2"), vm("b", D1))[0]
    assert a.key == b.key == f"{TAKEN}|{SEED_DEVICE}|default/a|default/b"


# -- which events are worth a look ------------------------------------------------------------------
def event(obj, operation="update"):
    return Incoming(id="1", type=f"dev.knative.apiserver.resource.{operation}", source="s", data=obj,
                    extensions={"kind": obj["kind"]})


SETTINGS = Settings()


@pytest.mark.parametrize("obj,operation,expected", [
    pytest.param(seed_vm2(), "add", {SEED_DEVICE}, id="vm-created-with-a-device"),
    pytest.param(vm("a", D1), "update", {SEED_DEVICE}, id="vm-with-a-device-edited"),
    pytest.param(vm("a", allocation={"hostdevices": {VF: [SEED_DEVICE]}}), "update", {SEED_DEVICE},
                 id="vm-with-only-an-allocation"),
    # A VM that names no device and whose spec KubeVirt has not yet observed (no generation here) may be the
    # edit that dropped its device: a look, if the parameter object names it (handler.on_event).
    pytest.param(vm("a"), "update", set(), id="vm-without-devices-edited-is-a-look-without-devices"),
    pytest.param(vm("a") | {"metadata": {"name": "a", "namespace": "default", "generation": 3},
                            "status": {"observedGeneration": 3}}, "update", None,
                 id="vm-without-devices-observed-is-irrelevant"),
    pytest.param(vm("a", D1), "delete", set(), id="vm-deleted-is-a-look-at-the-parameter-object"),
    pytest.param(vmi("a", D1), "delete", None, id="vmi-deleted-is-irrelevant"),
    pytest.param(vmi("a", D1, phase="Pending", node=None), "add", {SEED_DEVICE}, id="vmi-starting"),
    pytest.param(vmi("a", D1, phase="Scheduled"), "update", {SEED_DEVICE}, id="vmi-just-bound"),
    pytest.param(vmi("a", D1, since=NOW - timedelta(minutes=1)), "update", {SEED_DEVICE}, id="vmi-just-running"),
    pytest.param(vmi("a", D1, since=NOW - timedelta(hours=3)), "update", None, id="vmi-running-for-hours"),
    pytest.param(vmi("a", D1, phase="Scheduling", unschedulable=insufficient()), "update", {SEED_DEVICE},
                 id="vmi-unschedulable-for-a-device"),
    pytest.param(vmi("a", D1, phase="Succeeded"), "update", None, id="vmi-final"),
    pytest.param(vmi("a", phase="Pending"), "add", None, id="vmi-without-devices"),
])
def test_target(obj, operation, expected):
    found = target(event(obj, operation), SETTINGS, NOW)
    assert (found.devices if found else None) == (frozenset(expected) if expected is not None else None)
    assert (found is not None and found.edited) == (expected == set())


@pytest.mark.parametrize("kind,body,expected", [
    # a VM event is always decoded: it may be the edit that drops a device (handler.worth_decoding)
    pytest.param("VirtualMachine", json.dumps(vm("a")).encode(), True, id="vm-without-devices-is-decoded"),
    pytest.param("VirtualMachine", json.dumps(vm("a") | {"metadata": {"name": "a", "generation": 4},
                                                         "status": {"observedGeneration": 4}}).encode(), False,
                 id="vm-without-devices-whose-spec-kubevirt-observed-is-not-decoded"),
    pytest.param("VirtualMachine", json.dumps(vm("a") | {"metadata": {"name": "a", "generation": 5},
                                                         "status": {"observedGeneration": 4}}).encode(), True,
                 id="vm-spec-edit-without-devices-is-decoded"),
    pytest.param("VirtualMachine", json.dumps(vm("a") | {"metadata": {"name": "a", "generation": 4,
                                                                      "labels": {"generation": "4"}},
                                                         "status": {"observedGeneration": 4}}).encode(), True,
                 id="vm-whose-bytes-name-a-generation-twice-is-decoded"),
    pytest.param("VirtualMachine", b'{"metadata": {"name": "a", "generation" :  4}, "spec": {}, '
                                   b'"status": {"observedGeneration":4}}', False,
                 id="vm-observed-written-with-other-spacing-is-not-decoded"),
    pytest.param("VirtualMachineInstance", json.dumps(vmi("a", D1)).encode(), True, id="vmi-with-hostDevices-key"),
    pytest.param("VirtualMachineInstance", json.dumps(vmi("a")).encode(), False, id="vmi-without-devices"),
    pytest.param("VirtualMachine", json.dumps(seed_vm1()).encode(), True, id="seed-vm"),
    pytest.param("Pod", b"{}", True, id="another-kind-is-decoded-and-refused"),
])
def test_prefilter(kind, body, expected):
    headers = {"ce-type": "dev.knative.apiserver.resource.update", "ce-kind": kind}
    assert worth_decoding(headers, body, SETTINGS) is expected


def test_bad_setting_names_the_variable():
    with pytest.raises(ValueError, match="CONFLICT_RECENT_START='soon' is not a duration"):
        Settings.from_env({"CONFLICT_RECENT_START": "soon"})


# -- the re-scan's plan: Events on record versus conflicts now ------------------------------------
SEED_TAKEN = conflicts(seed_vm1(), seed_vm2(), vmi("vm2", D1))[0]
SEED_BLOCKED = conflicts(seed_vm1(), seed_vm2(), vmi("vm2", D1),
                         vmi("vm1", D1, phase="Scheduling", unschedulable=insufficient()))[0]


# The re-scan's bookkeeping of old (plan: which Events to record, which conflict is new, which ended, the
# resolved-at mark and "came back") is the finding's life in shared/ledger.py now: tests/shared/test_ledger.py
# holds those cases (open, seen again, resolved once, reopened, races), and test_e2e.py the re-scan's use of them.
def test_a_conflicts_finding_is_named_by_its_category_first_blocked_vm_and_key():
    found = finding(SEED_TAKEN)
    assert (found.function, found.category, found.key) == ("device-conflict", TAKEN, SEED_TAKEN.key)
    assert found.subject == "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1"
    assert found.identity == {"namespace": "default", "vm": "vm2", "device": SEED_DEVICE, "conflict": TAKEN}
    assert found.severity == "warning" and found.summary == conflict_message(SEED_TAKEN)
    escalated = finding(SEED_BLOCKED)
    assert escalated.ident != found.ident and escalated.severity == "critical"


def test_a_finding_event_of_ours_is_read_back():
    stored = json.dumps(finding(SEED_TAKEN).data("open"))
    event = {"metadata": {"name": "vm1.fabc", "namespace": "default", "resourceVersion": "9",
                          "labels": {"vmevents.io/finding": "device-conflict", "vmevents.io/finding-state": "open"},
                          "annotations": {"vmevents.io/finding": stored, "vmevents.io/finding-episode": "2"}},
             "involvedObject": {"kind": "VirtualMachine", "name": "vm1", "namespace": "default", "uid": "u"},
             "count": 3}
    found = record_of(event)
    assert found is not None and found.open and found.episode == 2 and found.count == 3
    assert found.finding == finding(SEED_TAKEN)
    assert record_of({"metadata": {"name": "x"}, "count": 1}) is None


def workloads_of(*objects):
    index = Index()
    for obj in objects:
        (index.add_vm if obj["kind"] == "VirtualMachine" else index.add_vmi)(obj)
    return {w.ref.id: w for w in index.workloads()}


@pytest.mark.parametrize("objects,because", [
    pytest.param([seed_vm1(), seed_vm2(), vmi("vm2", D1, phase="Succeeded")], f"it is now {DOUBLE}",
                 id="the-holder-stopped-and-both-still-name-it"),
    pytest.param([seed_vm1(host_devices=[D2]), seed_vm2(), vmi("vm2", D1)],
                 f"default/vm1 no longer names or holds {SEED_DEVICE}", id="a-spec-changed"),
    pytest.param([seed_vm2(), vmi("vm2", D1)], f"default/vm1 no longer names or holds {SEED_DEVICE}",
                 id="a-vm-is-gone"),
])
def test_why_a_conflict_ended(objects, because):
    workloads = workloads_of(*objects)
    current = find_conflicts(workloads.values())
    assert why_resolved(details(SEED_TAKEN), current, workloads) == because


def test_an_escalation_says_what_it_became():
    assert why_resolved(details(SEED_TAKEN), [SEED_BLOCKED], {}) == f"it is now {BLOCKED}"


def test_one_vms_verdict_names_only_the_conflicts_it_is_part_of():
    workloads = workloads_of(seed_vm1(), seed_vm2(), vmi("vm2", D1), vm("x", D2), vmi("x", D2), vm("y", D2))
    verdict = decide(Facts("default/vm1", tuple(workloads.values())), Settings(), NOW)
    assert (verdict.action, verdict.reason) == ("conflict", f"{TAKEN} over {SEED_DEVICE}")
    assert [c.key for c in verdict.conflicts] == [SEED_TAKEN.key]
    alone = decide(Facts("default/z", tuple(workloads.values())), Settings(), NOW)
    assert (alone.action, alone.reason, alone.conflicts) == \
        ("no-conflict", "default/z shares a device with no conflict", ())


def test_a_vm_just_created_to_run_is_starting_not_stopped():
    """The moment between a VM's creation and its VMI's: not a stopped VM (no double-assigned for a moment)."""
    created = dict(seed_vm2(), metadata=dict(seed_vm2()["metadata"], creationTimestamp="2026-11-30T12:00:00Z"))
    assert about_to_start(created)
    assert not about_to_start(seed_vm2())  # not read from an API server: as the builders give it
    stopped = dict(created, status={"printableStatus": "Stopped"})
    assert not about_to_start(stopped)
    halted = dict(created, spec=dict(created["spec"], runStrategy="Halted"))
    assert not about_to_start(halted)
    [found] = conflicts(seed_vm1(), created)
    assert found.category is Category.TAKEN and found.holder.name == "vm2"

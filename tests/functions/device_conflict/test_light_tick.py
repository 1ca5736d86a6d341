"""device-conflict's light ticks (DEVICE_REPAIR_EVERY=1h here): between full repairs a tick GETs only the VMs the
parameter object's contested entries and the open findings name, never a LIST of every VM and VMI; the repair
(due when the object's vmevents.io/repaired-at is old) is what finds a conflict every event missed. A VM whose
edit drops its device frees the entry from its own update event. On both backends: the requests are counted from
the simulator's record or kube-apiserver's audit log, and the faults injected by the simulator or by the proxy in
front of kube-apiserver (controlplane/faultproxy.py)."""
from __future__ import annotations

import itertools

import pytest

from simcluster.builders.devices import SEED_NODE
from tests.e2e import backends_only, eventually
from tests.functions.device_conflict.test_e2e import (
    RESOURCES,
    conflict_every_event_misses,
    small_vm,
)
from tests.functions.device_conflict.test_e2e import World as E2eWorld

pytestmark = pytest.mark.e2e
WHERE = ("vmevents", "vmevents-device-assignments")
_resources = iter(sorted(RESOURCES))
_names = itertools.count(1)


class World(E2eWorld):
    # counts each tick's requests: LocalKnative's PingSource ticks only when asked (the e2e suite runs through
    # Knative's broker)
    through_knative = False


@pytest.fixture(scope="module", **backends_only())
def world(request):
    with World(*request.param, repair_every="1h") as w:
        w.tick()  # the object is missing: this first tick is a repair, and stamps it
        yield w


def entries(w):
    found = w.cluster.get("v1", "ConfigMap", *WHERE)
    return dict((found or {}).get("data") or {})


def lists_of_vms(w):
    return [r for r in w.function_requests("list") if r.resource in ("virtualmachines", "virtualmachineinstances")]


def make_repair_due(w):
    found = w.cluster.get("v1", "ConfigMap", *WHERE)
    found["metadata"].setdefault("annotations", {})["vmevents.io/repaired-at"] = "2000-01-01T00:00:00+00:00"
    w.cluster.update(found)


def fresh(prefix):
    return f"{prefix}{next(_names)}", next(_resources), f"{SEED_NODE}-00005{next(_names):04d}"


def delete_vm(w, name):
    """Delete a seed-made VM and wait until it is gone. It carries Harvester's finalizer, which no controller here
    removes, and virt-controller (on the real backend) adds its own to a VM until it is deleting: DELETE first, then
    drop them, as Harvester's controller would."""
    w.cluster.delete("kubevirt.io/v1", "VirtualMachine", "default", name)
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", name, {"metadata": {"finalizers": None}})
    eventually(lambda: w.vm(name) is None, what=f"{name} gone")


def test_a_light_tick_lists_no_vm_and_resolves_what_ended(world):
    w = world
    a, resource, device = fresh("light-a")
    b = f"light-b{next(_names)}"
    w.create(small_vm(a, device, resource))
    w.wait_phase(a, "Running")
    w.create(small_vm(b, device, resource, "Halted"))
    eventually(lambda: w.reply_about("detected", "taken-while-stopped", device), what="detected from events")
    unrelated = dict(entries(w))
    before = len(lists_of_vms(w))
    w.tick()
    assert len(lists_of_vms(w)) == before, "a light tick lists no VM and no VMI"
    assert entries(w) == unrelated, "nothing changed: a light tick keeps every entry"
    delete_vm(w, b)
    w.settle()
    w.tick()
    assert len(lists_of_vms(w)) == before
    ended = w.reply_about("resolved", "taken-while-stopped", device)
    assert [r[2]["because"] for r in ended] == [f"default/{b} no longer names or holds {device}"]
    assert entries(w).get(device) == f"default/{a} running"
    assert {k: v for k, v in entries(w).items() if k != device} == {
        k: v for k, v in unrelated.items() if k != device}, "a light tick never drops an unrelated entry"


def test_a_conflict_every_event_missed_is_found_at_the_next_repair(world):
    w = world
    holder, resource, device = fresh("repair-a")
    other = conflict_every_event_misses(w, holder, f"repair-b{next(_names)}", device, resource)
    w.tick()
    assert not w.reply_about("detected", "taken-while-stopped", device), "a light tick does not list"
    make_repair_due(w)
    before = len(lists_of_vms(w))
    w.tick()
    assert len(lists_of_vms(w)) > before, "the repair lists"
    found = w.reply_about("detected", "taken-while-stopped", device)
    assert found and found[0][2]["holder"] == f"default/{holder}"
    assert entries(w).get(device) == f"default/{holder} running default/{other}"


def test_a_vm_that_drops_its_device_frees_its_entry_from_its_own_update(world):
    w = world
    vm, resource, device = fresh("drop-a")
    w.create(small_vm(vm, device, resource, "Halted"))
    eventually(lambda: entries(w).get(device) == f"default/{vm} stopped", what="the entry is there")
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", vm, [
        {"op": "remove", "path": "/spec/template/spec/domain/devices/hostDevices"}], patch_type="json")
    eventually(lambda: device not in entries(w), what="the entry goes, with no tick")


def test_a_deleted_vm_frees_its_entry_from_its_delete_event(world):
    w = world
    vm, resource, device = fresh("gone-a")
    w.create(small_vm(vm, device, resource, "Halted"))
    eventually(lambda: entries(w).get(device) == f"default/{vm} stopped", what="the entry is there")
    delete_vm(w, vm)
    eventually(lambda: device not in entries(w), what="the entry goes with the VM, with no tick")

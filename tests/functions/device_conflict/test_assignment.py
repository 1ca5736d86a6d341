"""The parameter object's content (functions/device_conflict/assignment.py): which VM each host device is
assigned to, in Harvester UI's meaning, and how an event's and a re-scan's writes combine. Pure."""
from __future__ import annotations

import pytest

from functions.device_conflict.assignment import Entry, data_of, devices_of, entries, is_key, merged, read, updated
from functions.device_conflict.index import Index
from simcluster.builders.devices import SEED_DEVICE, host_device, insufficient, vm, vmi

D1, D2 = host_device(), host_device("harvester-ktmg4-000004103")


def born(obj, when):
    """A VM as read from the API server: created at `when`, and KubeVirt has reconciled it (Stopped, until its
    VMI says otherwise; without a printableStatus a new VM with a starting run strategy counts as starting)."""
    obj["metadata"]["creationTimestamp"] = when
    obj.setdefault("status", {})["printableStatus"] = "Stopped"
    return obj


def assigned(*objects):
    index = Index()
    for obj in objects:
        (index.add_vm if obj["kind"] == "VirtualMachine" else index.add_vmi)(obj)
    return {device: entry.encode() for device, entry in entries(index.workloads()).items()}


@pytest.mark.parametrize("objects,expected", [
    pytest.param([vm("vm1", D1)], {SEED_DEVICE: "default/vm1 stopped"}, id="the-one-vm-naming-it"),
    pytest.param([born(vm("vm2", D1), "2026-01-02T00:00:00Z"), born(vm("vm1", D1), "2026-01-01T00:00:00Z")],
                 {SEED_DEVICE: "default/vm1 stopped default/vm2"}, id="several-name-it-the-first-created-has-it"),
    pytest.param([born(vm("b", D1), "2026-01-01T00:00:00Z"), born(vm("a", D1), "2026-01-01T00:00:00Z")],
                 {SEED_DEVICE: "default/a stopped default/b"}, id="created-in-the-same-second-then-by-name"),
    pytest.param([born(vm("vm1", D1), "2026-01-01T00:00:00Z"), born(vm("vm2", D1), "2026-01-02T00:00:00Z"),
                  vmi("vm2", D1)],
                 {SEED_DEVICE: "default/vm2 running default/vm1"}, id="the-one-that-runs-with-it-wins"),
    pytest.param([vm("vm1", D1), vm("vm2", D2, allocation={"hostdevices": {D1["deviceName"]: [SEED_DEVICE]}}),
                  vmi("vm2", D2)],
                 {SEED_DEVICE: "default/vm2 running default/vm1", D2["name"]: "default/vm2 running"},
                 id="the-recorded-allocation-is-what-it-runs-with"),
    pytest.param([vm("vm1", D1), vm("vm2", D2, allocation={"hostdevices": {D1["deviceName"]: [SEED_DEVICE]}})],
                 {SEED_DEVICE: "default/vm1 stopped", D2["name"]: "default/vm2 stopped"},
                 id="a-stopped-vms-allocation-is-stale-and-ignored"),
    pytest.param([vm("vm1", D1), vmi("vm1", D1, phase="Scheduling", unschedulable=insufficient())],
                 {SEED_DEVICE: "default/vm1 blocked"}, id="a-blocked-vm-still-has-it"),
    pytest.param([vmi("lone", D1, owned=False)], {SEED_DEVICE: "default/lone running"}, id="a-standalone-vmi"),
    pytest.param([vm("plain")], {}, id="no-device-no-entry"),
    pytest.param([vm("odd", host_device("gpu:0/1"))], {}, id="a-name-that-cannot-be-a-configmap-key-is-not-kept"),
])
def test_who_a_device_is_assigned_to(objects, expected):
    assert assigned(*objects) == expected


def test_an_entry_reads_back_as_written_and_junk_is_dropped():
    entry = Entry("default/vm1", "stopped", ("default/vm2", "other/vm3"))
    assert Entry.decode(entry.encode()) == entry and entry.claimants == ("default/vm1", "default/vm2", "other/vm3")
    assert read({"a": "default/vm1 running", "b": "", "c": "lonely"}) == {"a": Entry("default/vm1", "running")}
    assert devices_of(read({"a": "x/1 stopped x/2", "b": "x/2 running", "c": "x/3 stopped"}), "x/2") == {"a", "b"}


def test_configmap_keys():
    assert is_key("harvester-ktmg4-000004102") and is_key("a.b_c-D")
    assert not is_key("gpu/0") and not is_key("..") and not is_key("") and not is_key("x" * 254)


def test_an_event_rewrites_only_the_entries_of_its_devices():
    data = {"d1": "default/vm1 stopped default/vm2", "d9": "default/vm9 running"}
    fresh = {"d1": Entry("default/vm1", "stopped"), "d2": Entry("default/vm2", "stopped")}
    # vm2 moved from d1 to d2; d3 it used to name is nobody's now; d9 is not its business.
    assert updated(data, fresh, {"d1", "d2", "d3"}) == {"d1": "default/vm1 stopped", "d2": "default/vm2 stopped",
                                                       "d9": "default/vm9 running"}


def test_a_rescan_keeps_what_an_event_wrote_while_it_listed():
    base = {"d1": "a/1 stopped", "d2": "a/2 stopped", "d3": "a/3 stopped"}
    theirs = {"d1": "a/1 stopped a/4", "d2": "a/2 stopped", "d5": "a/5 stopped"}  # an event: d1, d3 gone, d5
    mine = {"d1": "a/1 stopped", "d2": "a/2 running", "d3": "a/3 stopped", "d6": "a/6 stopped"}
    assert merged(base, theirs, mine) == {"d1": "a/1 stopped a/4", "d2": "a/2 running", "d5": "a/5 stopped",
                                          "d6": "a/6 stopped"}
    assert merged(base, base, mine) == mine


def test_the_data_is_sorted_so_that_an_unchanged_object_compares_equal():
    assert list(data_of({"b": Entry("x/1", "stopped"), "a": Entry("x/2", "stopped")})) == ["a", "b"]

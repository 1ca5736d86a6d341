"""device-conflict's parameter object (vmevents/vmevents-device-assignments, assignment.py) on both backends:
kept current from events, written only when it changes, repaired by the re-scan, rebuilt when deleted (its
convergence from scratch at 2,000 VMs: test_convergence.py)."""
from __future__ import annotations

import time

import pytest

from simcluster.builders.devices import SEED_NODE, host_device, seed_vm1
from simcluster.play import virtctl_start
from tests import e2e
from tests.e2e import eventually
from tests.functions.device_conflict.test_e2e import World as E2eWorld

pytestmark = pytest.mark.e2e
SA = "vmevents/device-conflict"
WHERE = ("vmevents", "vmevents-device-assignments")


class World(E2eWorld):
    through_knative = False  # the session plane and LocalKnative (the e2e suite runs through Knative's broker)


@pytest.fixture(scope="module", **e2e.backends_only())
def world(request):
    with World(*request.param) as w:
        yield w


def data(cluster):
    found = cluster.get("v1", "ConfigMap", *WHERE)
    return None if found is None else dict(found.get("data") or {})


def writes(cluster):
    return [r for r in cluster.requests if r.service_account == SA and r.resource == "configmaps"
            and r.verb in ("create", "update") and r.status < 300]


def test_kept_current_from_events_and_written_only_when_it_changes(world):
    w, device = world, f"{SEED_NODE}-000009001"
    a = w.create(seed_vm1("keep-a", host_devices=[host_device(device, "example.com/dev-7")]), run_strategy="Halted")
    eventually(lambda: (data(w.cluster) or {}).get(device) == f"default/{a} stopped", what="a has it")
    time.sleep(1.1)  # b is created a second later: a named it first
    b = w.create(seed_vm1("keep-b", host_devices=[host_device(device, "example.com/dev-7")]), run_strategy="Halted")
    eventually(lambda: (data(w.cluster) or {}).get(device) == f"default/{a} stopped default/{b}", what="b too")
    virtctl_start(w.cluster, "default", b)  # b runs with it now: it is b's
    eventually(lambda: (data(w.cluster) or {}).get(device) == f"default/{b} running default/{a}",
               what="the running one has it")
    w.settle()
    before, kept = len(writes(w.cluster)), data(w.cluster)
    w.tick()
    w.tick()
    # Every tick here is a full repair (DEVICE_REPAIR_EVERY=0s), whose one write stamps vmevents.io/repaired-at;
    # light ticks write nothing when nothing changed (test_light_tick.py).
    assert len(writes(w.cluster)) == before + 2, "nothing changed: only the repairs' stamps written"
    assert data(w.cluster) == kept


def test_the_rescan_repairs_drift_and_a_deleted_object_comes_back(world):
    w = world
    w.settle()
    good = data(w.cluster)
    assert good
    device = next(iter(good))
    broken = dict(good, **{device: "someone/else running"}, junk="x")
    found = w.cluster.get("v1", "ConfigMap", *WHERE)
    w.cluster.update(dict(found, data=broken))
    w.tick()
    assert data(w.cluster) == good
    w.cluster.delete("v1", "ConfigMap", *WHERE)
    w.tick()
    assert data(w.cluster) == good

"""io-pause-report end to end: the simulated API server (Longhorn objects validated against
upstream/longhorn/v1.10.0/crds.yaml), the simulated KubeVirt flapping a guest
Running↔Paused on IO errors with its resume backoff (at io_time_scale 0.01), the local broker
routing by the Trigger in deploy/, and the function running as a real functions-framework server
with the credentials of its own ServiceAccount. One world; each test uses its own VM names."""
from __future__ import annotations

import itertools
import json
import time

import pytest

from simcluster.builders.io_pause import GIB, LONGHORN_NS, make_engine, make_pv, make_pvc, make_volume
from tests import e2e
from tests.e2e import eventually
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION = "io-pause-report"
FUNCTION_SA = "vmevents/io-pause-report"
_names = itertools.count(1)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    function_sa = FUNCTION_SA

    def __init__(self, version: str, backend: str):
        super().__init__(version, backend=backend, kubevirt={"step_delay": 0.01, "io_time_scale": 0.01},
                         env_overrides={FUNCTION: {"IO_PAUSE_STUCK_AFTER": "3s", "IO_PAUSE_RESOLVED_AFTER": "8s"}})

    # -- the cast -----------------------------------------------------------------------------
    def vm(self, prefix="vm", *, driver="driver.longhorn.io", robustness="degraded", rebuilding=37):
        """A Running VM whose disk-0 is a PVC → PV → Longhorn volume (degraded, rebuilding a replica)."""
        name = f"{prefix}{next(_names)}"
        pv = f"pvc-{name}-0000"
        self.cluster.create(make_pvc(f"{name}-disk-0", pv))
        self.cluster.create(make_pv(pv, f"{name}-disk-0", driver=driver))
        if driver == "driver.longhorn.io":
            self.cluster.create(make_volume(pv, robustness=robustness))
            self.cluster.create(make_engine(pv, rebuilding=rebuilding))
        self.cluster.create({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"labels": {"harvesterhci.io/vmName": name}},
                "spec": {"domain": {"devices": {"disks": [{"name": "disk-0", "disk": {"bus": "virtio"}}]},
                                    "resources": {"requests": {"memory": "1365Mi"}}},
                         "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}}]}}}})
        self.wait_running(name)
        return name, pv

    def wait_running(self, name):
        return eventually(lambda: (v := self.vmi(name)) and (v.get("status") or {}).get("phase") == "Running" and v,
                          what=f"VMI {name} Running")

    def rebuild_done(self, pv):
        """Longhorn finished the rebuild: the volume is healthy, the engine rebuilds nothing."""
        self.cluster.patch("longhorn.io/v1beta2", "Volume", LONGHORN_NS, pv, {"status": {"robustness": "healthy"}},
                           subresource="status")
        self.cluster.patch("longhorn.io/v1beta2", "Engine", LONGHORN_NS, f"{pv}-e-0",
                           {"status": {"rebuildStatus": None}}, subresource="status")

    # -- what the function did ----------------------------------------------------------------
    def events(self, name, reason="IOErrorPause"):
        return [e for e in self.cluster.list("v1", "Event", "default")
                if e["involvedObject"]["name"] == name and e["reason"] == reason
                and (e.get("source") or {}).get("component") == FUNCTION]

    def kubevirt_count(self, name):
        return sum(e["count"] for e in self.cluster.list("v1", "Event", "default")
                   if e["involvedObject"]["name"] == name and e["reason"] == "IOerror")

    def findings(self, state, name):
        """The details (and advice) of every detected / resolved finding about this VMI, alone or inside a
        tick's `.scanned` summary."""
        found = []
        for event in list(self.knative.broker.received):
            if event["source"] != f"/vmevents/{FUNCTION}":
                continue
            data = e2e.data_of(event)
            found.extend(f for f in data.get("findings", [data]) if f.get("state") == state)
        return [dict(f["details"], advice=f["advice"]) for f in found if f["details"]["vmi"] == f"default/{name}"]

    def episode(self, name):
        """The details of the episode's finding Event, as they stand."""
        [event] = [e for e in self.events(name) if "vmevents.io/finding" in (e["metadata"].get("annotations") or {})]
        return json.loads(event["metadata"]["annotations"]["vmevents.io/finding"])


@pytest.fixture(scope="module", **e2e.backends_only())
def world(request):
    with World(*request.param) as w:
        yield w


def flap(world, name, pauses=4, **fault):
    world.kubevirt.start_io_errors("default", name, "disk-0", **fault)
    eventually(lambda: world.kubevirt.io_pauses("default", name) >= pauses, what=f"{pauses} pauses")


# -- rebuild-related: the seed KB's story --------------------------------------------------------
def test_a_flapping_vm_gets_one_report_with_a_rising_count_then_one_resolved(world):
    name, pv = world.vm()
    flap(world, name, pauses=4)
    world.kubevirt.stop_io_errors("default", name)
    eventually(lambda: world.kubevirt.io_pauses("default", name) == 0, what="the guest runs again")
    pauses = world.kubevirt_count(name)
    assert pauses >= 4
    for _ in range(3):  # ticks count any pause whose update arrived late
        world.tick()
    events = eventually(lambda: (e := world.events(name)) and e[0]["count"] == pauses and e,
                        what="the Event's count equals the pauses")
    assert len(events) == 1, "one report per episode, not one per pause"
    event = events[0]
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "VirtualMachine"
    assert "rebuild-related" in event["message"] and pv in event["message"] and "rebuilding 37%" in event["message"]
    # the function writes its Event before its reply reaches the broker (the CI rehearsal read none on the real
    # backend): wait for the notice, let the broker settle, then count
    eventually(lambda: world.findings("detected", name), what="the .detected notice")
    world.settle()
    detected = world.findings("detected", name)
    assert len(detected) == 1
    report = detected[0]
    assert report["category"] == "rebuild-related" and report["vm"] == f"default/{name}" and report["pauses"] >= 1
    assert report["volumes"] == [{"name": "disk-0", "pvc": f"{name}-disk-0", "pv": pv, "longhornVolume": pv,
                                  "robustness": "degraded", "rebuilding": True, "progress": 37}]
    assert any("fstrim.timer" in a for a in report["advice"]) and any("discard" in a for a in report["advice"])
    assert not world.findings("resolved", name), "still rebuilding: the episode goes on"

    world.rebuild_done(pv)
    world.tick()
    resolved = eventually(lambda: world.findings("resolved", name), what="resolved")
    assert len(resolved) == 1 and "rebuild completed" in resolved[0]["reason"]
    assert resolved[0]["pauses"] == pauses and resolved[0]["category"] == "rebuild-related"
    assert resolved[0]["volumes"] == report["volumes"]
    assert resolved[0]["reportedCategories"] == ["rebuild-related"]
    done = world.events(name, "IOErrorPauseResolved")
    assert len(done) == 1 and done[0]["type"] == "Normal"
    # kubectl describe vm: two rows, the story's two transitions (issue 34: the episode's own Event turned "Normal
    # IOErrorPause ×N"): the pauses as they were reported, and their end
    [kept] = world.events(name)
    assert (kept["type"], kept["count"], kept["message"]) == ("Warning", pauses, event["message"])
    assert "rebuild completed" in done[0]["message"] and done[0]["count"] == 1
    assert len([e for e in world.cluster.list("v1", "Event", "default") if e["involvedObject"]["name"] == name
                and (e.get("source") or {}).get("component") == FUNCTION]) == 2
    world.tick()
    assert len(world.findings("resolved", name)) == 1 and len(world.findings("detected", name)) == 1


def test_a_second_episode_of_the_same_vm_is_a_new_report_counting_from_one(world):
    name, pv = world.vm()
    flap(world, name, pauses=2)
    world.kubevirt.stop_io_errors("default", name)
    eventually(lambda: world.kubevirt.io_pauses("default", name) == 0, what="the guest runs again")
    world.settle()
    time.sleep(8.2)  # IO_PAUSE_RESOLVED_AFTER=8s without a pause (4s was too short for three ticks once a sixth
    #                  function shares each tick)
    world.tick()
    first = eventually(lambda: world.findings("resolved", name), what="resolved by quiet")
    assert "no pause for 8s" in first[0]["reason"]
    before = world.kubevirt_count(name)
    world.kubevirt.start_io_errors("default", name, "disk-0")
    eventually(lambda: len(world.findings("detected", name)) == 2, what="a new episode reported")
    world.kubevirt.stop_io_errors("default", name)
    second = world.findings("detected", name)[1]
    assert second["episodeStart"] != world.findings("detected", name)[0]["episodeStart"]
    assert second["pauses"] <= world.kubevirt_count(name) - before
    [event] = world.events(name)  # the same finding, reopened: its second episode
    assert event["metadata"]["annotations"]["vmevents.io/finding-episode"] == "2"


# -- the other categories ------------------------------------------------------------------------
def test_out_of_space_names_the_volume_and_its_size(world):
    name, pv = world.vm(robustness="healthy", rebuilding=None)
    flap(world, name, pauses=1, no_space=True)
    world.kubevirt.stop_io_errors("default", name)
    report = eventually(lambda: world.findings("detected", name), what="detected")[0]
    assert report["category"] == "out-of-space"
    assert any("10.0 GiB" in a and pv in a for a in report["advice"])
    assert any("not enough space on volume: disk-0" in a for a in report["advice"])
    assert report["volumes"][0]["robustness"] == "healthy" and 10 * GIB


def test_stuck_paused_escalates_once_then_a_stop_and_start_resolves_it(world):
    """Getting stuck is the same episode (issue 12: one firing, one resolved): no second notice; the
    finding's details and advice say it is stuck, and a plain Warning Event tells people."""
    name, pv = world.vm()
    flap(world, name, pauses=1, stuck=True)
    first = eventually(lambda: world.findings("detected", name), what="detected")[0]
    assert first["category"] == "rebuild-related"
    time.sleep(3.2)  # IO_PAUSE_STUCK_AFTER=3s, still paused
    world.tick()
    stuck = eventually(lambda: (d := world.episode(name)) and d["details"].get("stuck") and d, what="stuck-paused")
    assert stuck["details"]["reportedCategories"] == ["rebuild-related", "stuck-paused"]
    assert "Stop and start the VM" in stuck["advice"][0]
    assert len(world.events(name)) == 2  # the episode's finding Event and the plain one saying it is stuck
    world.tick()
    assert len(world.findings("detected", name)) == 1 and len(world.events(name)) == 2
    uid = world.vmi(name)["metadata"]["uid"]
    world.cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", name)  # what a stop and start does
    eventually(lambda: (v := world.vmi(name)) and v["metadata"]["uid"] != uid and v, what="a new VMI")
    world.tick()
    resolved = eventually(lambda: world.findings("resolved", name), what="resolved")
    assert len(resolved) == 1 and ("restarted" in resolved[0]["reason"] or "gone" in resolved[0]["reason"])
    assert resolved[0]["volumes"] == first["volumes"], "the same volumes: an alert keyed on them ends"


def test_a_volume_that_is_not_longhorn_is_unknown_storage_and_still_reported(world):
    name, pv = world.vm(driver="nfs.csi.k8s.io")
    flap(world, name, pauses=1)
    world.kubevirt.stop_io_errors("default", name)
    report = eventually(lambda: world.findings("detected", name), what="detected")[0]
    assert report["category"] == "unknown-storage"
    assert report["volumes"][0]["longhornVolume"] is None and "nfs.csi.k8s.io" in report["volumes"][0]["unknown"]


def test_longhorn_unreadable_is_unknown_storage_and_still_reported(world):
    name, pv = world.vm()
    fault = world.cluster.faults.add(path=f"/volumes/{pv}$", service_account=FUNCTION_SA, status=503, times=None)
    try:
        flap(world, name, pauses=1)
        world.kubevirt.stop_io_errors("default", name)
        # every read of the volume answered 503: the function's own retries come first (a loaded machine: 45 s)
        report = eventually(lambda: world.findings("detected", name), timeout=45, what="detected")[0]
    finally:
        world.cluster.faults.clear()
    assert report["category"] == "unknown-storage" and "could not be read" in report["volumes"][0]["unknown"]
    assert fault is not None


# -- pauses for other reasons --------------------------------------------------------------------
@pytest.mark.parametrize("reason", ["PausedByUser", "PausedByMigrationMonitor"])
def test_a_pause_for_another_reason_yields_nothing(world, reason):
    name, _ = world.vm()
    vmi = world.wait_running(name)
    conditions = vmi["status"]["conditions"] + [{"type": "Paused", "status": "True", "reason": reason,
                                                  "lastProbeTime": None, "lastTransitionTime": "2026-11-30T12:00:00Z"}]
    world.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", name,
                        {"status": {"conditions": conditions}})
    world.tick()
    assert not world.events(name) and not world.findings("detected", name)
    assert not [r for r in world.function_requests() if r.name == name], "not even a read"


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    """Last in this module: by now every path has run. Exactly the shipped permissions were used."""
    world.settle()
    denied = [r for r in world.function_requests() if not r.allowed]
    assert not denied, denied
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

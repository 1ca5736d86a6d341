"""One firing and one resolved message per episode, end to end (issue 12): the simulated cluster and KubeVirt,
every function of deploy/ behind the local broker, and alert-forwarder posting Slack-format messages to a
webhook receiver. The stories: Harvester issue #5081's device conflict with its VMI updated a dozen times and
re-scans; a VM pausing five times on IO errors; a pause stuck much longer than an episode; a failed migration
whose event is delivered three times."""
from __future__ import annotations

import itertools
import time

import pytest

from simcluster.alertmanager import Receiver
from simcluster.builders.devices import SEED_DEVICE, SEED_NODE, VF, host_device, prerequisites, seed_vm1, seed_vm2
from simcluster.builders.io_pause import make_engine, make_pv, make_pvc, make_volume
from simcluster.builders.migration import STUCK, create_guest, create_migration
from tests import e2e
from tests.e2e import eventually

pytestmark = pytest.mark.e2e
_names = itertools.count(1)


class World(e2e.World):
    """Every function, alert-forwarder posting Slack messages to `hook`."""

    def __init__(self, *, kubevirt=None, env=None, **world):
        self.hook = Receiver().start()
        overrides = {"alert-forwarder": {"WEBHOOK_URL": f"{self.hook.url}/slack", "WEBHOOK_FORMAT": "slack"},
                     **(env or {})}
        try:
            super().__init__(kubevirt=kubevirt, env_overrides=overrides, **world)
        except BaseException:
            self.hook.stop()
            raise

    def stop(self):
        super().stop()
        self.hook.stop()

    def messages(self, alertname, *words):
        """("firing" | "resolved") of every Slack message about that alert whose text or labels (the context
        block) name all these words, in the order they arrived."""
        found = []
        for body in self.hook.bodies("/slack"):
            text = body["text"] + " " + body["blocks"][1]["elements"][0]["text"]
            if f" {alertname} " in f"{body['text']} " and all(w in text for w in words):
                found.append("resolved" if "RESOLVED:" in body["text"] else "firing")
        return found

    def ticks(self, n=1):
        for _ in range(n):
            self.settle()
            self.knative.ping.tick()
        self.settle()

    def settle(self):
        for _ in range(2):
            self.knative.wait_idle(timeout=15)
            if self.kubevirt is not None:
                self.kubevirt.wait_idle(timeout=15)

    def phase(self, name):
        vmi = self.vmi(name)
        return vmi and (vmi.get("status") or {}).get("phase")


@pytest.fixture(scope="module")
def world():
    with World(kubevirt={"nodes": {SEED_NODE: {VF: 1, "example.com/dev-e": 1}}, "step_delay": 0.01,
                         "io_time_scale": 0.01},
               env={"io-pause-report": {"IO_PAUSE_STUCK_AFTER": "3s", "IO_PAUSE_RESOLVED_AFTER": "4s"}}) as w:
        yield w


@pytest.fixture(scope="module")
def migrations():
    """No KubeVirtSim: it does not model live migration, so the test plays KubeVirt's part."""
    with World() as w:
        yield w


def start_the_seed_conflict(w) -> None:
    """Harvester issue #5081's device story up to the conflict: vm1 powered off, vm2 running with its device."""
    for obj in prerequisites(seed_vm1()) + prerequisites(seed_vm2()):  # its disks' PVCs, its network's NAD
        if w.cluster.get(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) is None:
            w.cluster.create(obj)
    w.cluster.create(seed_vm1())
    eventually(lambda: w.phase("vm1") == "Running", what="vm1 Running")
    w.kubevirt.guest_power_off("default", "vm1")
    eventually(lambda: w.vmi("vm1") is None, what="vm1 stopped (KubeVirt >= 1.2 removes its VMI)")
    w.cluster.create(seed_vm2())
    eventually(lambda: w.phase("vm2") == "Running", what="vm2 Running with vm1's device")


def test_the_seed_conflict_is_one_firing_and_one_resolved(world):
    w = world
    start_the_seed_conflict(w)
    for i in range(12):  # the guest agent, interfaces, ...: each an update event of vm2's VMI
        w.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm2",
                        {"metadata": {"labels": {"vmevents.io/test-update": str(i)}}})
        time.sleep(0.02)
    w.ticks(3)
    assert w.messages("VMHostDeviceConflict") == ["firing"]
    assert w.messages("VMHostDeviceConflict", "conflict=taken-while-stopped", "vm=vm2") == ["firing"]
    w.kubevirt.guest_power_off("default", "vm2")  # vm2 stopped: nobody holds the device any more
    eventually(lambda: w.vmi("vm2") is None, what="vm2 stopped")
    w.ticks(2)
    assert w.messages("VMHostDeviceConflict", "conflict=taken-while-stopped") == ["firing", "resolved"]
    # Both VMs are stopped now and both name the device: that is another finding (double-assigned), its own
    # episode, told once too; editing vm2 to name another device ends it.
    assert w.messages("VMHostDeviceConflict", "conflict=double-assigned") == ["firing"]
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "vm2", {"spec": {"template": {"spec": {
        "domain": {"devices": {"hostDevices": [host_device(SEED_DEVICE + "9", VF)]}}}}}})
    w.ticks(2)
    assert w.messages("VMHostDeviceConflict", "conflict=double-assigned") == ["firing", "resolved"]
    assert len(w.messages("VMHostDeviceConflict")) == 4


def _io_vm(w, name):
    pv = f"pvc-{name}-0000"
    w.cluster.create(make_pvc(f"{name}-disk-0", pv))
    w.cluster.create(make_pv(pv, f"{name}-disk-0"))
    w.cluster.create(make_volume(pv, robustness="degraded"))
    w.cluster.create(make_engine(pv, rebuilding=37))
    w.cluster.create({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "disk-0", "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "1365Mi"}}},
            "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}}]}}}})
    eventually(lambda: w.phase(name) == "Running", what=f"{name} Running")
    return pv


def _rebuild_done(w, pv):
    w.cluster.patch("longhorn.io/v1beta2", "Volume", "longhorn-system", pv, {"status": {"robustness": "healthy"}},
                    subresource="status")
    w.cluster.patch("longhorn.io/v1beta2", "Engine", "longhorn-system", f"{pv}-e-0",
                    {"status": {"rebuildStatus": None}}, subresource="status")


def test_an_io_pause_episode_with_five_pauses_is_one_firing_and_one_resolved(world):
    w, name = world, f"flap{next(_names)}"
    pv = _io_vm(w, name)
    w.kubevirt.start_io_errors("default", name, "disk-0")
    eventually(lambda: w.kubevirt.io_pauses("default", name) >= 5, what="five pauses")
    w.kubevirt.stop_io_errors("default", name)
    eventually(lambda: w.kubevirt.io_pauses("default", name) == 0, what="the guest runs again")
    w.ticks(2)
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing"]
    _rebuild_done(w, pv)
    w.ticks(1)
    eventually(lambda: w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing", "resolved"],
               what="one firing, one resolved")
    w.ticks(2)
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing", "resolved"]


def test_a_pause_stuck_much_longer_than_an_episode_is_one_firing_and_one_resolved(world):
    w, name = world, f"stuck{next(_names)}"
    _io_vm(w, name)
    w.kubevirt.start_io_errors("default", name, "disk-0", stuck=True)
    eventually(lambda: w.kubevirt.io_pauses("default", name) >= 1, what="the pause")
    for _ in range(6):  # 12 s paused: four times IO_PAUSE_STUCK_AFTER, three times IO_PAUSE_RESOLVED_AFTER
        time.sleep(2)
        w.ticks(1)
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing"]
    uid = w.vmi(name)["metadata"]["uid"]
    w.cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", name)  # what a stop and start does
    eventually(lambda: (v := w.vmi(name)) and v["metadata"]["uid"] != uid, what="a new VMI")
    w.ticks(2)
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing", "resolved"]


def test_a_failed_migration_delivered_three_times_is_one_firing_and_one_resolved(migrations):
    w = migrations
    vm, vmi = create_guest(w.cluster, f"mig{next(_names)}", guest="2Gi")
    vmim = create_migration(w.cluster, "1.3", vmi, took=300, reason=STUCK.format(150))
    name = vmim["metadata"]["name"]
    eventually(lambda: w.messages("VMMigrationFailed", name), what="the firing message")
    for _ in range(2):  # the same update delivered twice more
        w.send(w.cluster.get("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default", name))
    w.ticks(2)
    assert w.messages("VMMigrationFailed", name) == ["firing"]
    create_migration(w.cluster, "1.3", vmi, took=20, phase="Succeeded")  # it migrates fine later
    w.ticks(2)
    assert w.messages("VMMigrationFailed", name) == ["firing", "resolved"]

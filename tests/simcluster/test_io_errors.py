"""The simulated KubeVirt's IO-error pauses (docs/facts.md §5): the guest flaps Running↔Paused with
KubeVirt's resume backoff, one counted `IOerror` Event per pause, until the storage recovers; a
stuck guest stays paused. Run at io_time_scale 0.01 so a 10 s backoff takes 0.1 s."""
from __future__ import annotations

import time

import pytest

from simcluster.apiserver import SimCluster
from simcluster.builders.io_pause import make_pvc
from simcluster.kubevirt.io_faults import PAUSED_IO_ERROR, io_error_message, io_resume_backoff
from simcluster.kubevirt.sim import KubeVirtSim


def test_the_resume_backoff_doubles_from_10s_to_at_most_3m():
    assert [io_resume_backoff(n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 180, 180]


def test_kubevirt_messages_name_the_volume():
    assert io_error_message("disk-0") == "VM Paused due to IO error at the volume: disk-0"
    assert io_error_message("disk-0", no_space=True) == "VM Paused due to not enough space on volume: disk-0"


def eventually(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def sim():
    cluster = SimCluster(kubevirt_version="1.3.1").start()
    kubevirt = KubeVirtSim(cluster, step_delay=0.01, io_time_scale=0.01).start()
    yield cluster, kubevirt
    kubevirt.stop()
    cluster.stop()


def running_vm(cluster, kubevirt, name):
    cluster.create(make_pvc(f"{name}-disk-0", f"pvc-{name}-disk-0"))  # KubeVirt starts no VMI without it
    cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"runStrategy": "Always", "template": {"spec": {
                        "domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
                        "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}}]}}}})
    eventually(lambda: (v := cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name))
               and (v.get("status") or {}).get("phase") == "Running", what="Running")


def paused(cluster, name):
    vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return any(c["type"] == "Paused" and c["status"] == "True" and c.get("reason") == "PausedIOError"
               and c.get("message") == "VMI was paused, low-level IO error detected"
               for c in (vmi.get("status") or {}).get("conditions") or [])


def io_events(cluster, name):
    return [e for e in cluster.list("v1", "Event", "default")
            if e["reason"] == "IOerror" and e["involvedObject"]["name"] == name]


def test_a_failing_volume_makes_the_guest_flap_with_one_counted_event(sim):
    cluster, kubevirt = sim
    running_vm(cluster, kubevirt, "flap1")
    kubevirt.start_io_errors("default", "flap1", "disk-0")
    seen_paused, seen_resumed = set(), set()
    deadline = time.monotonic() + 10
    while kubevirt.io_pauses("default", "flap1") < 3 and time.monotonic() < deadline:
        (seen_paused if paused(cluster, "flap1") else seen_resumed).add(kubevirt.io_pauses("default", "flap1"))
        time.sleep(0.01)
    assert kubevirt.io_pauses("default", "flap1") >= 3 and seen_paused and seen_resumed
    events = eventually(lambda: (e := io_events(cluster, "flap1")) and e[0]["count"] >= 3 and e, what="count 3")
    assert len(events) == 1  # one Event, its count rising (client-go's correlator)
    event = events[0]
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "VirtualMachineInstance"
    assert event["message"] == "VM Paused due to IO error at the volume: disk-0"
    vm = eventually(lambda: (v := cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "flap1"))
                    and v["status"].get("printableStatus") == "Paused" and v, what="VM shows Paused")
    assert vm["status"]["printableStatus"] == "Paused"
    kubevirt.stop_io_errors("default", "flap1")
    eventually(lambda: kubevirt.io_pauses("default", "flap1") == 0 and not paused(cluster, "flap1"), what="recovered")
    count = io_events(cluster, "flap1")[0]["count"]
    time.sleep(0.3)
    assert not paused(cluster, "flap1") and io_events(cluster, "flap1")[0]["count"] == count


def test_a_stuck_guest_stays_paused_and_a_restart_clears_it(sim):
    cluster, kubevirt = sim
    running_vm(cluster, kubevirt, "stuck1")
    kubevirt.start_io_errors("default", "stuck1", "disk-0", no_space=True, stuck=True)
    eventually(lambda: paused(cluster, "stuck1"), what="paused")
    time.sleep(0.5)  # many backoffs at this scale
    assert paused(cluster, "stuck1") and kubevirt.io_pauses("default", "stuck1") == 1
    assert io_events(cluster, "stuck1")[0]["message"] == "VM Paused due to not enough space on volume: disk-0"
    uid = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "stuck1")["metadata"]["uid"]
    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "stuck1")  # runStrategy Always: a new one
    vmi = eventually(lambda: (v := cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "stuck1"))
                     and v["metadata"]["uid"] != uid and (v.get("status") or {}).get("phase") == "Running" and v,
                     what="restarted")
    assert not paused(cluster, "stuck1") and kubevirt.io_pauses("default", "stuck1") == 0 and vmi


def test_only_a_running_guest_can_hit_an_io_error(sim):
    _, kubevirt = sim
    with pytest.raises(RuntimeError, match="not Running"):
        kubevirt.start_io_errors("default", "nobody", "disk-0")
    assert PAUSED_IO_ERROR["reason"] == "PausedIOError"

"""Findings outlive kube-apiserver's --event-ttl (issue 12): on a real control plane of its own with a 30 s
TTL, re-scans every few seconds (FINDING_RENEW_AFTER=10s), a device conflict and a pause stuck for five TTLs
each produce one firing message and, when they end, one resolved; restarting the functions in the middle
changes nothing. About three minutes of wall time."""
from __future__ import annotations

import json
import time
from unittest import mock

import pytest

from simcluster.builders.devices import SEED_DEVICE, SEED_NODE, VF, host_device
from tests import backends
from tests.e2e import eventually
from tests.functions.alert_forwarder.test_episodes import World, _io_vm, start_the_seed_conflict

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(480)]
TTL = 30.0
FINDINGS = ("device-conflict", "io-pause-report")


@pytest.fixture(scope="module")
def world():
    missing = backends.real_missing()
    if missing and not backends.in_ci():
        pytest.skip(f"real control plane: {missing}")
    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    plane = ControlPlane(event_ttl=f"{int(TTL)}s", die_with_parent=True).start()
    try:
        # The simulator's KubeVirt plays virt-controller on this plane of its own (the seed's devices and the
        # IO-error pauses are its stand-ins'); KubeVirt's own runs under the session's plane.
        cluster = RealCluster(plane, "1.3.1", virt_controller=False).start()
        renew = {"FINDING_RENEW_AFTER": "10s"}
        with World(kubevirt={"nodes": {SEED_NODE: {VF: 1}}, "step_delay": 0.01, "io_time_scale": 0.01},
                   env={"device-conflict": renew, "io-pause-report": {**renew, "IO_PAUSE_STUCK_AFTER": "20s",
                                                                       "IO_PAUSE_RESOLVED_AFTER": "20s"}},
                   backend=backends.REAL, cluster=cluster, knative_source=False) as w:
            yield w
    finally:
        plane.remove()


def _restart(w, name):
    """Stop the function's server and start it again on the same port (the broker's Triggers keep its URL)."""
    server = w.knative.functions[name]
    port = server.port
    server.stop()
    with mock.patch("localknative.serving.free_port", return_value=port):
        server.start()


def _open_events(w):
    return [e for e in w.cluster.list("v1", "Event", "default")
            if (e["metadata"].get("labels") or {}).get("vmevents.io/finding-state") == "open"]


def test_a_conflict_and_a_stuck_pause_lasting_five_ttls_are_told_once_each(world):
    w = world
    start_the_seed_conflict(w)
    name = "stuck1"
    _io_vm(w, name)
    w.kubevirt.start_io_errors("default", name, "disk-0", stuck=True)
    eventually(lambda: w.messages("VMHostDeviceConflict") and w.messages("VMPausedOnIOError", f"default/{name} "),
               timeout=30, what="both told")
    started, restarted = time.monotonic(), False
    while time.monotonic() - started < 5 * TTL:
        time.sleep(5)
        w.ticks(1)
        if not restarted and time.monotonic() - started > 2.5 * TTL:
            for function in FINDINGS:
                _restart(w, function)
            restarted = True
        assert {json_category(e) for e in _open_events(w)} >= {"taken-while-stopped", "rebuild-related"}, \
            "an open finding's Event expired"
    assert w.messages("VMHostDeviceConflict") == ["firing"]
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing"]
    # The ends: vm1 (the stopped VM naming vm2's device) is edited to name another one, and the stuck VM is
    # stopped and started.
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "vm1", {"spec": {"template": {"spec": {
        "domain": {"devices": {"hostDevices": [host_device(SEED_DEVICE + "9", VF)]}}}}}})
    uid = w.vmi(name)["metadata"]["uid"]
    w.cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    eventually(lambda: (v := w.vmi(name)) and v["metadata"]["uid"] != uid, what="a new VMI")

    def ended():
        w.ticks(1)
        return (w.messages("VMHostDeviceConflict") == ["firing", "resolved"]
                and w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing", "resolved"])

    eventually(ended, timeout=40, interval=1, what="one resolved message each")
    w.ticks(1)
    assert w.messages("VMHostDeviceConflict") == ["firing", "resolved"]
    assert w.messages("VMPausedOnIOError", f"default/{name} ") == ["firing", "resolved"]


def json_category(event):
    return json.loads(event["metadata"]["annotations"]["vmevents.io/finding"])["category"]

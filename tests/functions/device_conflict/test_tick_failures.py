"""One finding's failed write does not cost the others their notices (issue 26): a tick that opens two conflicts,
one of whose Events cannot be written, still replies the other's `.detected`, names the failure in its reason,
and the next tick opens the one that failed. device-conflict's own handler with its ServiceAccount's credentials,
on the simulator and on a real kube-apiserver; the failure is one refused Event create (a Kube that refuses it,
standing for an Event the API will not take: a quota, a namespace being deleted, an admission webhook)."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from functions.device_conflict import handler
from functions.device_conflict.settings import Settings
from shared.kinds import EVENT
from shared.kube import Invalid, Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.devices import host_device, vm
from tests import backends

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
SA = "vmevents/device-conflict"
RESOURCE = "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"
DEVICES = {"a": "harvester-ktmg4-000007101", "b": "harvester-ktmg4-000007102"}


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    for pair, device in DEVICES.items():
        c.create({"apiVersion": "devices.harvesterhci.io/v1beta1", "kind": "PCIDevice", "metadata": {"name": device},
                  "status": {"address": f"0000:07:10.{device[-1]}", "nodeName": "harvester-ktmg4",
                             "resourceName": RESOURCE, "vendorId": "8086", "deviceId": "10ed", "classId": "0200",
                             "description": "Intel VF", "kernelDriverInUse": "vfio-pci"}})
        for n in (1, 2):  # two stopped VMs naming one device: double-assigned
            obj = vm(f"fail-{pair}{n}", host_device(device, RESOURCE))
            obj["metadata"] = {"name": obj["metadata"]["name"], "namespace": "default"}
            obj["spec"]["runStrategy"] = "Halted"
            c.create(obj)
    yield c
    c.stop()


class RefusesOneEvent(Kube):
    """Refuses to create the finding Event on one VM, as the API would refuse an Event it will not take."""

    def __init__(self, cluster, vm_name: str):
        super().__init__(cluster.api_client(service_account=SA))
        self.vm_name, self.refused = vm_name, 0

    def create(self, kind, namespace, body):
        if kind is EVENT and (body.get("involvedObject") or {}).get("name") == self.vm_name \
                and body.get("reason") == handler.REASON:
            self.refused += 1
            raise Invalid(f"POST events: refused for {self.vm_name} (the test's stand-in for a refused Event)")
        return super().create(kind, namespace, body)


def context(kube: Kube) -> KubeContext:
    return KubeContext("device-conflict", Settings(), lambda: NOW, kube, Recorder(kube, "device-conflict"))


def found(outcome, state: str) -> set[str]:
    if outcome.reply is None:
        return set()
    return {f["details"]["device"] for f in outcome.reply.data["findings"] if f["state"] == state}


def test_a_tick_whose_one_finding_fails_still_announces_the_other_and_the_next_tick_the_rest(cluster):
    refusing = RefusesOneEvent(cluster, "fail-b1")
    outcome = handler.rescan(context(refusing), "tick-1")  # the parameter object is missing: a full repair
    assert refusing.refused >= 1, "the failure happened"
    assert found(outcome, "detected") == {DEVICES["a"]}, outcome.reason
    assert "1 failed, retried next tick" in outcome.reason and DEVICES["b"] in outcome.reason
    again = handler.rescan(context(Kube(cluster.api_client(service_account=SA))), "tick-2")
    assert DEVICES["b"] in found(again, "detected"), again.reason
    assert DEVICES["a"] not in found(again, "detected"), "announced once"

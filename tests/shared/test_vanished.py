"""An object deleted between a function's read and its write (issue 26): the write's 404 means "read again",
never a permanent 400 that the broker would dead-letter, and a delete of it is done. Asked of the simulator and
of a real kube-apiserver alike, with the credentials of a function's own ServiceAccount."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.configmaps import put, read
from shared.errors import http_answer
from shared.finding import DETECTED, Finding
from shared.kinds import EVENT
from shared.kube import Conflict, Kube, NotFound, Vanished
from shared.ledger import Ledger
from shared.recorder import Recorder, event_name
from tests import backends

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
SA = "vmevents/device-conflict"  # may get, create and patch Events, and get/update its parameter object
VM = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
      "metadata": {"name": "gone-vm", "namespace": "default", "uid": "u-gone"}}
FINDING = Finding("device-conflict", "taken-while-stopped", "/apis/kubevirt.io/v1/namespaces/default/"
                  "virtualmachines/gone-vm", "dev-1", {"namespace": "default", "vm": "gone-vm", "device": "dev-1"},
                  "warning", "someone holds dev-1", details={"device": "dev-1"})


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    yield c
    c.stop()


class DeletesAfterRead(Kube):
    """A Kube whose first GET of `name` is followed, before anything else, by someone deleting that object:
    the read-then-write window, made certain."""

    def __init__(self, cluster, kind, namespace, name):
        super().__init__(cluster.api_client(service_account=SA))
        self.cluster, self.target, self.done = cluster, (kind, namespace, name), False

    def get(self, kind, namespace, name):
        found = super().get(kind, namespace, name)
        if not self.done and (kind, namespace, name) == self.target and found is not None:
            self.done = True
            self.cluster.delete(kind.api_version, kind.kind, namespace, name)
        return found


def _event(cluster, name: str, count: int = 1) -> dict:
    return cluster.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
                           "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                              "name": "gone-vm", "namespace": "default"},
                           "reason": "Test", "message": "m", "type": "Normal", "count": count})


def test_a_patch_of_an_object_deleted_since_it_was_read_is_vanished_not_a_permanent_400(cluster):
    kube = Kube(cluster.api_client(service_account=SA))
    written = _event(cluster, "vanish-patch")
    cluster.delete("v1", "Event", "default", "vanish-patch")
    with pytest.raises(Vanished) as raised:
        kube.merge_patch(EVENT, "default", "vanish-patch", {
            "count": 2, "metadata": {"resourceVersion": written["metadata"]["resourceVersion"]}})
    assert isinstance(raised.value, Conflict), "every read-modify-write loop re-reads on it"
    assert http_answer(raised.value)[0] == 503, "retried by the broker, never dead-lettered as a 400"
    admin = Kube(cluster.api_client())  # no function deletes Events; vmi-cleanup's VMI delete goes the same way
    assert admin.delete(EVENT, "default", "vanish-patch", uid="x", resource_version="1") is False, \
        "a delete of what is gone is done"
    with pytest.raises(NotFound):  # a read of what is not there stays what it was
        kube.request("GET", EVENT.path("default", "vanish-patch"))


def test_a_put_of_a_configmap_deleted_since_it_was_read_is_vanished(cluster):
    where = ("vmevents", "vmevents-device-assignments")
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": where[1], "namespace": where[0]},
                    "data": {"a": "b"}})
    kube = Kube(cluster.api_client(service_account=SA))
    stored = read(kube, where)
    assert stored is not None
    cluster.delete("v1", "ConfigMap", *where)
    with pytest.raises(Vanished):
        put(kube, where, stored, {"a": "c"}, {}, managed_by="device-conflict")


def test_a_finding_whose_event_vanishes_between_read_and_patch_is_opened_again(cluster):
    setup = Ledger(Kube(cluster.api_client(service_account=SA)), "device-conflict", reason="HostDeviceConflict")
    assert setup.sighted(FINDING, VM, "ce-1", NOW) is not None
    name = next(e["metadata"]["name"] for e in cluster.list("v1", "Event", "default")
                if e["involvedObject"]["name"] == "gone-vm" and e["reason"] == "HostDeviceConflict")
    kube = DeletesAfterRead(cluster, EVENT, "default", name)
    notice = Ledger(kube, "device-conflict", reason="HostDeviceConflict").sighted(FINDING, VM, "ce-2", NOW)
    assert kube.done, "the Event was deleted between the read and the write"
    assert notice is not None and notice.transition == DETECTED, "read again: nothing there, so it opens anew"
    assert cluster.get("v1", "Event", "default", name) is not None
    cluster.delete("v1", "Event", "default", name)


def test_an_event_counted_again_after_it_vanished_is_recorded_anew(cluster):
    recorder = Recorder(Kube(cluster.api_client(service_account=SA)), "device-conflict")
    recorder.record(VM, "Warning", "Vanishing", "seen", NOW)
    name = event_name(VM, "Warning", "Vanishing", "seen")
    kube = DeletesAfterRead(cluster, EVENT, "default", name)
    Recorder(kube, "device-conflict")._record(VM, "Warning", "Vanishing", "seen", NOW)  # raises on failure
    assert kube.done
    assert cluster.get("v1", "Event", "default", name)["count"] == 1, "recorded anew, from one"

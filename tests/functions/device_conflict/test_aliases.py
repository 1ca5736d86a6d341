"""On a plain KubeVirt cluster a device's `name` is the VM's own alias (`gpu1`, `quickaccess1`: KubeVirt's example,
docs/facts.md §3), not a device (issue 26): two VMs calling their GPU `gpu1` share nothing. device-conflict tells
the two kinds of cluster apart by whether the API serves harvester/pcidevices' devices.harvesterhci.io, and on a
plain one stays quiet: no finding, a parameter object without entries (so the admission policy passes every VM),
light ticks that read nothing else. Its own handler with its ServiceAccount's credentials, on the simulator (told
not to serve that group) and on a real kube-apiserver (with those CRDs deleted for this module, then restored)."""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from controlplane import crds
from functions.device_conflict import handler, reads
from functions.device_conflict.settings import Settings
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from tests import backends

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
SA = "vmevents/device-conflict"
WHERE = ("vmevents", "vmevents-device-assignments")
GROUP = "devices.harvesterhci.io"


def _without_pcidevices(request):
    if request.param == backends.SIM:
        from simcluster.apiserver import SimCluster

        return SimCluster(unserved=(GROUP,)).start()
    cluster = backends.cluster(request.param, "1.3.1")
    names = [c["metadata"]["name"] for c in crds.manifest_crds() if c["spec"]["group"] == GROUP]
    for name in names:
        cluster._request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", allow=(404,))
    deadline = time.monotonic() + 60
    while cluster._request("GET", f"/apis/{GROUP}/v1beta1", allow=(404,)):
        assert time.monotonic() < deadline, f"{GROUP} still served 60 s after its CRDs were deleted"
        time.sleep(0.2)
    return cluster


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = _without_pcidevices(request)
    for name, devices in (("alias-a", {"gpus": [{"name": "gpu1", "deviceName": "nvidia.com/TU104GL_Tesla_T4"}]}),
                          ("alias-b", {"gpus": [{"name": "gpu1", "deviceName": "nvidia.com/TU104GL_Tesla_T4"}]}),
                          ("alias-c", {"hostDevices": [{"name": "quickaccess1", "deviceName": "intel.com/qat"}]}),
                          ("alias-d", {"hostDevices": [{"name": "quickaccess1", "deviceName": "intel.com/qat"}]})):
        c.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                  "metadata": {"name": name, "namespace": "default"},
                  "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": devices}}}}})
    yield c
    if request.param == backends.REAL:
        c.install_crds()  # the session's other modules run on a Harvester-like cluster again
    c.stop()


def context(cluster, now: datetime = NOW) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    return KubeContext("device-conflict", Settings(), lambda: now, kube, Recorder(kube, "device-conflict"))


def test_a_plain_kubevirt_cluster_is_told_apart_and_its_aliases_are_no_conflict(cluster):
    assert reads.discover(context(cluster).kube) == (reads.ALIASES, frozenset())
    repair = handler.rescan(context(cluster), "tick-1")  # no parameter object yet: a full repair
    assert repair.reply is None, repair.reply and repair.reply.data
    stored = cluster.get("v1", "ConfigMap", *WHERE)
    assert stored is not None and not stored.get("data"), "no entry: the admission policy passes every VM"
    assert stored["metadata"]["annotations"][reads.DEVICE_NAMES] == reads.ALIASES
    assert not [e for e in cluster.list("v1", "Event", "default") if e["reason"] == handler.REASON]


def test_an_event_about_a_vm_naming_an_alias_reads_no_other_vm(cluster):
    outcome = handler.check(handler.Target("default", "alias-b", frozenset({"gpu1"})), "/x", context(cluster), "e1")
    assert outcome.verdict == "no-conflict" and outcome.reply is None


def test_a_light_tick_on_a_plain_cluster_looks_at_nothing(cluster):
    later = NOW + timedelta(minutes=1)  # within DEVICE_REPAIR_EVERY of the repair above
    outcome = handler.rescan(context(cluster, later), "tick-2")
    assert outcome.reply is None and "per-VM aliases" in outcome.reason

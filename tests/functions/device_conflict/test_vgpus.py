"""On Harvester a `gpus[].name` is a device only when the cluster has a VGPUDevice of that name (issue 26):
harvester/pcidevices' webhook checks no GPU's name, so a VM may call its GPU `gpu1`, as upstream KubeVirt's
examples do, and two such VMs share nothing. device-conflict lists the VGPUDevices' names once per full repair,
keeps them on the parameter object, and counts a GPU name as a device only when it is one of them; events and light
ticks decide from the object, without another LIST. Its own handler with its ServiceAccount's credentials, on the
simulator and on a real kube-apiserver (the VGPUDevice CRD from upstream/harvester-pcidevices/crds.yaml)."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from functions.device_conflict import handler, reads
from functions.device_conflict.settings import Settings
from shared.kube import Kube
from shared.ledger import record_of
from shared.recorder import Recorder
from shared.runtime import KubeContext
from tests import backends

NOW = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
SA = "vmevents/device-conflict"
WHERE = ("vmevents", "vmevents-device-assignments")
VGPU = "harvester-kgd9c-000008004"  # named <node>-<PCI address>, as pcidevices names them
TYPE = "nvidia.com/NVIDIA_A2-4Q"    # the vGPU type's resource (deviceName)


def _vm(name: str, gpu: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {
                "gpus": [{"name": gpu, "deviceName": TYPE}]}}}}}}


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    if request.param == backends.SIM:
        from simcluster.apiserver import SimCluster

        c = SimCluster().start()
    else:
        c = backends.cluster(request.param, "1.3.1")
    # The shape of harvester/docs' vGPU page (docs/advanced/vgpusupport.md): a configured vGPU of an A2.
    c.create({"apiVersion": "devices.harvesterhci.io/v1beta1", "kind": "VGPUDevice", "metadata": {"name": VGPU},
              "spec": {"address": "0000:08:00.4", "enabled": True, "nodeName": "harvester-kgd9c",
                       "parentGPUDeviceAddress": "0000:08:00.0", "vGPUTypeName": "NVIDIA A2-4Q"}})
    for name, gpu in (("vgpu-a", VGPU), ("vgpu-b", VGPU), ("alias-a", "gpu1"), ("alias-b", "gpu1")):
        c.create(_vm(name, gpu))
    yield c
    c.stop()


def context(cluster, now: datetime = NOW) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    return KubeContext("device-conflict", Settings(), lambda: now, kube, Recorder(kube, "device-conflict"))


def _clear(cluster) -> None:
    if hasattr(cluster, "clear_requests"):
        cluster.clear_requests()
    else:
        cluster.requests.clear()


def _open_devices(cluster) -> dict[str, set[str]]:
    """Each open finding's device, with the VMs its Events are on."""
    found: dict[str, set[str]] = {}
    for event in cluster.list("v1", "Event", "default"):
        record = record_of(event)
        if record is not None and record.open:
            found.setdefault(str(record.finding.details.get("device")), set()).add(event["involvedObject"]["name"])
    return found


def _lists_of_vgpus(cluster) -> int:
    return sum(1 for r in cluster.requests if r.service_account == SA and r.resource == "vgpudevices"
               and r.verb == "list")


def test_a_repair_counts_a_vgpus_name_and_not_an_alias(cluster):
    _clear(cluster)
    repair = handler.rescan(context(cluster), "tick-1")  # no parameter object yet: a full repair
    assert _lists_of_vgpus(cluster) == 1, "one LIST of the vGPUs per full repair"
    assert set(_open_devices(cluster)) == {VGPU}, repair.reason
    stored = cluster.get("v1", "ConfigMap", *WHERE)
    assert json.loads(stored["metadata"]["annotations"][reads.VGPU_NAMES]) == [VGPU]
    assert not [k for k in (stored.get("data") or {}) if "gpu1" in k], "an alias is no entry: the policy passes it"


def test_an_event_about_a_vm_calling_its_gpu_by_an_alias_finds_no_conflict_and_lists_nothing(cluster):
    _clear(cluster)
    outcome = handler.check(handler.Target("default", "alias-b", frozenset({"gpu1"})), "/x", context(cluster), "e1")
    assert outcome.verdict == "no-conflict" and outcome.reply is None, outcome.reason
    shared = handler.check(handler.Target("default", "vgpu-b", frozenset({VGPU})), "/y", context(cluster), "e2")
    assert shared.verdict != "no-conflict", shared.reason
    assert _lists_of_vgpus(cluster) == 0 and not [r for r in cluster.requests if r.verb == "list"
                                                  and r.service_account == SA], "the object said which are vGPUs"


def test_a_light_tick_reads_the_vgpu_names_from_the_object(cluster):
    _clear(cluster)
    outcome = handler.rescan(context(cluster, NOW + timedelta(minutes=1)), "tick-2")  # within DEVICE_REPAIR_EVERY
    assert _lists_of_vgpus(cluster) == 0, outcome.reason
    found = _open_devices(cluster)
    assert set(found) == {VGPU} and found[VGPU] <= {"vgpu-a", "vgpu-b"}, outcome.reason


def test_a_gpu_name_that_becomes_a_vgpu_counts_from_the_next_repair(cluster):
    """A VGPUDevice created later (pcidevices found a new GPU): the next full repair lists it, and the two VMs
    naming it are in conflict."""
    cluster.create({"apiVersion": "devices.harvesterhci.io/v1beta1", "kind": "VGPUDevice", "metadata": {"name": "gpu1"},
                    "spec": {"address": "0000:09:00.4", "enabled": True, "nodeName": "harvester-kgd9c"}})
    handler.rescan(context(cluster, NOW + timedelta(hours=1)), "tick-3")  # past DEVICE_REPAIR_EVERY: a repair
    stored = cluster.get("v1", "ConfigMap", *WHERE)
    assert json.loads(stored["metadata"]["annotations"][reads.VGPU_NAMES]) == sorted([VGPU, "gpu1"])
    assert set(_open_devices(cluster)) == {VGPU, "gpu1"}

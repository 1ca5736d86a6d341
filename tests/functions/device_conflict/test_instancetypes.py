"""The devices an instancetype gives a VM (issue 26): device-conflict counts them as the VM's, from the
ControllerRevision KubeVirt recorded for the VM (what it applies at start), else from the instancetype object.

What KubeVirt's virt-controller does with a stopped VM naming an instancetype, on the simulator and on the real
virt-controller of two releases (v1.3: the revision's name in spec.instancetype.revisionName; v1.8.3: in
status.instancetypeRef), and what the function reads: its own handler with its ServiceAccount's credentials. The
end-to-end story (another VM takes the device: one notice, one resolution) is test_e2e.py's."""
from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from functions.device_conflict import handler, instancetypes
from functions.device_conflict.instancetypes import Given, Source
from functions.device_conflict.settings import Settings
from shared.kube import Kube
from shared.ledger import record_of
from shared.recorder import Recorder
from shared.runtime import KubeContext
from tests import backends
from tests.e2e import eventually

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
SA = "vmevents/device-conflict"
DEVICE, OTHER = "harvester-kgd9c-000004102", "harvester-kgd9c-000004103"  # <node>-<PCI address>, as pcidevices
RESOURCE = "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION"
API = "instancetype.kubevirt.io/v1beta1"


def _instancetype(name: str, device: str, cluster: bool = False) -> dict:
    return {"apiVersion": API, "kind": "VirtualMachineClusterInstancetype" if cluster else "VirtualMachineInstancetype",
            "metadata": {"name": name} | ({} if cluster else {"namespace": "default"}),
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "1Gi"},
                     "hostDevices": [{"name": device, "deviceName": RESOURCE}]}}


def _vm(name: str, instancetype: str | None = None, device: str | None = None, cluster: bool = False) -> dict:
    spec: dict = {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}
    if instancetype:
        kind = "VirtualMachineClusterInstancetype" if cluster else "VirtualMachineInstancetype"
        spec["instancetype"] = {"name": instancetype, "kind": kind}
    else:
        spec["template"]["spec"]["domain"] |= {"memory": {"guest": "1Gi"}}
    if device:
        spec["template"]["spec"]["domain"]["devices"]["hostDevices"] = [{"name": device, "deviceName": RESOURCE}]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _recorded(vm: dict | None) -> str:
    if not vm:
        return ""
    return (vm["spec"].get("instancetype") or {}).get("revisionName") or (
        ((vm.get("status") or {}).get("instancetypeRef") or {}).get("controllerRevisionRef") or {}).get("name") or ""


PARAMS = [pytest.param((b.values[0], v), id=f"{b.id}-{v}", marks=b.marks)
          for b in backends.params() for v in ("1.3.1", "1.8.3")]


@pytest.fixture(scope="module", params=PARAMS)
def cluster(request):
    backend, version = request.param
    if backend == backends.SIM:
        from simcluster.apiserver import SimCluster
        from simcluster.kubevirt.sim import KubeVirtSim

        c = SimCluster(kubevirt_version=version).start()
        c.kubevirt_sim = KubeVirtSim(c, version=version).start()
    else:
        c = backends.cluster(backend, version)
    c.version = version
    # Harvester's device API (discovery): names are devices here (docs/facts.md §3).
    c.create(_instancetype("it-pci", DEVICE))
    c.create(_instancetype("cit-pci", OTHER, cluster=True))
    for vm in (_vm("it-a", "it-pci"), _vm("cit-a", "cit-pci", cluster=True)):
        c.create(vm)
    for name in ("it-a", "cit-a"):
        eventually(lambda n=name: _recorded(c.get("kubevirt.io/v1", "VirtualMachine", "default", n)), timeout=60,
                   what=f"KubeVirt recorded {name}'s instancetype revision")
    yield c
    if getattr(c, "kubevirt_sim", None) is not None:
        c.kubevirt_sim.stop()
    c.stop()


def context(cluster) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    return KubeContext("device-conflict", Settings(), lambda: NOW, kube, Recorder(kube, "device-conflict"))


def _clear(cluster) -> None:
    if hasattr(cluster, "clear_requests"):
        cluster.clear_requests()
    else:
        cluster.requests.clear()


def _mine(cluster, verb: str, resource: str) -> list:
    return [r for r in cluster.requests if r.service_account == SA and r.verb == verb and r.resource == resource]


# -- what KubeVirt does with a stopped VM that names an instancetype ----------------------------------------------
def test_kubevirt_stores_the_revision_of_a_halted_vm_before_it_ever_starts(cluster):
    vm = cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "it-a")
    name = _recorded(vm)
    where = "spec" if vm["spec"]["instancetype"].get("revisionName") else "status"
    assert where == ("status" if cluster.version >= "1.5" else "spec"), vm
    assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "it-a") is None, "it never started"
    revision = cluster.get("apps/v1", "ControllerRevision", "default", name)
    assert revision["metadata"]["labels"][instancetypes.OBJECT_NAME_LABEL] == "it-pci"
    assert revision["metadata"]["labels"][instancetypes.OBJECT_KIND_LABEL] == "VirtualMachineInstancetype"
    assert [o["kind"] for o in revision["metadata"]["ownerReferences"]] == ["VirtualMachine"]
    assert revision["data"]["kind"] == "VirtualMachineInstancetype" and revision["data"]["apiVersion"] == API
    assert revision["data"]["spec"]["hostDevices"] == [{"name": DEVICE, "deviceName": RESOURCE}]


# -- what device-conflict reads -----------------------------------------------------------------------------------
def _open(cluster) -> dict[str, set[str]]:
    """Each open finding's device, with the VMs it names."""
    found: dict[str, set[str]] = {}
    for event in cluster.list("v1", "Event", "default"):
        record = record_of(event)
        if record is not None and record.open:
            details = record.finding.details
            found.setdefault(str(details.get("device")), set()).update(
                str(vm).split("/")[1] for vm in [*(details.get("blocked") or ()), details.get("holder")] if vm)
    return found


def test_a_repair_counts_an_instancetypes_device_with_one_list_of_each_kind(cluster):
    """Two stopped VMs, one naming DEVICE in its template, one through its instancetype: double-assigned. The
    repair lists instancetypes, cluster instancetypes and revisions once each, and GETs none of them."""
    cluster.create(_vm("tmpl-a", device=DEVICE))
    cluster.create(_vm("tmpl-b", device=OTHER))
    _clear(cluster)
    outcome = handler.rescan(context(cluster), "tick-1")  # no parameter object yet: a full repair
    assert _open(cluster) == {DEVICE: {"it-a", "tmpl-a"}, OTHER: {"cit-a", "tmpl-b"}}, outcome.reason
    for resource in ("virtualmachineinstancetypes", "virtualmachineclusterinstancetypes", "controllerrevisions"):
        assert len(_mine(cluster, "list", resource)) == 1, resource
        assert not _mine(cluster, "get", resource), resource
    data = cluster.get("v1", "ConfigMap", "vmevents", "vmevents-device-assignments")["data"]
    assert "default/it-a" in json.dumps(data), "the parameter object assigns the instancetype's device too"


def test_the_revision_wins_over_an_instancetype_edited_since(cluster):
    """The instancetype now gives another device: KubeVirt applies the revision it recorded, so the VM still names
    DEVICE, for an event (one GET of the revision, none of the instancetype) as for the repair."""
    cluster.patch(API, "VirtualMachineInstancetype", "default", "it-pci",
                  {"spec": {"hostDevices": [{"name": "harvester-kgd9c-000004109", "deviceName": RESOURCE}]}})
    _clear(cluster)
    outcome = handler.check(handler.Target("default", "it-a"), "/x", context(cluster), "e1")
    assert outcome.verdict != "no-conflict", outcome.reason
    assert len(_mine(cluster, "get", "controllerrevisions")) == 1
    assert not _mine(cluster, "get", "virtualmachineinstancetypes")
    assert not [r for r in cluster.requests if r.service_account == SA and r.verb == "list"], "an event lists nothing"


def test_a_vm_without_an_instancetype_costs_no_instancetype_read(cluster):
    """Two VMs sharing a device of their own templates, neither naming an instancetype: an event about one reads both
    and no instancetype or revision."""
    lone = "harvester-kgd9c-000004105"
    for name in ("lone-a", "lone-b"):
        cluster.create(_vm(name, device=lone))
        handler.check(handler.Target("default", name, frozenset({lone})), "/y", context(cluster), f"e-{name}")
    _clear(cluster)
    outcome = handler.check(handler.Target("default", "lone-a", frozenset({lone})), "/y", context(cluster), "e2")
    assert outcome.verdict != "no-conflict", outcome.reason
    assert not [r for r in cluster.requests if r.service_account == SA and (
        r.resource == "controllerrevisions" or r.api_group == instancetypes.GROUP)]


# -- pure: which spec counts, and the raw-bytes pre-check -----------------------------------------------------------
def _given(objects: dict) -> Given:
    return Given(lambda sources: {s: objects.get(s) for s in sources})


def _revision(device: str, name: str = "it-pci") -> dict:
    return {"metadata": {"labels": {instancetypes.OBJECT_NAME_LABEL: name}},
            "data": {"apiVersion": API, "kind": "VirtualMachineInstancetype", "spec": {
                "hostDevices": [{"name": device, "deviceName": RESOURCE}]}}}


def test_the_recorded_revision_first_then_the_object():
    vm = _vm("a", "it-pci")
    obj = {"spec": {"gpus": [{"name": OTHER, "deviceName": RESOURCE}]}}
    at = Source(instancetypes.NAMESPACED, "default", "it-pci")
    assert _given({at: obj}).spec_for(vm) == obj["spec"], "no revision recorded: the object"
    vm["spec"]["instancetype"]["revisionName"] = "a-it-pci-1"
    given = _given({Source(instancetypes.REVISION, "default", "a-it-pci-1"): _revision(DEVICE), at: obj})
    assert given.spec_for(vm)["hostDevices"][0]["name"] == DEVICE and given.reads == 1
    status_vm = _vm("a", "it-pci") | {"status": {"instancetypeRef": {"controllerRevisionRef": {"name": "r"}}}}
    other = _given({Source(instancetypes.REVISION, "default", "r"): _revision(DEVICE, "another"), at: obj})
    assert other.spec_for(status_vm) == obj["spec"], "a status revision of another instancetype does not count"


def test_the_pre_check_decodes_a_vm_whose_only_device_source_is_its_instancetype():
    """A status write (generation observed) of a VM naming no device of its own but an instancetype: decoded (main
    dropped it undecoded), and a look only when the parameter object names the VM."""
    vm = _vm("a", "it-pci") | {"metadata": {"name": "a", "namespace": "default", "generation": 2},
                               "status": {"observedGeneration": 2}}
    headers = {"ce-type": "dev.knative.apiserver.resource.update", "ce-kind": "VirtualMachine"}
    assert handler.worth_decoding(headers, json.dumps(vm).encode(), Settings())


def test_an_event_about_a_vm_naming_only_an_instancetype_is_a_look():
    """A spec edit: a full look (its instancetype may give it a device; main took it for an edit that could only free
    entries). A status write: a look only if the parameter object names the VM (edited)."""
    from shared.intake import Incoming

    def event(obj):
        return Incoming(id="1", type="dev.knative.apiserver.resource.update", source="s", data=obj,
                        extensions={"kind": "VirtualMachine"})
    edit = _vm("a", "it-pci") | {"metadata": {"name": "a", "namespace": "default", "generation": 3},
                                 "status": {"observedGeneration": 2}}
    found = handler.target(event(edit), Settings(), NOW)
    assert found is not None and found.devices is None and not found.edited
    status = edit | {"status": {"observedGeneration": 3}}
    found = handler.target(event(status), Settings(), NOW)
    assert found is not None and found.edited

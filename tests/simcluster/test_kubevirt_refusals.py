"""KubeVirt starts no guest whose PVC or NetworkAttachmentDefinition is missing: asked of both backends.

KubeVirt's VMI controller creates no launcher pod while a PVC the VMI names does not exist (`FailedPvcNotFound`,
"PVC ns/name does not exist, waiting for it to appear", pkg/virt-controller/watch/vmi/datavolumes.go; the VM reads
ErrorPvcNotFound), nor while a Multus network's NetworkAttachmentDefinition is missing (the launch manifest cannot
be rendered: Synchronized=False `FailedCreate`, "failed to render launch manifest: Failed to locate network
attachment definition ns/name", v1.3.0 pkg/virt-controller/network/render.go, lower-case "failed" from v1.4.0,
pkg/network/multus/nad.go). Once the object appears, it starts. The simulator started such a VMI anyway (unless
told to read PVCs); it now refuses as KubeVirt does.
"""
from __future__ import annotations

import itertools
import json

import pytest

from tests.e2e import eventually, kubevirt_versions
from tests.simcluster.test_kubevirt_fidelity import KUBEVIRT, World

pytestmark = pytest.mark.e2e
_names = itertools.count(1)


@pytest.fixture(scope="module", **kubevirt_versions("1.3.1", "1.8.3"))
def world(request):
    w = World(*request.param)
    yield w
    w.stop()


def _vm(world, *, claim: str | None = None, nad: str | None = None) -> str:
    name = f"refused{next(_names)}"
    spec: dict = {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}
    if claim:
        spec["volumes"] = [{"name": "disk-0", "persistentVolumeClaim": {"claimName": claim}}]
    if nad:
        spec["domain"]["devices"]["interfaces"] = [{"name": "default", "bridge": {}}]
        spec["networks"] = [{"name": "default", "multus": {"networkName": f"default/{nad}"}}]
    world.cluster.create({"apiVersion": KUBEVIRT, "kind": "VirtualMachine",
                          "metadata": {"name": name, "namespace": "default"},
                          "spec": {"runStrategy": "Always", "template": {"spec": spec}}})
    return name


def _synchronized(world, name: str) -> dict | None:
    vmi = world.vmi(name) or {}
    return next((c for c in (vmi.get("status") or {}).get("conditions") or [] if c.get("type") == "Synchronized"
                 and c.get("status") == "False"), None)


def _no_launcher_pod(world, name: str) -> None:
    vmi = world.vmi(name)
    assert vmi is not None and (vmi.get("status") or {}).get("phase") in (None, "", "Pending"), vmi
    assert not world.launcher_pods(vmi), "a launcher pod was created for a VMI KubeVirt cannot start"


def test_a_missing_pvc_keeps_the_guest_from_starting_until_it_appears(world):
    claim = f"absent-{next(_names)}"
    name = _vm(world, claim=claim)
    condition = eventually(lambda: _synchronized(world, name), what="Synchronized=False", timeout=30)
    assert condition["reason"] == "FailedPvcNotFound"
    assert f"PVC default/{claim} does not exist, waiting for it to appear" in condition["message"]
    eventually(lambda: world.get_vm(name).get("status", {}).get("printableStatus") == "ErrorPvcNotFound",
               what="the VM ErrorPvcNotFound", timeout=30)
    _no_launcher_pod(world, name)
    world.cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                          "metadata": {"name": claim, "namespace": "default"},
                          "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}},
                                   "volumeName": f"pv-{claim}"},
                          "status": {"phase": "Bound"}})
    world.running(name)


def test_a_missing_network_attachment_definition_keeps_the_guest_from_starting_until_it_appears(world):
    nad = f"absent-net-{next(_names)}"
    name = _vm(world, nad=nad)
    condition = eventually(lambda: _synchronized(world, name), what="Synchronized=False", timeout=30)
    word = "Failed" if world.version.startswith(("1.1.", "1.3.")) else "failed"
    assert condition["reason"] == "FailedCreate"
    assert condition["message"] == (f"failed to render launch manifest: {word} to locate network attachment "
                                    f"definition default/{nad}")
    _no_launcher_pod(world, name)
    world.cluster.create({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                          "metadata": {"name": nad, "namespace": "default"},
                          "spec": {"config": json.dumps({"cniVersion": "0.3.1", "name": nad, "type": "bridge"})}})
    world.running(name)

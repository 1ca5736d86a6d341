"""KubeVirt's virt-controller on the real control plane: built per version from kubevirt.io/kubevirt, installed
with what virt-operator's own code generates for it (the vendored YAML is checked against that code's output),
running with its own ServiceAccount and ClusterRole, not the admin's, and listening on loopback only."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from controlplane import build
from controlplane import kubevirt as virt_controller
from tests import backends

real = [pytest.mark.real, pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                             reason=f"real control plane: {backends.real_missing()}")]
SA = f"{virt_controller.NAMESPACE}/{virt_controller.SERVICE_ACCOUNT}"


def test_each_requested_version_runs_the_virt_controller_of_its_minor_release():
    assert virt_controller.controller_version("1.8.3") == "v1.8.3"
    assert virt_controller.controller_version("1.1.1") == "v1.1.1"
    assert virt_controller.controller_version("1.3.1") == "v1.3.0"  # v1.3.1 is not served by the module proxy
    with pytest.raises(virt_controller.VirtControllerError, match="no virt-controller is built for KubeVirt 1.2.0"):
        virt_controller.controller_version("1.2.0")


@pytest.mark.built
@pytest.mark.parametrize("version", build.KUBEVIRT_VERSIONS)
def test_the_vendored_manifests_are_what_virt_operators_code_generates(version):
    """upstream/kubevirt/<version>/*.yaml == `kubevirt-manifests` built from kubevirt.io/kubevirt at <version>."""
    if backends.real_missing() is not None and not backends.in_ci():
        pytest.skip(f"needs the built generator: {backends.real_missing()}")
    generator = build.ensure(build.KUBEVIRT[version]) / "kubevirt-manifests"
    for kind, name in (("crds", "crds.yaml"), ("rbac", "virt-controller-rbac.yaml")):
        printed = subprocess.run([str(generator), kind, virt_controller.NAMESPACE], capture_output=True,
                                 text=True, check=True, timeout=60).stdout
        assert printed == (virt_controller.manifests_dir(version) / name).read_text(), \
            f"upstream/kubevirt/{version}/{name} differs from what its generator prints (upstream/README.md)"


@pytest.mark.parametrize("version", build.KUBEVIRT_VERSIONS)
def test_the_crd_set_is_the_whole_of_kubevirts(version):
    names = {c["metadata"]["name"] for c in virt_controller.crds(version)}
    assert {"virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io", "kubevirts.kubevirt.io",
            "virtualmachineinstancemigrations.kubevirt.io", "virtualmachinepools.pool.kubevirt.io",
            "virtualmachinesnapshots.snapshot.kubevirt.io", "virtualmachineclones.clone.kubevirt.io",
            "virtualmachineinstancetypes.instancetype.kubevirt.io"} <= names
    vmi = next(c for c in virt_controller.crds(version) if c["metadata"]["name"].startswith("virtualmachineinstances."))
    assert all("status" not in (v.get("subresources") or {}) for v in vmi["spec"]["versions"])


@pytest.fixture(scope="module")
def cluster():
    from controlplane.cluster import RealCluster

    c = RealCluster(backends.control_plane(), "1.8.3").start()
    yield c
    c.stop()


@pytest.mark.parametrize("_", [pytest.param(None, marks=real, id="real")])
def test_it_runs_as_its_own_service_account_with_virt_operators_role_not_admin(cluster, _):
    controller = cluster.virt_controller
    assert controller is not None and controller.running() and controller.version == "v1.8.3"
    config = yaml.safe_load(Path(cluster.kubeconfig(service_account=SA)).read_text())
    assert "token" in config["users"][0]["user"] and "client-key" not in config["users"][0]["user"]
    cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": "as-itself", "namespace": "default"},
                    "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}})
    from tests.e2e import eventually

    eventually(lambda: [r for r in cluster.requests if r.service_account == SA and r.resource == "virtualmachines"
                        and r.verb in ("update", "patch") and r.name == "as-itself"],
               what="virt-controller writing the VM as its ServiceAccount", timeout=30)
    binding = cluster.raw("GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kubevirt-controller")
    assert binding["roleRef"]["name"] == "kubevirt-controller"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kubevirt-controller", "namespace": "kubevirt"}]
    review = cluster.raw("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "system:serviceaccount:kubevirt:kubevirt-controller",
                 "resourceAttributes": {"verb": "create", "group": "rbac.authorization.k8s.io",
                                        "resource": "clusterroles"}}})
    assert review["status"]["allowed"] is False


@pytest.mark.parametrize("_", [pytest.param(None, marks=real, id="real")])
def test_it_listens_on_loopback_only(cluster, _):
    pid = cluster.virt_controller.process.pid
    sockets = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout.splitlines()
    mine = [line.split()[3] for line in sockets if f"pid={pid}," in line]
    assert mine and all(address.startswith("127.0.0.1:") for address in mine), mine

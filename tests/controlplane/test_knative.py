"""Knative 1.21 itself on the real control plane: its webhooks admit (validate and default) every overlay of
deploy/ and refuse what Knative refuses, and its own sources' adapters deliver through its broker — an
ApiServerSource's adapter run from the Deployment Knative's controller wrote, PingSource's mtping."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from controlplane.cluster import RealClusterError, kubectl
from simcluster.paths import DEPLOY_DIR
from tests import backends
from tests.delivery import Recorder, session_knative, trigger

pytestmark = [pytest.mark.real, pytest.mark.timeout(900),
              pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                 reason=f"real control plane: {backends.real_missing()}")]
KNATIVE_KINDS = {"Broker", "Trigger", "Service", "ApiServerSource", "PingSource"}
OVERLAYS = sorted(p.name for p in (DEPLOY_DIR / "overlays").iterdir())


@pytest.fixture(scope="module")
def knative():
    plane, cluster, knative = session_knative()
    return knative


def _rendered(overlay: str, namespace: str, kinds: set[str]) -> list[dict]:
    """The overlay's objects of those kinds, moved into `namespace` (so that admission sees a create)."""
    text = kubectl("kustomize", str(DEPLOY_DIR / "overlays" / overlay), kubeconfig=_kubeconfig())
    docs = [d for d in yaml.safe_load_all(text) if d and d["kind"] in kinds
            and (d["kind"] == "ServiceAccount" or d["apiVersion"].split("/")[0].endswith("knative.dev"))]
    for d in docs:
        d["metadata"]["namespace"] = namespace
    return docs


def _kubeconfig():
    return session_knative()[0].admin_kubeconfig


def _create_dry_run(docs: list[dict]) -> list[dict]:
    out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", kubeconfig=_kubeconfig(),
                  stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    decoder, objects, at = json.JSONDecoder(), [], 0
    while out[at:].strip():  # kubectl prints one JSON document per object
        at += len(out[at:]) - len(out[at:].lstrip())
        obj, at = decoder.raw_decode(out, at)
        objects += obj.get("items", [obj])
    return objects


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_is_admitted_by_knatives_webhooks(knative, overlay):
    namespace = f"admit-{overlay}"
    knative.api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": namespace}}, allow=(409,))
    # Serving's webhook dry-runs each Service's pod, which names the function's ServiceAccount
    for account in _rendered(overlay, namespace, {"ServiceAccount"}):
        knative.api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", account, allow=(409,))
    docs = _rendered(overlay, namespace, KNATIVE_KINDS)
    assert {d["kind"] for d in docs} == KNATIVE_KINDS
    admitted = _create_dry_run(docs)
    assert len(admitted) == len(docs)


def test_the_webhooks_are_in_the_path(knative):
    """A manifest only Knative's code refuses (the schema accepts both) fails, with each webhook's name."""
    bad_trigger = trigger("two-keys", "fn")
    bad_trigger["metadata"]["namespace"] = "default"
    bad_trigger["spec"]["filters"] = [{"exact": {"type": "a"}, "prefix": {"source": "b"}}]  # one dialect each
    with pytest.raises(RealClusterError, match='admission webhook "validation.webhook.eventing.knative.dev"'):
        _create_dry_run([bad_trigger])
    bad_service = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                   "metadata": {"name": "slow", "namespace": "default"},
                   "spec": {"template": {"spec": {"timeoutSeconds": 100000,
                                                  "containers": [{"image": "example.com/fn:1"}]}}}}
    with pytest.raises(RealClusterError, match='admission webhook "validation.webhook.serving.knative.dev"'):
        _create_dry_run([bad_service])


@pytest.mark.parametrize("filters", [
    pytest.param([{"exact": {"type": "a"}, "prefix": {"type": "b"}}], id="two-dialects"),
    pytest.param([{"any": [{"exact": {"type": "a"}, "suffix": {"kind": "d"}}]}], id="nested-two-dialects"),
    pytest.param([{"exact": {"Type": "a"}}], id="attribute-name-case"),
    pytest.param([{"exact": {"type": "a", "kind": "Pod"}}], id="two-keys-in-exact"),
    pytest.param([{"all": [{"exact": {"type": "a"}}, {"not": {"prefix": {"subject": "/x"}}}]}], id="nested-ok"),
])
def test_the_local_broker_judges_triggers_as_knatives_webhook(knative, filters):
    from localknative.broker import TriggerError, validate_trigger

    t = trigger("judged", "fn")
    t["metadata"]["namespace"] = "default"
    t["spec"]["filters"] = filters
    try:
        _create_dry_run([t])
        knative_accepts = True
    except RealClusterError as exc:
        assert 'admission webhook "validation.webhook.eventing.knative.dev"' in str(exc)
        knative_accepts = False
    try:
        validate_trigger(t)
        local_accepts = True
    except TriggerError:
        local_accepts = False
    assert local_accepts == knative_accepts


def test_what_runs_is_what_the_webhooks_defaulted(knative):
    """deploy/ was applied through the webhooks: the stored objects carry Knative's defaults."""
    service = knative.api.get("/apis/serving.knative.dev/v1/namespaces/vmevents/services/vmi-cleanup")
    template = service["spec"]["template"]["spec"]
    assert template["containers"][0]["name"] == "user-container"          # Serving's defaulting webhook
    assert "timeoutSeconds" in template
    trig = knative.api.get("/apis/eventing.knative.dev/v1/namespaces/vmevents/triggers/vmi-cleanup")
    assert trig["metadata"]["labels"]["eventing.knative.dev/broker"] == "default"  # Eventing's
    assert trig["spec"]["subscriber"]["ref"]["namespace"] == "vmevents"


def test_an_apiserversource_delivers_through_the_broker(knative):
    """Knative's controller writes the adapter's Deployment; the stand-in kubelet runs it; the adapter sends
    each change to the broker ingress; the channel and the filter deliver it to the Trigger's subscriber."""
    namespace = "source-test"
    api = knative.api
    api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": namespace}}, allow=(409,))
    fn = Recorder("fn")
    try:
        knative.serve(namespace, "fn", fn.port)
        api.create({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                    "metadata": {"name": "fn", "namespace": namespace},
                    "spec": {"template": {"spec": {"containers": [{"image": "example.com/fn:1"}]}}}})
        api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "src", "namespace": namespace}})
        api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": "src", "namespace": namespace},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]})
        api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": "src", "namespace": namespace},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "src"},
                    "subjects": [{"kind": "ServiceAccount", "name": "src", "namespace": namespace}]})
        api.create({"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                    "metadata": {"name": "default", "namespace": namespace}, "spec": {}})
        t = trigger("fn", "fn", type="dev.knative.apiserver.resource.add")
        t["metadata"]["namespace"] = namespace
        api.create(t)
        api.create({"apiVersion": "sources.knative.dev/v1", "kind": "ApiServerSource",
                    "metadata": {"name": "cms", "namespace": namespace},
                    "spec": {"mode": "Resource", "serviceAccountName": "src",
                             "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                                            "selector": {"matchLabels": {"watched": "yes"}}}],
                             "sink": {"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                                              "name": "default"}}}})
        api.create({"apiVersion": "sources.knative.dev/v1", "kind": "PingSource",
                    "metadata": {"name": "tick", "namespace": namespace},
                    "spec": {"schedule": "*/2 * * * * *", "data": '{"tick": true}',
                             "sink": {"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                                              "name": "default"}}}})
        t2 = trigger("ticks", "fn", type="dev.knative.sources.ping")
        t2["metadata"]["namespace"] = namespace
        api.create(t2)
        for kind, name in (("Broker", "default"), ("Trigger", "fn"), ("Trigger", "ticks")):
            knative.wait_ready("eventing.knative.dev/v1", kind, namespace, name)
        knative.wait_ready("sources.knative.dev/v1", "ApiServerSource", namespace, "cms", timeout=90)
        time.sleep(2)  # the adapter's informer has listed (it ignores what exists when it starts)
        api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "hello", "namespace": namespace, "labels": {"watched": "yes"}}, "data": {"a": "b"}})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                "dev.knative.apiserver.resource.add" in fn.types() and "dev.knative.sources.ping" in fn.types()):
            time.sleep(0.1)
        adds = [r for r in fn.requests if r["headers"].get("ce-type") == "dev.knative.apiserver.resource.add"]
        assert adds, f"no add event reached the function: {fn.types()}"
        assert json.loads(adds[0]["body"])["metadata"]["name"] == "hello"
        assert adds[0]["headers"]["ce-name"] == "hello" and adds[0]["headers"]["ce-kind"] == "ConfigMap"
        assert "dev.knative.sources.ping" in fn.types(), "mtping's tick did not arrive"
    finally:
        fn.stop()
        api.delete("v1", "Namespace", None, namespace)

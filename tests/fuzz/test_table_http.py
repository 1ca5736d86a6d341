"""Issue 14's request classes through every function's HTTP entry point, one row each, with the API server
refusing connections: a 400 (not a 503) proves the request was refused before any API call."""
from __future__ import annotations

import json

import pytest

from catalog import declarations
from tests.http_cases import assert_refused, source_of

# Each function that takes ApiServerSource events, and the first kind its Trigger takes (its declaration).
KUBE_FUNCTIONS = {f.package: f.trigger.on[0].kinds[0] for f in declarations() if f.trigger and f.trigger.on}


def reference(name="vm1", namespace="default", kind="VirtualMachineInstance", verb="update"):
    headers = {"ce-specversion": "1.0", "ce-id": "e1", "ce-source": "s", "ce-type": f"dev.knative.apiserver.ref.{verb}",
               "Content-Type": "application/json"}
    return headers, json.dumps({"apiVersion": "kubevirt.io/v1", "kind": kind, "name": name,
                                "namespace": namespace}).encode()


ROWS = [
    # (what, name, namespace, verb, fragment of the 400)
    ("field-selector-injection", "vm1,reason=IOErrorPause", "default", "update", "is not a valid"),
    ("get-turned-watch", "vm1?watch=true", "default", "update", "is not a valid"),
    ("path-traversal", "../../../api/v1/namespaces/default/secrets", "default", "update", "is not a valid"),
    ("subresource", "vm1/status", "default", "update", "is not a valid"),
    ("namespace-traversal", "vm1", "default/virtualmachines", "update", "namespace"),
    ("unknown-verb", "vm1", "default", "patch", "ApiServerSource events end in add, update, delete"),
]


@pytest.mark.parametrize("package", sorted(KUBE_FUNCTIONS))
@pytest.mark.parametrize("what,name,namespace,verb,fragment", ROWS, ids=[row[0] for row in ROWS])
def test_hostile_reference_is_a_400_before_any_api_call(serve, package, what, name, namespace, verb, fragment):
    client = serve(source_of(package))
    headers, body = reference(name, namespace, KUBE_FUNCTIONS[package], verb)
    assert_refused(client.post("/", headers=headers, data=body), fragment)


# and every function that takes replies (dead-letter, which takes no Trigger's events, logs it)
@pytest.mark.parametrize("package", [*sorted(KUBE_FUNCTIONS), *(f.package for f in declarations()
                                                                if f.trigger and f.trigger.replies)])
@pytest.mark.parametrize("attribute,value", [("kind", {"a": 1}), ("subject", ["x"]), ("extra", [[["deep"]]])])
def test_a_structured_attribute_of_the_wrong_type_is_a_400(serve, package, attribute, value):
    client = serve(source_of(package))
    envelope = {"specversion": "1.0", "id": "e1", "source": "s", "type": "dev.knative.apiserver.ref.update",
                attribute: value, "data": {}}
    response = client.post("/", headers={"Content-Type": "application/cloudevents+json"},
                           data=json.dumps(envelope).encode())
    assert response.status_code == 400 and attribute in response.get_json()["error"]

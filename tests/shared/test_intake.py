"""CloudEvents intake: binary and structured mode, the three event families, and clear 400s."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent

from shared.errors import BadEvent
from shared.intake import about, parse
from simcluster.builders.kubevirt import make_vmi


def ce(data, type_="dev.knative.apiserver.resource.update", **extra):
    attributes = {"type": type_, "source": "https://10.43.0.1:443", "id": "e1",
                  "subject": "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm1", **extra}
    return CloudEvent(attributes, data)


class Headers(dict):
    """Case-insensitive enough for these tests (Flask's headers are)."""

    def get(self, key, default=None):
        for k, v in self.items():
            if k.lower() == key.lower():
                return v
        return default


@pytest.mark.parametrize("mode", [to_binary, to_structured])
def test_resource_event_in_both_modes(mode):
    headers, body = mode(ce(make_vmi(), kind="VirtualMachineInstance"))
    event = parse(Headers(headers), body)
    assert event.family == "resource" and event.operation == "update" and event.kind == "VirtualMachineInstance"
    assert event.object()["metadata"]["name"] == "vm1" and event.extensions["kind"] == "VirtualMachineInstance"


def test_reference_event():
    headers, body = to_binary(ce({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm1",
                                  "namespace": "default"}, "dev.knative.apiserver.ref.add"))
    ref = parse(Headers(headers), body).ref()
    assert (ref.kind, ref.name, ref.namespace) == ("VirtualMachineInstance", "vm1", "default")


def test_ping_event():
    headers, body = to_binary(ce({"reason": "periodic re-scan"}, "dev.knative.sources.ping"))
    assert parse(Headers(headers), body).family == "ping"


@pytest.mark.parametrize("headers,body,message", [
    ({"Content-Type": "application/json"}, b"{}", "not a CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{not json", "not valid JSON"),
    ({"Content-Type": "application/cloudevents+json"}, b"[]", "must be a JSON object"),
    ({"Content-Type": "application/cloudevents+json"},
     json.dumps({"specversion": "0.3", "id": "1", "source": "s", "type": "t"}).encode(), "specversion"),
    ({"ce-specversion": "1.0", "ce-source": "s", "ce-type": "t", "Content-Type": "application/json"}, b"{}", "id"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t", "Content-Type": "application/json"},
     b"{oops", "data is not valid JSON"),
])
def test_malformed_requests_are_bad_events(headers, body, message):
    with pytest.raises(BadEvent) as caught:
        parse(Headers(headers), body)
    assert message in caught.value.message


def test_resource_event_without_an_object_is_a_bad_event():
    headers, body = to_binary(ce({"hello": "world"}))
    with pytest.raises(BadEvent):
        parse(Headers(headers), body).object()


def test_kind_extension_must_match_the_object():
    headers, body = to_binary(ce(make_vmi(), kind="Pod"))
    with pytest.raises(BadEvent):
        parse(Headers(headers), body).object()


def _incoming(data, type_="dev.knative.apiserver.resource.update"):
    headers, body = to_binary(ce(data, type_))
    return parse(Headers(headers), body)


def test_about_a_resource_mode_event_carries_the_object():
    found = about(_incoming(make_vmi()), ("VirtualMachineInstance",), "fn")
    assert (found.ref.kind, found.ref.namespace, found.ref.name, found.deleted) == \
        ("VirtualMachineInstance", "default", "vm1", False)
    assert found.obj["status"]["phase"] == "Succeeded"


def test_about_a_reference_mode_event_has_no_object_and_defaults_the_namespace():
    found = about(_incoming({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm1"},
                            "dev.knative.apiserver.ref.delete"), ("VirtualMachineInstance",), "fn")
    assert found.obj is None and found.deleted and found.ref.namespace == "default"


@pytest.mark.parametrize("data,type_,kwargs,message", [
    (make_vmi(), "dev.knative.apiserver.resource.update", {"kinds": ("Pod",)},
     "is about a VirtualMachineInstance; fn handles Pod events"),
    ({"apiVersion": "v1", "kind": "Pod", "name": "p"}, "dev.knative.apiserver.ref.add",
     {"kinds": ("Pod", "VirtualMachineInstance"), "ref_kinds": ("VirtualMachineInstance",)},
     "fn handles VirtualMachineInstance events in Reference mode"),
    ({}, "com.example.other", {"kinds": ("Pod",)}, "unsupported event type com.example.other; fn handles"),
], ids=["wrong-kind", "kind-not-accepted-by-reference", "other-type"])
def test_about_refuses_what_the_function_does_not_handle(data, type_, kwargs, message):
    with pytest.raises(BadEvent) as caught:
        about(_incoming(data, type_), function="fn", **kwargs)
    assert message in caught.value.message

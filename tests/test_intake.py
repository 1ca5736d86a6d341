"""CloudEvents intake: binary and structured mode, the three event families, and clear 400s."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent

from shared.errors import BadEvent
from shared.intake import parse
from tests.builders import make_vmi


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

"""device-conflict through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json
from datetime import datetime, timezone

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from functions_framework import create_app

from tests.conftest import REPO
from tests.device_builders import host_device, seed_vm2, vm, vmi

SOURCE = str(REPO / "functions" / "device_conflict" / "main.py")


@pytest.fixture
def client(monkeypatch, unreachable_kubeconfig):
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    monkeypatch.delenv("CONFLICT_RECENT_START", raising=False)
    return create_app(target="handle", source=SOURCE).test_client()


def event(data, type_="dev.knative.apiserver.resource.update", kind="VirtualMachine"):
    return CloudEvent({"type": type_, "source": "https://10.43.0.1:443", "kind": kind,
                       "subject": f"/apis/kubevirt.io/v1/namespaces/default/{kind.lower()}s/{data['metadata']['name']}"},
                      data)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("data,kind", [
    pytest.param(vm("plain"), "VirtualMachine", id="vm-without-devices"),
    pytest.param(vmi("plain"), "VirtualMachineInstance", id="vmi-without-devices"),
    pytest.param(vmi("old", host_device(), since=datetime(2020, 1, 1, tzinfo=timezone.utc)), "VirtualMachineInstance",
                 id="vmi-running-for-long-with-a-device"),
    pytest.param(vmi("done", host_device(), phase="Succeeded"), "VirtualMachineInstance", id="final-vmi"),
])
def test_irrelevant_events_are_answered_empty_without_the_api(client, mode, data, kind):
    headers, body = mode(event(data, kind=kind))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 204 and response.data == b""


def test_a_deleted_vm_with_a_device_is_left_to_the_re_scan(client):
    headers, body = to_binary(event(seed_vm2(), type_="dev.knative.apiserver.resource.delete"))
    assert client.post("/", headers=headers, data=body).status_code == 204


@pytest.mark.parametrize("headers,body,fragment", [
    ({"Content-Type": "application/json"}, b'{"hello": 1}', "not a CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{", "not valid JSON"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "com.example.other",
      "Content-Type": "application/json"}, b"{}", "unsupported event type"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.add",
      "ce-kind": "VirtualMachine", "Content-Type": "application/json"},
     b'{"kind": "VirtualMachine", "spec": {"template": {"spec": {"domain": {"devices": {"hostDevices": []}}}}}}',
     "metadata.name"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "Content-Type": "application/json"},
     json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(), "about a Pod"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "ce-kind": "VirtualMachine", "Content-Type": "application/json"}, b'{"hostDevices": ', "not valid JSON"),
    ({"ce-specversion": "0.3", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "ce-kind": "VirtualMachine", "Content-Type": "application/json"}, b'{}', "specversion"),
])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 400
    assert fragment in response.get_json()["error"]


def test_relevant_event_with_the_api_down_is_a_503_so_the_broker_redelivers(client):
    headers, body = to_binary(event(seed_vm2(), type_="dev.knative.apiserver.resource.add"))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 503
    assert "unreachable" in response.get_json()["error"]


def test_a_tick_with_the_api_down_is_a_503(client):
    headers, body = to_binary(CloudEvent({"type": "dev.knative.sources.ping", "source": "/ping"}, {"reason": "tick"}))
    assert client.post("/", headers=headers, data=body).status_code == 503


def test_bad_setting_stops_the_start_naming_the_variable(monkeypatch, unreachable_kubeconfig, capsys):
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    monkeypatch.setenv("CONFLICT_RECENT_START", "soon")
    with pytest.raises(SystemExit) as stopped:
        create_app(target="handle", source=SOURCE)
    assert stopped.value.code == 2
    assert "CONFLICT_RECENT_START='soon' is not a duration" in capsys.readouterr().err

"""io-pause-report through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from functions_framework import create_app

from tests.conftest import REPO
from tests.io_pause_builders import make_vmi

SOURCE = str(REPO / "functions" / "io_pause_report" / "main.py")


@pytest.fixture
def client(monkeypatch, unreachable_kubeconfig):
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    for name in ("IO_PAUSE_STUCK_AFTER", "IO_PAUSE_RESOLVED_AFTER", "LONGHORN_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    return create_app(target="handle", source=SOURCE).test_client()


def event(data, type_="dev.knative.apiserver.resource.update", kind="VirtualMachineInstance"):
    return CloudEvent({"type": type_, "source": "https://10.43.0.1:443", "kind": kind,
                       "subject": "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm1"}, data)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("paused", [None, "PausedByUser", "PausedByMigrationMonitor"],
                         ids=["running", "paused-by-user", "paused-by-migration-monitor"])
def test_vmi_updates_not_about_an_io_error_are_answered_empty_without_the_api(client, mode, paused):
    headers, body = mode(event(make_vmi(paused=paused)))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 204 and response.data == b""


def test_vmi_delete_event_is_irrelevant(client):
    headers, body = to_binary(event(make_vmi(), type_="dev.knative.apiserver.resource.delete"))
    assert client.post("/", headers=headers, data=body).status_code == 204


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_an_io_error_pause_with_the_api_down_is_a_503_so_the_broker_redelivers(client, mode):
    headers, body = mode(event(make_vmi()))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 503
    assert "unreachable" in response.get_json()["error"]


@pytest.mark.parametrize("headers,body,fragment", [
    ({"Content-Type": "application/json"}, b'{"hello": 1}', "not a CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{", "not valid JSON"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "com.example.other",
      "Content-Type": "application/json"}, b"{}", "unsupported event type"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "ce-kind": "VirtualMachineInstance", "Content-Type": "application/json"},
     b'{"kind": "VirtualMachineInstance", "status": "PausedIOError"}', "metadata.name"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "Content-Type": "application/json"},
     json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(), "about a Pod"),
    ({"ce-specversion": "0.3", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.sources.ping"}, b"",
     "specversion"),
], ids=["no-cloudevent", "bad-structured-json", "other-type", "no-name", "pod", "old-specversion"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 400
    assert fragment in response.get_json()["error"]


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


def test_bad_setting_stops_the_start_naming_the_variable(monkeypatch, unreachable_kubeconfig, capsys):
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    monkeypatch.setenv("IO_PAUSE_STUCK_AFTER", "ten minutes")
    with pytest.raises(SystemExit) as stopped:
        create_app(target="handle", source=SOURCE)
    assert stopped.value.code == 2
    assert "IO_PAUSE_STUCK_AFTER='ten minutes' is not a duration" in capsys.readouterr().err

"""migration-report through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from functions_framework import create_app

from tests.conftest import REPO
from tests.migration_builders import NOT_COMPLETED, make_state, make_vmi, make_vmim

SOURCE = str(REPO / "functions" / "migration_report" / "main.py")
SETTINGS = ("MIGRATION_WARN_RATIO", "MIGRATION_REPORT_WITHIN", "MIGRATION_NAMESPACES", "MIGRATION_EXCLUDE_NAMESPACES")


@pytest.fixture
def client(monkeypatch, unreachable_kubeconfig):
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    return create_app(target="handle", source=SOURCE).test_client()


def event(data, type_="dev.knative.apiserver.resource.update", kind="VirtualMachineInstanceMigration"):
    return CloudEvent({"type": type_, "source": "https://10.43.0.1:443", "kind": kind,
                       "subject": "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/m1"}, data)


def running_vmim():
    vmim = make_vmim(phase="Running")
    vmim["status"]["phaseTransitionTimestamps"].pop()  # no final phase yet
    vmim["status"]["phase"] = "Running"
    return vmim


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_a_migration_under_way_is_answered_empty_without_the_api(client, mode):
    headers, body = mode(event(running_vmim()))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 204 and response.data == b""


def test_a_vmim_delete_event_is_irrelevant(client):
    headers, body = to_binary(event(make_vmim(), type_="dev.knative.apiserver.resource.delete"))
    assert client.post("/", headers=headers, data=body).status_code == 204


@pytest.mark.parametrize("headers,body,fragment", [
    ({"Content-Type": "application/json"}, b'{"hello": 1}', "not a CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{", "not valid JSON"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "com.example.other",
      "Content-Type": "application/json"}, b"{}", "unsupported event type"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "ce-kind": "VirtualMachineInstanceMigration", "Content-Type": "application/json"},
     b'{"kind": "VirtualMachineInstanceMigration", "status": {"phase": "Failed"}}', "metadata.name"),
    ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "dev.knative.apiserver.resource.update",
      "Content-Type": "application/json"},
     json.dumps(make_vmi()).encode(), "about a VirtualMachineInstance"),
], ids=["not-a-cloudevent", "bad-json", "unsupported-type", "no-name", "wrong-kind"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 400
    assert fragment in response.get_json()["error"]


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_a_failed_migration_with_the_api_down_is_a_503_so_the_broker_redelivers(client, mode):
    vmim = make_vmim(state=make_state("u1", took=451, reason=NOT_COMPLETED.format(450)), uid="u1")
    headers, body = mode(event(vmim))
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 503
    assert "unreachable" in response.get_json()["error"]


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("name,value,message", [
    ("MIGRATION_WARN_RATIO", "80%", "MIGRATION_WARN_RATIO='80%' is not a number from 0.01 to 1; use a value like 0.8."),
    ("MIGRATION_REPORT_WITHIN", "half an hour", "MIGRATION_REPORT_WITHIN='half an hour' is not a duration"),
    ("MIGRATION_REPORT_WITHIN", "0s", "MIGRATION_REPORT_WITHIN='0s' would report nothing"),
])
def test_bad_setting_stops_the_start_naming_the_variable(monkeypatch, unreachable_kubeconfig, capsys, name, value,
                                                          message):
    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        create_app(target="handle", source=SOURCE)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err

"""vmi-cleanup through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured
from functions_framework import create_app

from simcluster.builders.kubevirt import make_launcher_pod, make_vmi
from tests.http_cases import (
    DELETE,
    MALFORMED,
    UPDATE,
    assert_answered_empty,
    assert_api_down,
    assert_refused,
    assert_stops_the_start,
    binary_headers,
    post,
    source_of,
)
from tests.http_cases import apiserver_event as event

SOURCE = source_of("vmi_cleanup")


@pytest.fixture
def client(serve):
    return serve(SOURCE)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_running_vmi_update_is_answered_empty_without_the_api(client, mode):
    assert_answered_empty(post(client, event(make_vmi(phase="Running")), mode))


def test_running_launcher_pod_is_irrelevant(client):
    assert post(client, event(make_launcher_pod(make_vmi(), phase="Running"), kind="Pod")).status_code == 204


def test_vmi_delete_event_is_irrelevant(client):
    assert post(client, event(make_vmi(), type_=DELETE)).status_code == 204


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(UPDATE), b'{"kind": "VirtualMachineInstance"}', "metadata.name"),
    (binary_headers(UPDATE),
     json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}).encode(),
     "about a Deployment"),
])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


def test_relevant_event_with_the_api_down_is_a_503_so_the_broker_redelivers(client):
    assert_api_down(post(client, event(make_vmi(phase="Succeeded"))))


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys):
    assert_stops_the_start(lambda: serve(SOURCE, CLEANUP_AFTER="5 minutes"), capsys,
                           "CLEANUP_AFTER='5 minutes' is not a duration; use a value like 90s, 10m or 2h.")


def test_no_cluster_configuration_stops_the_start(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(SystemExit):
        create_app(target="handle", source=SOURCE)
    assert "set KUBECONFIG" in capsys.readouterr().err

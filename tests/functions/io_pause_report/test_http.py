"""io-pause-report through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured

from simcluster.builders.io_pause import make_vmi
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

SOURCE = source_of("io_pause_report")
SETTINGS = ("IO_PAUSE_STUCK_AFTER", "IO_PAUSE_RESOLVED_AFTER", "LONGHORN_NAMESPACE")


@pytest.fixture
def client(serve):
    return serve(SOURCE, SETTINGS)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("paused", [None, "PausedByUser", "PausedByMigrationMonitor"],
                         ids=["running", "paused-by-user", "paused-by-migration-monitor"])
def test_vmi_updates_not_about_an_io_error_are_answered_empty_without_the_api(client, mode, paused):
    assert_answered_empty(post(client, event(make_vmi(paused=paused)), mode))


def test_vmi_delete_event_is_irrelevant(client):
    assert post(client, event(make_vmi(), type_=DELETE)).status_code == 204


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_an_io_error_pause_with_the_api_down_is_a_503_so_the_broker_redelivers(client, mode):
    assert_api_down(post(client, event(make_vmi()), mode))


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(UPDATE, kind="VirtualMachineInstance"),
     b'{"kind": "VirtualMachineInstance", "status": "PausedIOError"}', "metadata.name"),
    (binary_headers(UPDATE), json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(),
     "about a Pod"),
    (binary_headers("dev.knative.sources.ping", specversion="0.3", content_type=None), b"", "specversion"),
], ids=["no-cloudevent", "bad-structured-json", "other-type", "no-name", "pod", "old-specversion"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys):
    assert_stops_the_start(lambda: serve(SOURCE, IO_PAUSE_STUCK_AFTER="ten minutes"), capsys,
                           "IO_PAUSE_STUCK_AFTER='ten minutes' is not a duration")

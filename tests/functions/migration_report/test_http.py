"""migration-report through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured

from simcluster.builders.migration import NOT_COMPLETED, make_state, make_vmi, make_vmim
from tests.http_cases import (
    DELETE,
    MALFORMED,
    UPDATE,
    apiserver_event,
    assert_answered_empty,
    assert_api_down,
    assert_refused,
    assert_stops_the_start,
    binary_headers,
    post,
    source_of,
)

SOURCE = source_of("migration_report")
SETTINGS = ("MIGRATION_WARN_RATIO", "MIGRATION_REPORT_WITHIN", "MIGRATION_NAMESPACES", "MIGRATION_EXCLUDE_NAMESPACES")


@pytest.fixture
def client(serve):
    return serve(SOURCE, SETTINGS)


def event(data, type_=UPDATE, kind="VirtualMachineInstanceMigration"):
    return apiserver_event(data, type_, kind,
                           "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/m1")


def running_vmim():
    vmim = make_vmim(phase="Running")
    vmim["status"]["phaseTransitionTimestamps"].pop()  # no final phase yet
    vmim["status"]["phase"] = "Running"
    return vmim


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_a_migration_under_way_is_answered_empty_without_the_api(client, mode):
    assert_answered_empty(post(client, event(running_vmim()), mode))


def test_a_vmim_delete_event_is_irrelevant(client):
    assert post(client, event(make_vmim(), type_=DELETE)).status_code == 204


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(UPDATE, kind="VirtualMachineInstanceMigration"),
     b'{"kind": "VirtualMachineInstanceMigration", "status": {"phase": "Failed"}}', "metadata.name"),
    (binary_headers(UPDATE), json.dumps(make_vmi()).encode(), "about a VirtualMachineInstance"),
], ids=["not-a-cloudevent", "bad-json", "unsupported-type", "no-name", "wrong-kind"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_a_failed_migration_with_the_api_down_is_a_503_so_the_broker_redelivers(client, mode):
    vmim = make_vmim(state=make_state("u1", took=451, reason=NOT_COMPLETED.format(450)), uid="u1")
    assert_api_down(post(client, event(vmim), mode))


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("name,value,message", [
    ("MIGRATION_WARN_RATIO", "80%", "MIGRATION_WARN_RATIO='80%' is not a number from 0.01 to 1; use a value like 0.8."),
    ("MIGRATION_REPORT_WITHIN", "half an hour", "MIGRATION_REPORT_WITHIN='half an hour' is not a duration"),
    ("MIGRATION_REPORT_WITHIN", "0s", "MIGRATION_REPORT_WITHIN='0s' would report nothing"),
    ("MIGRATION_CURSOR", "just-a-name", "MIGRATION_CURSOR='just-a-name' is not namespace/name; use a value like "
                                        "vmevents/vmevents-migration-report-cursor (or empty for none)."),
    ("MIGRATION_CURSOR", "vmevents/Not_A_Name", "MIGRATION_CURSOR='vmevents/Not_A_Name' is not namespace/name"),
    ("MIGRATION_SETTLE_EVERY", "1h", "MIGRATION_SETTLE_EVERY is over 30m: open findings are renewed only when"),
])
def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys, name, value, message):
    assert_stops_the_start(lambda: serve(SOURCE, **{name: value}), capsys, message)

"""vm-stuck-report through HTTP, as functions-framework serves it: binary, structured and malformed CloudEvents. The
API server here refuses connections, so an answer that needed no API call proves that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured

from simcluster.builders import stuck as b
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

SOURCE = source_of("vm_stuck_report")
SETTINGS = ("VM_STUCK_AFTER", "VM_STUCK_AFTER_BY_STATE", "VM_STUCK_NAMESPACES", "VM_STUCK_EXCLUDE_NAMESPACES",
            "LONGHORN_NAMESPACE")
VM_SUBJECT = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1"


@pytest.fixture
def client(serve):
    return serve(SOURCE, SETTINGS)


def vm_event(obj, type_=UPDATE):
    return event(obj, type_=type_, kind="VirtualMachine", subject=VM_SUBJECT)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("status", ["Running", "Stopped", "Paused", "WaitingForReceiver", None],
                         ids=["running", "stopped", "paused", "waiting-for-receiver", "no-status"])
def test_vm_updates_in_a_settled_state_are_answered_empty_without_the_api(client, mode, status):
    assert_answered_empty(post(client, vm_event(b.vm(status=status)), mode))


@pytest.mark.parametrize("phase", ["Running", "Succeeded", "Failed", "TargetReady"])
def test_migration_updates_past_scheduling_are_answered_empty_without_the_api(client, phase):
    migration = b.vmim(b.vmi(b.vm()), phase=phase)
    assert_answered_empty(post(client, event(migration, kind="VirtualMachineInstanceMigration",
                                             subject="/apis/kubevirt.io/v1/namespaces/default/"
                                                     "virtualmachineinstancemigrations/mig1")))


def test_a_vm_delete_event_is_irrelevant(client):
    assert post(client, vm_event(b.vm(status="Terminating"), type_=DELETE)).status_code == 204


def test_a_namespace_out_of_scope_costs_no_api_call(serve):
    client = serve(SOURCE, VM_STUCK_EXCLUDE_NAMESPACES="default")
    assert_answered_empty(post(client, vm_event(b.vm(status="ErrorUnschedulable"))))


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("status", ["Starting", "ErrorUnschedulable", "Stopping"])
def test_a_vm_in_a_stuck_state_with_the_api_down_is_a_503_so_the_broker_redelivers(client, mode, status):
    assert_api_down(post(client, vm_event(b.vm(status=status)), mode))


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(UPDATE, kind="VirtualMachine"), b'{"kind": "VirtualMachine", "status": "Starting"}',
     "metadata.name"),
    (binary_headers(UPDATE), json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(),
     "about a Pod"),
], ids=["no-cloudevent", "bad-structured-json", "other-type", "no-name", "pod"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("name,value,message", [
    ("VM_STUCK_AFTER", "ten minutes", "VM_STUCK_AFTER='ten minutes' is not a duration"),
    ("VM_STUCK_AFTER_BY_STATE", "Booting=5m", "not a state"),
])
def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys, name, value, message):
    assert_stops_the_start(lambda: serve(SOURCE, **{name: value}), capsys, message)

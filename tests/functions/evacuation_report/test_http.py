"""evacuation-report through HTTP, as functions-framework serves it: binary, structured and malformed CloudEvents.
The API server here refuses connections, so an answer that needed no API call proves that it made none."""
import json

import pytest
from cloudevents.conversion import to_binary, to_structured

from simcluster.builders import evacuation as b
from tests.http_cases import (
    DELETE,
    MALFORMED,
    assert_answered_empty,
    assert_api_down,
    assert_refused,
    assert_stops_the_start,
    binary_headers,
    post,
    source_of,
)
from tests.http_cases import apiserver_event as event

SOURCE = source_of("evacuation_report")
SETTINGS = ("EVACUATION_DOWN_AFTER", "EVACUATION_WARN_RATIO", "EVACUATION_NAMESPACES", "EVACUATION_EXCLUDE_NAMESPACES",
            "LONGHORN_NAMESPACE", "HARVESTER_NAMESPACE")
MODES = pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])


@pytest.fixture
def client(serve):
    return serve(SOURCE, SETTINGS)


def node_event(obj, type_="dev.knative.apiserver.resource.update"):
    return event(obj, type_=type_, kind="Node", subject=f"/api/v1/nodes/{obj['metadata']['name']}")


def vmim_event(obj):
    return event(obj, kind="VirtualMachineInstanceMigration",
                 subject=f"/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/"
                         f"{obj['metadata']['name']}")


@MODES
def test_a_ready_schedulable_node_is_answered_empty_without_the_api(client, mode):
    assert_answered_empty(post(client, node_event(b.node("node-a")), mode))


@MODES
def test_a_migration_that_is_no_evacuation_is_answered_empty_without_the_api(client, mode):
    vm = b.vm("vm1")
    migration = b.evacuation(b.vmi(vm, "node-a"), "node-a")
    migration["metadata"]["annotations"] = {}
    assert_answered_empty(post(client, vmim_event(migration), mode))


@MODES
@pytest.mark.parametrize("node", [
    pytest.param(b.node("node-a", cordoned=True), id="cordoned"),
    pytest.param(b.node("node-a", taints=(b.drain_taint(),)), id="drain-taint"),
    pytest.param(b.node("node-a", annotations=b.maintenance()), id="maintenance"),
    pytest.param(b.node("node-a", ready="Unknown"), id="unreachable"),
    pytest.param(b.node("node-a", ready="False"), id="not-ready"),
])
def test_a_node_being_emptied_or_down_is_read_so_with_the_api_down_a_503(client, mode, node):
    assert_api_down(post(client, node_event(node), mode))


def test_an_evacuation_migration_is_read(client):
    assert_api_down(post(client, vmim_event(b.evacuation(b.vmi(b.vm("vm1"), "node-a"), "node-a"))))


def test_a_node_delete_is_read_too_so_its_finding_ends(client):
    assert_api_down(post(client, node_event(b.node("node-a", cordoned=True), DELETE)))


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers("dev.knative.apiserver.resource.update", kind="Node"),
     b'{"kind": "Node", "spec": {"unschedulable": true}}', "metadata.name"),
    (binary_headers("dev.knative.apiserver.resource.update"),
     json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(), "about a Pod"),
], ids=["no-cloudevent", "bad-structured-json", "other-type", "no-name", "pod"])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


def test_probe_answers_without_handling(client):
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("name,value,message", [
    ("EVACUATION_DOWN_AFTER", "soon", "EVACUATION_DOWN_AFTER='soon' is not a duration"),
    ("EVACUATION_WARN_RATIO", "2", "EVACUATION_WARN_RATIO='2' is not a number from 0.01 to 1"),
    ("HARVESTER_NAMESPACE", "Harvester System", "HARVESTER_NAMESPACE"),
])
def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys, name, value, message):
    assert_stops_the_start(lambda: serve(SOURCE, **{name: value}), capsys, message)

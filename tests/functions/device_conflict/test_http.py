"""device-conflict through HTTP, as functions-framework serves it: binary, structured and malformed
CloudEvents. The API server here refuses connections, so an answer that needed no API call proves
that it made none."""
import json
from datetime import UTC, datetime

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent

from simcluster.builders.devices import host_device, seed_vm2, vm, vmi
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

SOURCE = source_of("device_conflict")
SETTINGS = ("CONFLICT_RECENT_START", "DEVICE_ASSIGNMENTS")
ADD = "dev.knative.apiserver.resource.add"


@pytest.fixture
def client(serve):
    return serve(SOURCE, SETTINGS)


def event(data, type_=UPDATE, kind="VirtualMachine"):
    return apiserver_event(data, type_, kind,
                           f"/apis/kubevirt.io/v1/namespaces/default/{kind.lower()}s/{data['metadata']['name']}")


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
@pytest.mark.parametrize("data,kind", [
    # a VM KubeVirt has seen this spec of (generation = observedGeneration): no edit that could drop a device
    pytest.param(vm("plain") | {"metadata": {"name": "plain", "namespace": "default", "generation": 2},
                                "status": {"observedGeneration": 2}}, "VirtualMachine", id="vm-without-devices"),
    pytest.param(vmi("plain"), "VirtualMachineInstance", id="vmi-without-devices"),
    pytest.param(vmi("old", host_device(), since=datetime(2020, 1, 1, tzinfo=UTC)), "VirtualMachineInstance",
                 id="vmi-running-for-long-with-a-device"),
    pytest.param(vmi("done", host_device(), phase="Succeeded"), "VirtualMachineInstance", id="final-vmi"),
])
def test_irrelevant_events_are_answered_empty_without_the_api(client, mode, data, kind):
    assert_answered_empty(post(client, event(data, kind=kind), mode))


def test_a_deleted_vm_is_a_look_at_the_parameter_object_and_a_deleted_vmi_is_not(client):
    # The VM's entries must go with it (the admission policy reads them): the API is down here, so the look
    # answers 503 and the broker redelivers; a VMI's deletion is answered without the API.
    assert_api_down(post(client, event(seed_vm2(), type_=DELETE)))
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "vm2",
           "namespace": "default"}, "spec": seed_vm2()["spec"]["template"]["spec"]}
    assert post(client, event(vmi, type_=DELETE, kind="VirtualMachineInstance")).status_code == 204


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(ADD, kind="VirtualMachine"),
     b'{"kind": "VirtualMachine", "spec": {"template": {"spec": {"domain": {"devices": {"hostDevices": []}}}}}}',
     "metadata.name"),
    (binary_headers(UPDATE), json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}).encode(),
     "about a Pod"),
    (binary_headers(UPDATE, kind="VirtualMachine"), b'{"hostDevices": ', "not valid JSON"),
    (binary_headers(UPDATE, kind="VirtualMachine", specversion="0.3"), b'{}', "specversion"),
])
def test_malformed_or_unsupported_input_is_a_400_with_a_reason(client, headers, body, fragment):
    assert_refused(client.post("/", headers=headers, data=body), fragment)


def test_relevant_event_with_the_api_down_is_a_503_so_the_broker_redelivers(client):
    assert_api_down(post(client, event(seed_vm2(), type_=ADD)))


def test_a_tick_with_the_api_down_is_a_503(client):
    tick = CloudEvent({"type": "dev.knative.sources.ping", "source": "/ping"}, {"reason": "tick"})
    assert post(client, tick).status_code == 503


def test_bad_setting_stops_the_start_naming_the_variable(serve, capsys):
    assert_stops_the_start(lambda: serve(SOURCE, CONFLICT_RECENT_START="soon"), capsys,
                           "CONFLICT_RECENT_START='soon' is not a duration")


def test_a_parameter_object_that_is_not_namespace_slash_name_stops_the_start(serve, capsys):
    assert_stops_the_start(lambda: serve(SOURCE, DEVICE_ASSIGNMENTS="just-a-name"), capsys,
                           "DEVICE_ASSIGNMENTS='just-a-name' is not namespace/name")

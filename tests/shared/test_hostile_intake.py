"""Issue 14's intake classes, one row each: identifiers that break Kubernetes' rules, attribute values of the
wrong type, unknown verbs and odd subjects are a BadEvent (a 400) before any API call."""
import json

import pytest

from shared.errors import BadEvent
from shared.intake import about, check_name, check_uid, parse

VMI = "VirtualMachineInstance"


def structured(data, type_="dev.knative.apiserver.ref.update", **attributes):
    envelope = {"specversion": "1.0", "id": "e1", "source": "s", "type": type_, **attributes, "data": data}
    return parse({"Content-Type": "application/cloudevents+json"}, json.dumps(envelope).encode())


def ref(name="vm1", namespace="default", kind=VMI, api_version="kubevirt.io/v1"):
    return {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace}


def resource(name="vm1", namespace="default", kind=VMI, api_version="kubevirt.io/v1"):
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}}


BAD_NAMES = ["../vm1", "..", ".", "vm1/status", "vm1?watch=true", "vm1#x", "vm1,reason=IOErrorPause", "reason=x",
             "vm1%2Fpods", "VM1", "-vm1", "vm1-", "vm1 ", "vm1\n", "a" * 254, "", "ünï", "vm_1", "*"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("shape", [ref, resource], ids=["reference", "resource"])
def test_a_name_against_kubernetes_rules_is_refused(shape, name):
    type_ = "dev.knative.apiserver." + ("ref" if shape is ref else "resource") + ".update"
    with pytest.raises(BadEvent, match="not a valid VirtualMachineInstance name"):
        about(structured(shape(name=name), type_), (VMI,), "f")


@pytest.mark.parametrize("namespace", ["Default", "a.b", "../default", "a" * 64, "default,x", "ns/x"])
def test_a_namespace_must_be_a_dns_label(namespace):
    with pytest.raises(BadEvent, match="namespace"):
        about(structured(ref(namespace=namespace)), (VMI,), "f")


@pytest.mark.parametrize("name", ["vm1", "a.b-c", "0", "a" * 253, "vm-1.example"])
def test_valid_names_pass(name):
    assert about(structured(ref(name=name)), (VMI,), "f").ref.name == name


@pytest.mark.parametrize("data,message", [
    (ref(kind="VM/../Secret"), "is not a Kubernetes kind"),
    (ref(kind=["VirtualMachineInstance"]), "without kind"),
    (ref(api_version="kubevirt.io/v1/../../v1"), "is not a Kubernetes apiVersion"),
    (ref(api_version="kubevirt.io"), "is not a Kubernetes apiVersion"),
    (ref(name=["vm1"]), "without name"),
    (ref(namespace={"a": 1}), "namespace"),
])
def test_kind_api_version_and_types_are_checked(data, message):
    with pytest.raises(BadEvent, match=message.replace("(", r"\(")):
        about(structured(data), (VMI,), "f")


def test_a_resource_event_with_a_non_string_kind_is_refused():
    with pytest.raises(BadEvent, match="does not carry a Kubernetes object"):
        about(structured({**resource(), "kind": {"x": 1}}, "dev.knative.apiserver.resource.update"), (VMI,), "f")


@pytest.mark.parametrize("verb", ["patch", "UPDATE", "", "update.x"])
def test_an_unknown_apiserversource_verb_is_a_400(verb):
    with pytest.raises(BadEvent, match="ApiServerSource events end in add, update, delete"):
        about(structured(ref(), "dev.knative.apiserver.ref." + verb), (VMI,), "f")


@pytest.mark.parametrize("value", [{"a": 1}, [1, 2], None])
def test_an_extension_that_is_not_a_string_number_or_boolean_is_a_400(value):
    with pytest.raises(BadEvent, match="must be a string, a number or a boolean"):
        structured(ref(), kind=value)


def test_extension_scalars_are_kept_as_their_canonical_strings():
    event = structured(ref(), flag=True, count=3, kind=VMI)
    assert event.extensions == {"flag": "true", "count": "3", "kind": VMI}


@pytest.mark.parametrize("subject", [{"a": 1}, ["x"], 7, "a" * 1025, "line\nbreak"])
def test_a_subject_must_be_a_short_printable_string(subject):
    with pytest.raises(BadEvent, match="subject must be a printable string"):
        structured(ref(), subject=subject)


@pytest.mark.parametrize("uid", ["", "a,b", "x=y", "a b", "a" * 200, ["u"], None])
def test_a_uid_is_a_uuid_shape(uid):
    with pytest.raises(BadEvent, match="is not a Kubernetes uid"):
        check_uid(uid)


def test_check_name_knows_namespaces_are_labels_and_others_subdomains():
    assert check_name("Pod", "a.b") == "a.b"
    with pytest.raises(BadEvent):
        check_name("Namespace", "a.b")


def test_an_error_never_quotes_a_huge_value_whole():
    with pytest.raises(BadEvent) as caught:
        about(structured(ref(name="x" * 5000)), (VMI,), "f")
    assert len(caught.value.message) < 400

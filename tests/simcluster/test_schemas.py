"""The simulator never validates a custom resource against nothing: a schema it cannot find is an error
that names the file, not a silent pass."""
from __future__ import annotations

import pytest

from simcluster import paths
from simcluster.schemas import SchemaError, SchemaRegistry
from simcluster.store import RESOURCES, ApiError, type_for_kind

VM = type_for_kind("kubevirt.io/v1", "VirtualMachine")
VOLUME = type_for_kind("longhorn.io/v1beta2", "Volume")
POD = type_for_kind("v1", "Pod")


def a_vm() -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm1"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}


def a_volume() -> dict:
    return {"apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "metadata": {"name": "pvc-1"},
            "spec": {"numberOfReplicas": 3}}


def test_an_empty_upstream_dir_is_an_error_naming_the_missing_file(tmp_path):
    registry = SchemaRegistry("1.1.1", upstream_dir=tmp_path)
    expected = tmp_path / "kubevirt" / "v1.3.1" / "crd-schemas" / "virtualmachine.openAPIV3Schema.yaml"
    with pytest.raises(SchemaError) as missing:
        registry.validate(VM, a_vm())
    assert str(expected) in str(missing.value) and "cannot read" in str(missing.value)


def test_a_crd_file_without_the_kind_is_an_error_naming_the_file_and_the_kind(tmp_path):
    crds = tmp_path / "longhorn" / "v1.10.0" / "crds.yaml"
    crds.parent.mkdir(parents=True)
    crds.write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                    "metadata: {name: engines.longhorn.io}\n"
                    "spec: {group: longhorn.io, names: {plural: engines, kind: Engine}, versions: []}\n")
    with pytest.raises(SchemaError) as lacking:
        SchemaRegistry("1.1.1", upstream_dir=tmp_path).validate(VOLUME, a_volume())
    assert str(crds) in str(lacking.value) and "Volume" in str(lacking.value)


def test_an_unreadable_schema_file_is_an_error_naming_it(tmp_path):
    schema = tmp_path / "kubevirt" / "v1.8.3" / "crd-schemas" / "virtualmachine.openAPIV3Schema.yaml"
    schema.parent.mkdir(parents=True)
    schema.write_text("openAPIV3Schema: [unclosed\n")
    with pytest.raises(SchemaError) as unreadable:
        SchemaRegistry("1.8.3", upstream_dir=tmp_path).validate(VM, a_vm())
    assert str(schema) in str(unreadable.value)


def test_a_schema_file_without_a_schema_is_an_error_naming_it(tmp_path):
    schema = tmp_path / "kubevirt" / "v1.8.3" / "crd-schemas" / "virtualmachine.openAPIV3Schema.yaml"
    schema.parent.mkdir(parents=True)
    schema.write_text("something: else\n")
    with pytest.raises(SchemaError) as empty:
        SchemaRegistry("1.8.3", upstream_dir=tmp_path).validate(VM, a_vm())
    assert str(schema) in str(empty.value) and "no openAPIV3Schema for VirtualMachine" in str(empty.value)


def test_built_in_kinds_need_no_schema_file(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"anything": True}}
    assert SchemaRegistry("1.1.1", upstream_dir=tmp_path).validate(POD, pod) is pod


def test_the_repository_upstream_dir_validates_a_good_object():
    registry = SchemaRegistry("1.1.1", upstream_dir=paths.UPSTREAM_DIR)
    assert registry.validate(VM, a_vm())["metadata"]["name"] == "vm1"
    assert registry.validate(VOLUME, a_volume())["spec"]["numberOfReplicas"] == 3


@pytest.mark.parametrize("version", ["1.1.1", "1.8.3"])
@pytest.mark.parametrize("rt", RESOURCES, ids=[rt.qualified for rt in RESOURCES])
def test_the_repository_upstream_dir_has_every_schema_the_simulator_asks_for(rt, version):
    """Every kind the simulator serves finds its schema (an empty object may well be invalid: a 422 is fine)."""
    empty = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"name": "x"}}
    try:
        SchemaRegistry(version).validate(rt, empty)
    except ApiError as answer:
        assert answer.code == 422

"""The cheap forms of a LIST, asked of the simulator and of a real kube-apiserver alike (test_fidelity.py's
way): the Table form with KubeVirt's printer columns (includeObject Metadata and None), the
PartialObjectMetadataList form, and resourceVersion=0 (the watch cache: no pages); and a watch of the changes
since a list (Kube.changes), expired once the server no longer keeps its version."""
from __future__ import annotations

import pytest

from shared.kinds import VMI
from shared.kube import _AS_METADATA, _AS_TABLE, Expired, Invalid, Kube, Unavailable
from simcluster.builders.io_pause import make_vmi
from tests import backends

NAMESPACE = "cheap"
COLUMNS = ["Name", "Age", "Phase", "IP", "NodeName", "Ready", "Live-Migratable", "Paused"]


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1", virt_controller=False)  # stored VMIs, read back: no KubeVirt
    for i in range(5):
        vmi = make_vmi(f"vm{i}", NAMESPACE, paused="PausedIOError" if i == 1 else None, vm_uid=None)
        vmi["metadata"] = {k: v for k, v in vmi["metadata"].items()
                           if k not in ("uid", "resourceVersion", "creationTimestamp")}
        vmi["status"]["nodeName"] = "node-a"
        vmi["status"]["interfaces"] = [{"name": "default", "ipAddress": f"10.0.0.{i}"}]
        c.create(vmi)
    yield c
    c.stop()


def kube(cluster, page_size: int = 250) -> Kube:
    return Kube(cluster.api_client(), page_size=page_size)


def test_the_table_form_has_kubevirts_printer_columns_and_each_rows_metadata(cluster):
    table = kube(cluster).request("GET", VMI.path(NAMESPACE), query={"includeObject": "Metadata"}, accept=_AS_TABLE)
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == COLUMNS
    assert table["columnDefinitions"][0]["format"] == "name"
    assert [c["priority"] for c in table["columnDefinitions"]] == [0, 0, 0, 0, 0, 0, 1, 1]
    first = table["rows"][0]
    assert first["cells"][0] == "vm0" and first["cells"][2:] == ["Running", "10.0.0.0", "node-a", "True", None, None]
    assert first["object"]["kind"] == "PartialObjectMetadata" and first["object"]["apiVersion"] == "meta.k8s.io/v1"
    assert first["object"]["metadata"]["name"] == "vm0" and first["object"]["metadata"]["uid"]
    assert "spec" not in first["object"] and "status" not in first["object"]
    assert isinstance(first["cells"][1], str) and first["cells"][1].endswith("s")  # an age, e.g. "3s"


def test_list_rows_reads_the_cells_by_column_name_with_or_without_metadata(cluster):
    k = kube(cluster)
    rows = list(k.list_rows(VMI, NAMESPACE, cached=True))
    assert [r["cells"]["paused"] for r in rows] == [None, "True", None, None, None]
    assert rows[1]["metadata"]["name"] == "vm1" and rows[1]["metadata"]["namespace"] == NAMESPACE
    bare = list(k.list_rows(VMI, NAMESPACE, cached=True, metadata=False))
    assert [r["cells"] for r in bare] == [r["cells"] | {"age": r2["cells"]["age"]} for r, r2 in zip(rows, bare,
                                                                                                    strict=True)]
    assert bare[1]["metadata"] == {"name": "vm1", "namespace": NAMESPACE}
    raw = k.request("GET", VMI.path(NAMESPACE), query={"includeObject": "None"}, accept=_AS_TABLE)
    assert all(row.get("object") is None for row in raw["rows"])
    with pytest.raises(ValueError, match="need a namespace"):
        next(k.list_rows(VMI, metadata=False))


def test_the_metadata_form_answers_partial_object_metadata_items(cluster):
    k = kube(cluster)
    page = k.request("GET", VMI.path(NAMESPACE), accept=_AS_METADATA)
    assert (page["kind"], page["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert page["metadata"]["resourceVersion"]
    item = page["items"][0]
    assert set(item) == {"kind", "apiVersion", "metadata"}
    assert (item["kind"], item["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert [m["metadata"]["name"] for m in k.list_metadata(VMI, NAMESPACE)] == [f"vm{i}" for i in range(5)]


def test_resource_version_0_is_served_whole_limit_or_not(cluster):
    k = kube(cluster, page_size=2)
    page = k.request("GET", VMI.path(NAMESPACE), query={"limit": 2, "resourceVersion": "0"})
    assert len(page["items"]) == 5 and not page["metadata"].get("continue")
    paged = k.request("GET", VMI.path(NAMESPACE), query={"limit": 2})
    assert len(paged["items"]) == 2 and paged["metadata"]["continue"]
    before = k.calls
    assert len(list(k.list(VMI, NAMESPACE, cached=True))) == 5 and k.calls - before == 1
    before = k.calls
    assert len(list(k.list(VMI, NAMESPACE))) == 5 and k.calls - before == 3


def test_a_continue_token_goes_on_with_resource_version_0_and_is_refused_with_any_other(cluster):
    k = kube(cluster)
    first = k.request("GET", VMI.path(NAMESPACE), query={"limit": 2})
    token = first["metadata"]["continue"]
    second = k.request("GET", VMI.path(NAMESPACE), query={"limit": 2, "continue": token, "resourceVersion": "0"})
    assert [i["metadata"]["name"] for i in second["items"]] == ["vm2", "vm3"] and second["metadata"]["continue"]
    with pytest.raises(Invalid, match="specifying resource version is not allowed when using continue"):
        k.request("GET", VMI.path(NAMESPACE), query={"limit": 2, "continue": token,
                                                     "resourceVersion": first["metadata"]["resourceVersion"]})


def test_an_accept_header_naming_only_unknown_forms_is_refused_406(cluster):
    with pytest.raises(Unavailable, match="406|NotAcceptable|only the following media types"):
        kube(cluster).request("GET", VMI.path(NAMESPACE), accept="application/json;as=Nonsense;v=v1;g=meta.k8s.io")


# -- a watch of the changes since a list (Kube.rows, Kube.changes: migration-report's cursor) ---------------------
def test_the_changes_since_a_list_are_exactly_those_made_after_it_in_order(cluster):
    k = kube(cluster)
    rows = k.rows(VMI, NAMESPACE, cached=True)
    assert len(rows) == 5 and rows.resource_version
    quiet = k.changes(VMI, NAMESPACE, rows.resource_version)
    assert quiet.events == [] and quiet.resource_version == rows.resource_version
    k.merge_patch(VMI, NAMESPACE, "vm3", {"metadata": {"labels": {"changed": "once"}}})
    k.merge_patch(VMI, NAMESPACE, "vm0", {"metadata": {"labels": {"changed": "once"}}})
    k.merge_patch(VMI, NAMESPACE, "vm3", {"metadata": {"labels": {"changed": "twice"}}})
    seen = k.changes(VMI, NAMESPACE, rows.resource_version)
    assert [(kind, obj["metadata"]["name"], obj["metadata"]["labels"]["changed"]) for kind, obj in seen.events] == [
        ("MODIFIED", "vm3", "once"), ("MODIFIED", "vm0", "once"), ("MODIFIED", "vm3", "twice")]
    assert seen.resource_version == seen.events[-1][1]["metadata"]["resourceVersion"]
    assert k.changes(VMI, NAMESPACE, seen.resource_version).events == []  # from where it got to: nothing new


def test_the_changes_since_a_version_the_server_no_longer_keeps_are_expired(cluster):
    if hasattr(cluster, "compact"):
        cluster.compact()  # the simulator's history starts at its store; a real watch cache at its first list
    with pytest.raises(Expired, match="too old resource version"):
        kube(cluster).changes(VMI, NAMESPACE, "1")


def test_get_metadata_answers_one_objects_metadata_named_as_its_kind(cluster):
    k = kube(cluster)
    full = k.get(VMI, NAMESPACE, "vm2")
    found = k.get_metadata(VMI, NAMESPACE, "vm2")
    assert found is not None and set(found) == {"apiVersion", "kind", "metadata"}
    assert (found["apiVersion"], found["kind"]) == ("kubevirt.io/v1", "VirtualMachineInstance")
    assert found["metadata"]["uid"] == full["metadata"]["uid"]
    assert k.get_metadata(VMI, NAMESPACE, "absent") is None

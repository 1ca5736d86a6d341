"""Where the simulator and a real kube-apiserver must agree, asked of both: each test runs on the simulated
API server and on the real control plane, through the same `kubernetes` client over HTTP. Each row here is
a divergence a real server exposed, fixed in the simulator (docs/control-plane.md lists them)."""
from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from shared.kinds import EVENT, VM
from shared.kube import Kube
from simcluster.builders.kubevirt import make_vm
from tests import backends


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1", virt_controller=False)  # the API server alone: nothing else writes
    yield c
    c.stop()


def kube(cluster) -> Kube:
    return Kube(cluster.api_client())


def status_code(call) -> int:
    try:
        call()
    except ApiException as exc:
        return exc.status
    except Exception as exc:  # shared.kube errors carry no status attribute; read it from the class
        return {"NotFound": 404, "Forbidden": 403, "Invalid": 422, "Conflict": 409,
                "Unavailable": 500}.get(type(exc).__name__, 0)
    return 200


def vm(name: str, namespace: str = "default", **metadata) -> dict:
    """A VM as a client posts it: the builder's spec, no server-set metadata."""
    return {**make_vm(name, namespace), "metadata": {"name": name, "namespace": namespace, **metadata}}


def event(name: str, namespace: str = "default", involved_namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm1",
                               "namespace": involved_namespace},
            "reason": "Test", "message": "m", "type": "Normal", "count": 1,
            "source": {"component": "fidelity"}, "reportingComponent": "fidelity"}


def test_a_write_that_changes_nothing_is_not_written(cluster):
    k = kube(cluster)
    created = k.create(VM, "default", vm("noop", labels={"a": "b"}))
    again = k.merge_patch(VM, "default", "noop", {"metadata": {"labels": {"a": "b"}}})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    changed = k.merge_patch(VM, "default", "noop", {"metadata": {"labels": {"a": "c"}}})
    assert changed["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]


def test_a_create_that_names_a_resource_version_is_refused(cluster):
    assert status_code(lambda: kube(cluster).create(VM, "default", vm("with-rv", resourceVersion="7"))) >= 500


def test_a_continued_list_reads_the_snapshot_of_its_first_page(cluster):
    k = kube(cluster)
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "paging"}})
    for name in ("page-a", "page-b"):
        k.create(VM, "paging", vm(name, "paging"))
    first = k.request("GET", VM.path("paging"), query={"limit": 1})
    assert [i["metadata"]["name"] for i in first["items"]] == ["page-a"]
    k.create(VM, "paging", vm("page-c", "paging"))
    cluster.delete("kubevirt.io/v1", "VirtualMachine", "paging", "page-b")
    rest = k.request("GET", VM.path("paging"), query={"limit": 10, "continue": first["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in rest["items"]] == ["page-b"]  # as it was: no page-c, page-b still there


def test_an_event_lives_in_its_objects_namespace(cluster):
    k = kube(cluster)
    assert status_code(lambda: k.create(EVENT, "default", event("wrong-ns", involved_namespace="other"))) == 422
    assert status_code(lambda: k.create(EVENT, "default", event("right-ns"))) == 200


def test_namespace_lifecycle_answers_before_validation(cluster):
    """NamespaceLifecycle is admission, which runs before the object's own validation."""
    bad = vm("invalid", "nowhere-either")
    bad["spec"]["runStrategy"] = 5
    assert status_code(lambda: kube(cluster).create(VM, "nowhere-either", bad)) == 404


def test_the_initial_namespaces_cannot_be_deleted(cluster):
    for name in ("default", "kube-system", "kube-public"):
        assert status_code(lambda n=name: kube(cluster).request("DELETE", f"/api/v1/namespaces/{n}")) == 403


def test_nothing_is_created_in_a_missing_or_terminating_namespace(cluster):
    k = kube(cluster)
    assert status_code(lambda: k.create(VM, "nowhere", vm("x", "nowhere"))) == 404
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "closing"}})
    k.create(VM, "closing", vm("held", "closing", finalizers=["test/hold"]))
    cluster.delete("v1", "Namespace", None, "closing")
    namespace = cluster.get("v1", "Namespace", None, "closing")
    assert namespace["metadata"].get("deletionTimestamp") and namespace["status"]["phase"] == "Terminating"
    assert status_code(lambda: k.create(VM, "closing", vm("late", "closing"))) == 403
    deadline = time.monotonic() + 30
    while cluster.get("kubevirt.io/v1", "VirtualMachine", "closing", "held") and \
            not (cluster.get("kubevirt.io/v1", "VirtualMachine", "closing", "held")["metadata"].get(
                "deletionTimestamp")):
        assert time.monotonic() < deadline, "the namespace's content was not deleted"
        time.sleep(0.2)
    cluster.patch("kubevirt.io/v1", "VirtualMachine", "closing", "held", {"metadata": {"finalizers": None}})
    while cluster.get("v1", "Namespace", None, "closing") is not None:
        assert time.monotonic() < deadline, "an emptied Terminating namespace did not go away"
        time.sleep(0.2)


@pytest.fixture(scope="module", params=backends.params())
def short_ttl(request):
    """A cluster whose Events expire 4 s after their last write (kube-apiserver --event-ttl=4s)."""
    if request.param == backends.SIM:
        from simcluster.apiserver import SimCluster

        c = SimCluster(event_ttl=4.0).start()
        yield c
        c.stop()
        return
    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    if backends.real_missing() and not backends.in_ci():
        pytest.skip(backends.real_missing())
    plane = ControlPlane(event_ttl="4s", controller_manager=False, die_with_parent=True).start()
    try:
        c = RealCluster(plane, "1.3.1").start()
        yield c
        c.stop()
    finally:
        plane.remove()


def test_events_expire_a_ttl_after_their_last_write(short_ttl):
    k = kube(short_ttl)
    k.create(EVENT, "default", event("kept"))
    k.create(EVENT, "default", event("dropped"))
    time.sleep(2.5)
    k.merge_patch(EVENT, "default", "kept", {"count": 2})  # a write renews the TTL
    deadline = time.monotonic() + 8
    while k.get(EVENT, "default", "dropped") is not None:
        assert time.monotonic() < deadline, "an Event outlived its TTL"
        time.sleep(0.25)
    assert k.get(EVENT, "default", "kept") is not None, "a renewed Event expired with the TTL of its first write"
    while k.get(EVENT, "default", "kept") is not None:
        assert time.monotonic() < deadline + 4, "a renewed Event never expired"
        time.sleep(0.25)

"""Our ApiServerSource stand-in sends what Knative's own adapter sends: both watch the same real API server with
the source's ServiceAccount from deploy/, and the CloudEvents they deliver for the same changes must agree in
every attribute a function reads (the stand-in serves the simulator backend, where Knative's adapter cannot run:
it needs a real kube-apiserver's informers)."""
from __future__ import annotations

import time

import pytest

from controlplane import build
from localknative.knative_source import KnativeApiServerSource, source_config
from localknative.runtime import load_manifests
from localknative.sources import ApiServerSourceAdapter
from simcluster.alertmanager import Receiver
from simcluster.builders.kubevirt import make_vmi
from simcluster.paths import DEPLOY_DIR
from simcluster.play import namespaces_of
from tests import backends

pytestmark = [pytest.mark.real, pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                                   reason=f"real control plane: {backends.real_missing()}")]
# What differs by nature: each event's id and time, the transport's own headers.
VARYING = {"ce-id", "ce-time", "content-length", "host", "user-agent", "accept-encoding", "accept", "connection",
           "traceparent"}


def manifest(name: str) -> dict:
    return next(m for m in load_manifests(DEPLOY_DIR)
                if m["kind"] == "ApiServerSource" and m["metadata"]["name"] == name)


def test_source_config_is_what_the_knative_controller_writes():
    config = source_config(manifest("vmevents-launcher-pods"), namespaces_of=lambda selector: ["a", "b"])
    assert config["allNamespaces"] is True and config["namespaces"] == ["a", "b"] and config["mode"] == "Resource"
    assert config["resources"] == [{"gvr": {"Group": "", "Version": "v1", "Resource": "pods"},
                                    "selector": "kubevirt.io=virt-launcher"}]


@pytest.fixture(scope="module")
def cluster():
    from controlplane.cluster import RealCluster

    # API level: nothing acts on the VMI but the test (no virt-controller), and both adapters talk to kube-apiserver
    # itself (no fault proxy), whose address is the source of every CloudEvent.
    c = RealCluster(backends.control_plane(), "1.3.1", virt_controller=False, fault_proxy=False).start()
    yield c
    c.stop()


def received(receiver: Receiver, name: str, count: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in receiver.posts if {k.lower(): v for k, v in p["headers"].items()}.get("ce-name") == name]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{len(found)} of {count} events about {name} arrived")


def test_the_stand_in_sends_what_knatives_adapter_sends(cluster):
    source = manifest("vmevents-vmis")
    sa = f"{source['metadata']['namespace']}/{source['spec']['serviceAccountName']}"
    theirs, ours = Receiver().start(), Receiver().start()
    knative = KnativeApiServerSource(source, build.ensure(build.KNATIVE) / "apiserver_receive_adapter",
                                     cluster.kubeconfig(sa), theirs.url,
                                     namespaces_of=namespaces_of(cluster),
                                     listed=lambda m: cluster.listed_by(sa, m))
    stand_in = ApiServerSourceAdapter(source, cluster.api_client(sa), ours.url, cluster.url)
    try:
        cluster.clear_requests()
        knative.start()
        stand_in.start()
        created = cluster.create(make_vmi("compared", phase="Running", finished=None))
        cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "compared",
                      {"metadata": {"labels": {"seen": "twice"}}})
        cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "compared")
        a, b = received(theirs, "compared", 3), received(ours, "compared", 3)
    finally:
        stand_in.stop()
        knative.stop()
        theirs.stop()
        ours.stop()
    assert created["metadata"]["uid"]

    def attributes(post: dict) -> dict:
        return {k.lower(): v for k, v in post["headers"].items() if k.lower() not in VARYING}

    for theirs_post, ours_post in zip(a, b, strict=True):
        mine, knatives = attributes(ours_post), attributes(theirs_post)
        assert mine == knatives, {k: (mine.get(k), knatives.get(k)) for k in mine.keys() | knatives.keys()
                                  if mine.get(k) != knatives.get(k)}
    assert [p["body"]["metadata"]["resourceVersion"] for p in b] == [p["body"]["metadata"]["resourceVersion"]
                                                                      for p in a]
    assert [p["body"] for p in b] == [p["body"] for p in a]

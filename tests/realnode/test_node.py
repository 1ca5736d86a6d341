"""The real node itself (`make cluster NODE=real`): the node registers and goes Ready (kubelet on containerd, the node
lifecycle controller lifting the not-ready taint), a plain pod runs on it with an address from the CNI bridge, and the
real kube-scheduler refuses a pod that asks for more memory than the node has, in its own words."""
from __future__ import annotations

import ipaddress
import time

import pytest

from controlplane import node as realnode

# `real` too: the lane needs the binaries and runs with the real rows (tests/run.py), never among the others.
pytestmark = [pytest.mark.realnode, pytest.mark.real, pytest.mark.timeout(2700)]
PAUSE = "localhost/vmevents/pause:3.10"


def wait_for(what, check, timeout=120.0):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(real_node):
    return real_node.cluster


def pod(name: str, memory: str = "16Mi") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "pause", "image": PAUSE,
                                     "resources": {"requests": {"memory": memory, "cpu": "10m"}}}]}}


def test_the_node_is_ready_untainted_and_reports_the_machine(cluster):
    obj = cluster.get("v1", "Node", None, realnode.NODE_NAME)
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert not [t for t in obj["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
    assert obj["status"]["nodeInfo"]["kubeletVersion"] == "v1.33.13"
    assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6")
    assert {"type": "InternalIP", "address": realnode.pki.NODE_IP} in obj["status"]["addresses"]
    # The kubelet's capacity is the machine's (cadvisor), not a number we posted.
    memory_kib = int(obj["status"]["capacity"]["memory"].removesuffix("Ki"))
    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    assert abs(memory_kib - total_kib) < total_kib * 0.01


def test_a_pod_runs_on_the_node_with_an_address_from_the_bridge(cluster):
    cluster.create(pod("plain"))
    try:
        running = wait_for("the pod Running", lambda: (p := cluster.get("v1", "Pod", "default", "plain"))
                           and p["status"].get("phase") == "Running" and p)
        assert running["spec"]["nodeName"] == realnode.NODE_NAME
        assert ipaddress.ip_address(running["status"]["podIP"]) in ipaddress.ip_network(realnode.POD_SUBNET)
        (status,) = running["status"]["containerStatuses"]
        assert status["ready"] and "running" in status["state"]
        assert status["containerID"].startswith("containerd://")
        scheduled = wait_for("the scheduler's Scheduled Event", lambda: [
            e for e in cluster.list("v1", "Event", "default", field_selector="involvedObject.name=plain")
            if e["reason"] == "Scheduled"])
        assert scheduled[0]["source"].get("component") == "default-scheduler" or \
            scheduled[0].get("reportingComponent") == "default-scheduler"
    finally:
        cluster.delete("v1", "Pod", "default", "plain")


def test_the_scheduler_refuses_a_pod_that_asks_for_more_memory_than_the_node_has(cluster):
    cluster.create(pod("too-big", memory="1Ti"))
    try:
        events = wait_for("a FailedScheduling Event", lambda: [
            e for e in cluster.list("v1", "Event", "default", field_selector="involvedObject.name=too-big")
            if e["reason"] == "FailedScheduling"])
        assert events[0]["message"].startswith("0/1 nodes are available: 1 Insufficient memory.")
        # kube-scheduler records the Event and patches the pod's status as two writes (its failure handler):
        # either may land first
        def conditions() -> dict:
            found = {c["type"]: c for c in (cluster.get("v1", "Pod", "default", "too-big").get("status") or {}).get(
                "conditions") or []}
            return found if "PodScheduled" in found else {}

        condition = wait_for("the pod's PodScheduled condition", conditions)
        assert condition["PodScheduled"]["status"] == "False"
        assert condition["PodScheduled"]["reason"] == "Unschedulable"
    finally:
        cluster.delete("v1", "Pod", "default", "too-big")

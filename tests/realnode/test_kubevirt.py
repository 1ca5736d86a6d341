"""KubeVirt on the real node (milestone B): virt-operator installed the rest, virt-handler runs privileged on the node
and labelled it, virt-api's aggregated subresources start and stop a VM, and a VMI runs the guest under TCG in a
launcher pod on containerd, its serial console reachable through virt-api and virt-handler."""
from __future__ import annotations

import pytest

from controlplane import console
from controlplane import node as realnode
from controlplane.cluster import RealClusterError
from tests.realnode.guests import NAMESPACE, guest_vm, launcher_pods, vmi_phase, wait_for

pytestmark = [pytest.mark.realnode, pytest.mark.real, pytest.mark.timeout(2700)]


def test_virt_operator_deployed_kubevirt_and_virt_handler_labelled_the_node(real_node):
    cluster = real_node.cluster
    kv = cluster.get("kubevirt.io/v1", "KubeVirt", "kubevirt", "kubevirt")
    assert kv["status"]["phase"] == "Deployed"
    assert kv["status"]["observedKubeVirtVersion"] == "v1.3.0"
    pods = {p["metadata"]["labels"].get("kubevirt.io"): p for p in cluster.list("v1", "Pod", "kubevirt")}
    for component in ("virt-operator", "virt-api", "virt-controller", "virt-handler"):
        assert pods[component]["status"]["phase"] == "Running", (component, pods[component]["status"])
        assert pods[component]["spec"]["nodeName"] == realnode.NODE_NAME
    handler = pods["virt-handler"]["spec"]["containers"][0]
    assert handler["securityContext"]["privileged"] is True
    node = cluster.get("v1", "Node", None, realnode.NODE_NAME)
    assert node["metadata"]["labels"]["kubevirt.io/schedulable"] == "true"
    # virt-handler's device plugins: tun always (launcher pods ask for it); kvm is advertised because /dev/kvm opens,
    # although no guest can run under it here (useEmulation: launcher pods do not ask for it).
    assert node["status"]["allocatable"]["devices.kubevirt.io/tun"] == "1k"   # 1000, as virt-handler advertises
    services = {s["metadata"]["name"] for s in cluster.raw("GET", "/api/v1/namespaces/kubevirt/services")["items"]}
    assert "virt-api" in services
    api = cluster.raw("GET", "/apis/apiregistration.k8s.io/v1/apiservices/v1.subresources.kubevirt.io")
    available = {c["type"]: c["status"] for c in api["status"]["conditions"]}
    assert available["Available"] == "True", api["status"]


def test_a_vm_started_through_virt_api_runs_the_guest_and_stops_through_virt_api(real_node):
    cluster, name = real_node.cluster, "boots"
    cluster.create(guest_vm(name, run_strategy="Halted"))
    try:
        cluster.vm_subresource(NAMESPACE, name, "start")   # virtctl start: Halted → Always, as virt-api does
        assert cluster.get("kubevirt.io/v1", "VirtualMachine", NAMESPACE, name)["spec"]["runStrategy"] == "Always"
        wait_for("the VMI Running", lambda: vmi_phase(cluster, name) == "Running", explain=real_node.logs)
        vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", NAMESPACE, name)
        assert vmi["status"]["nodeName"] == realnode.NODE_NAME
        (pod,) = launcher_pods(cluster, name)
        assert pod["status"]["phase"] == "Running"
        compute = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "compute")
        assert compute["containerID"].startswith("containerd://") and "running" in compute["state"]
        shown = console.run(real_node.plane, NAMESPACE, name, "cat /proc/cmdline", expect="quiet")
        assert "console=ttyS0" in shown
        with pytest.raises(RealClusterError, match="409"):      # virt-api refuses to start a running VM
            cluster.vm_subresource(NAMESPACE, name, "start")
        cluster.vm_subresource(NAMESPACE, name, "stop")
        wait_for("the VMI gone", lambda: cluster.get("kubevirt.io/v1", "VirtualMachineInstance", NAMESPACE, name)
                 is None)
        assert cluster.get("kubevirt.io/v1", "VirtualMachine", NAMESPACE, name)["spec"]["runStrategy"] == "Halted"
    finally:
        cluster.delete("kubevirt.io/v1", "VirtualMachine", NAMESPACE, name)

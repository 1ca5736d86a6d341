"""The real node's lane (tests marked `realnode`): one control plane with kube-scheduler and a real node (containerd,
kubelet, kube-proxy: controlplane/node.py) for the session, and KubeVirt installed on it by virt-operator
(controlplane/kubevirt_node.py) for the tests that ask for it. With CI=true every failure to build or start fails the
lane; elsewhere it skips, with the reason, where the machine lacks what the node needs."""
from __future__ import annotations

import os
import shutil

import pytest

from tests import backends

NODE_TOOLS = ("containerd", "runc", "ctr", "nsenter", "unshare", "ip", "iptables", "debootstrap", "gcc", "setcap",
              "cpio")


def node_missing() -> str | None:
    missing = backends.real_missing()
    if missing:
        return missing
    tools = [t for t in NODE_TOOLS if not shutil.which(t)]
    if tools:
        return f"no {', '.join(tools)} on PATH (.ci/run installs them: containerd, containernetworking-plugins…)"
    if os.geteuid() != 0:
        return "the real node needs root (namespaces, mounts, cgroups)"
    return None


def pytest_collection_modifyitems(config, items):
    why = node_missing()
    for item in items:
        if item.get_closest_marker("realnode") is not None and why and not backends.in_ci():
            item.add_marker(pytest.mark.skip(reason=f"real node: {why}"))


@pytest.fixture(scope="session")
def node_plane():
    """(plane, node): the lane's control plane (ControlPlane(node=True)) and its Ready node."""
    from controlplane.node import RealNode
    from controlplane.server import ControlPlane

    plane = ControlPlane(event_ttl="1h", die_with_parent=True, node=True).start()
    try:
        node = RealNode(plane).start()
    except BaseException:
        plane.remove()
        raise
    yield plane, node
    node.stop()
    plane.remove()


@pytest.fixture(scope="session")
def kubevirt_node(node_plane):
    """KubeVirt on the node (virt-operator, then the rest by the operator): (plane, node, KubeVirtNode)."""
    from controlplane.kubevirt_node import KubeVirtNode

    plane, node = node_plane
    return plane, node, KubeVirtNode(plane, node).start()

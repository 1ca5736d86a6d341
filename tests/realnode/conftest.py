"""The real node's lane (tests marked `realnode`, and `real` so that they run with the real rows): one `make cluster
NODE=real` for the session, through the command a person runs (`python -m controlplane up --node real`, Knative left
out), in a VMEVENTS_CACHE of its own with the built binaries and images shared: the control plane with kube-scheduler,
a real node (containerd, kubelet, kube-proxy: controlplane/node.py) and KubeVirt installed on it by virt-operator
(controlplane/kubevirt_node.py). With CI=true a failure to build or start fails the lane; elsewhere the lane skips,
with the reason, where the machine lacks what the node needs. Each test's timeout covers the session's first start
(a cold machine builds KubeVirt's images inside `up`: debootstrap, minutes)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane import build
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


def controlplane(env: dict, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "controlplane", *args], cwd=build.REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"controlplane {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done


@dataclass
class RealNodeCluster:
    """The session's `make cluster NODE=real`: its environment (for more `python -m controlplane` commands), its
    admin kubeconfig, a handle on its control plane (certificates, URL) and the admin's RealCluster."""
    env: dict
    kubeconfig: str
    state: dict
    plane: object
    cluster: object
    started_after: float

    @property
    def workdir(self) -> Path:
        return Path(self.state["workdir"])

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return controlplane(self.env, *args, timeout=timeout, check=check)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        from controlplane.cluster import kubectl

        return kubectl(*args, kubeconfig=Path(self.kubeconfig), stdin=stdin, check=check)

    def logs(self, size: int = 3000) -> str:
        """The node's and KubeVirt's logs, for a failure's message."""
        tails = []
        for path in [self.workdir / "real-node.log", *sorted((self.workdir / "node-node1").glob("*.log"))]:
            if path.exists():
                tails.append(f"--- {path.name}\n{path.read_text(errors='replace')[-size:]}")
        return "\n".join(tails)


@pytest.fixture(scope="session")
def real_node():
    """VMEVENTS_REALNODE_CACHE=<a VMEVENTS_CACHE>: use the `make cluster NODE=real` already running there (a
    developer's), and leave it running."""
    from controlplane.cluster import RealCluster
    from controlplane.node_up import attach_node

    reuse = os.environ.get("VMEVENTS_REALNODE_CACHE")
    # Not under pytest's basetemp: another pytest session on the machine may remove old basetemps while this runs.
    cache = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="vmevents-realnode-"))
    if not reuse:
        for shared in ("bin", "images"):  # the binaries and images built for every lane, shared
            (build.cache_root().parent / shared).mkdir(parents=True, exist_ok=True)
            (cache / shared).symlink_to(build.cache_root().parent / shared)
    env = {**os.environ, "VMEVENTS_CACHE": str(cache), "KNATIVE": "0", "NODE": "real"}
    env.pop("KUBECONFIG", None)
    started = time.monotonic()
    out = controlplane(env, "up", timeout=2400)
    kubeconfig = next(line.split("KUBECONFIG=", 1)[1] for line in out.stdout.splitlines() if "KUBECONFIG=" in line)
    state = json.loads((cache / "cluster" / "state.json").read_text())
    plane = attach_node(state)
    cluster = RealCluster(plane, state["kubevirt_version"], fault_proxy=False, real_node=True).connect()
    try:
        yield RealNodeCluster(env, kubeconfig, state, plane, cluster, time.monotonic() - started)
    finally:
        cluster.stop()
        if not reuse:
            controlplane(env, "down", timeout=300, check=False)
            shutil.rmtree(cache, ignore_errors=True)

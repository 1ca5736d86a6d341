"""`make run` against a cluster named by KUBECONFIG: it watches that cluster, decides, and (by
default) only reports. The simulated API server stands in for the real cluster here."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from simcluster.apiserver import SimCluster
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.play import virtctl_start
from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def _lines(proc) -> "queue.Queue[str]":
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return lines


def _wait_for(lines, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not printed; got:\n{''.join(seen)}")


def test_with_kubeconfig_it_watches_that_cluster_in_dry_run():
    with SimCluster(kubevirt_version="1.3.1") as cluster, KubeVirtSim(cluster, step_delay=0.01) as kubevirt:
        env = {k: v for k, v in os.environ.items() if k != "VMEVENTS_ACT"}
        env.update(KUBECONFIG=cluster.kubeconfig(), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "localknative"], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            lines = _lines(proc)
            _wait_for(lines, "dry run (set VMEVENTS_ACT=true to act)", 30)
            cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                            "metadata": {"name": "watched", "namespace": "default",
                                         "annotations": {"vmevents.io/cleanup-after": "0s"}},
                            "spec": {"runStrategy": "Manual", "template": {"spec": {"domain": {
                                "devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}})
            virtctl_start(cluster, "default", "watched")
            deadline = time.monotonic() + 20
            while (cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "watched") or {}).get(
                    "status", {}).get("phase") != "Running":
                assert time.monotonic() < deadline, "the VM did not start"
                time.sleep(0.05)
            uid = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "watched")["metadata"]["uid"]
            kubevirt.guest_power_off("default", "watched")
            _wait_for(lines, "would-delete-vmi", 30)
            vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "watched")
            assert vmi is not None and vmi["metadata"]["uid"] == uid, "dry run deleted the VMI"
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
            proc.stdout.close()
        assert code == 0


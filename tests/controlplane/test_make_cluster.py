"""`make cluster` as a person uses it (issue 20's story), through the commands themselves: `python -m controlplane
up` (KubeVirt's virt-controller and the node stand-in; Knative left out), a VM with `runStrategy: Manual` and a
start request (`python -m controlplane start`, what virtctl asks of virt-api), the guest powered off (`guest
poweroff`): KubeVirt leaves a Succeeded VMI and reads the VM Stopped. Then `make run`'s watcher of that cluster
(`python -m localknative`, acting, CLEANUP_AFTER=5s) has vmi-cleanup remove the VMI, and the VM does not start
again. `down` stops everything."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from controlplane import build
from simcluster.builders.kubevirt import make_vm
from tests import backends

pytestmark = [pytest.mark.real, pytest.mark.timeout(900),
              pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                 reason=f"real control plane: {backends.real_missing()}")]
REPO = build.REPO


def run(env: dict, *args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "controlplane", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"controlplane {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def wait_for(what: str, check, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture
def cluster(tmp_path):
    """A `make cluster` of its own (its state in a VMEVENTS_CACHE of its own, the built binaries shared)."""
    build.ensure_all()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "bin").symlink_to(build.cache_root())
    env = {**os.environ, "VMEVENTS_CACHE": str(cache), "KNATIVE": "0", "KUBEVIRT_VERSION": "1.3.1"}
    env.pop("KUBECONFIG", None)
    out = run(env, "up")
    kubeconfig = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("KUBECONFIG=")][0]
    try:
        yield env, kubeconfig
    finally:
        run(env, "down", timeout=120)


def test_a_powered_off_guest_is_cleaned_up_and_its_vm_stays_stopped(cluster):
    env, kubeconfig = cluster
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
    group = ("kubevirt.io", "v1", "default")

    def vmi():
        try:
            return api.get_namespaced_custom_object(*group, "virtualmachineinstances", "demo")
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def vm():
        return api.get_namespaced_custom_object(*group, "virtualmachines", "demo")

    manifest = make_vm("demo", run_strategy="Manual")
    for field in ("uid", "resourceVersion"):
        manifest["metadata"].pop(field)
    manifest.pop("status")
    api.create_namespaced_custom_object(*group, "virtualmachines", manifest)
    assert "start requested" in run(env, "start", "default/demo")
    try:
        first = wait_for("the VMI Running",
                         lambda: (vmi() or {}).get("status", {}).get("phase") == "Running" and vmi())
    except AssertionError:
        logs = sorted((Path(env["VMEVENTS_CACHE"]) / "cluster" / "run").glob("*.log"))
        tails = {log.name: log.read_text(errors="replace")[-1500:] for log in logs
                 if log.name.startswith(("virt-controller", "node-stand-in"))}
        raise AssertionError(f"VM status {vm().get('status')}, VMI {vmi()}, logs {tails}") from None
    run(env, "guest", "poweroff", "default/demo")
    wait_for("the VMI Succeeded and the VM Stopped", lambda: (vmi() or {}).get("status", {}).get("phase") == "Succeeded"
             and vm().get("status", {}).get("printableStatus") == "Stopped")
    assert vmi()["metadata"]["uid"] == first["metadata"]["uid"]  # KubeVirt left it: Manual starts nothing

    watcher = subprocess.Popen([sys.executable, "-m", "localknative"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**env, "KUBECONFIG": kubeconfig, "VMEVENTS_ACT": "true", "CLEANUP_AFTER": "5s"})
    try:
        wait_for("vmi-cleanup to remove the Succeeded VMI", lambda: vmi() is None, timeout=240)
        time.sleep(15)  # long enough for virt-controller to have started a new VMI if it were going to
        assert vmi() is None, "a new VMI appeared: the VM was started again"
        status = vm().get("status", {})
        assert status.get("printableStatus") == "Stopped" and not status.get("ready"), status
    finally:
        watcher.terminate()
        try:
            output, _ = watcher.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            watcher.kill()
            output, _ = watcher.communicate()
    # vmi-cleanup acted on it: when the VMI's own event came before it was due, the re-scan's tick did
    cleaned = [line for line in output.splitlines() if "vmi-cleanup" in line and ("acted on 1" in line
                                                                                or "deleted" in line)]
    assert "ACTING" in output and cleaned, output[-3000:]


@pytest.fixture
def cluster_with_knative(tmp_path):
    build.ensure_all()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "bin").symlink_to(build.cache_root())
    env = {**os.environ, "VMEVENTS_CACHE": str(cache), "KUBEVIRT_VERSION": "1.3.1"}
    env.pop("KUBECONFIG", None)
    try:
        done = subprocess.run([sys.executable, "-m", "controlplane", "up"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        kubeconfig = [line.split("=", 1)[1] for line in done.stdout.splitlines() if line.startswith("KUBECONFIG=")][0]
        yield env, kubeconfig, done.stderr
    finally:
        run(env, "down", timeout=120)  # also after an `up` that failed part-way: what it started is stopped


@pytest.mark.timeout(1500)
def test_a_person_applying_the_default_overlay_gets_a_ready_broker(cluster_with_knative):
    """`make cluster`, then `kubectl apply -k deploy/overlays/default`, as README's Install says: the Broker is Ready
    (its channel template defaulted by Knative's webhook), and `up` said how to see the functions answer."""
    from tests.deploy.kustomize import kubectl

    env, kubeconfig, said = cluster_with_knative
    assert "Knative's broker vmevents/default delivers to the functions" in said and "guest poweroff" in said
    subprocess.run([kubectl(), "--kubeconfig", kubeconfig, "apply", "-k", str(REPO / "deploy" / "overlays" /
                                                                              "default")],
                   check=True, capture_output=True, text=True, timeout=300)
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))

    def ready():
        broker = api.get_namespaced_custom_object("eventing.knative.dev", "v1", "vmevents", "brokers", "default")
        conditions = {c["type"]: c for c in (broker.get("status") or {}).get("conditions") or []}
        return conditions.get("Ready", {}).get("status") == "True" and broker
    broker = wait_for("the Broker Ready", ready, timeout=420)
    assert broker["spec"]["config"]["name"] == "config-br-default-channel"

"""`vmevents knative` (cli/knative.py): for Kubernetes 1.29–1.35 it picks what README's table says (or refuses with
the Harvester upgrade), applies a release's files in Knative's order and waits until Ready, and on the real control
plane reads its version and installs Knative Eventing 1.21.2 from the release files the vendored config makes."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli import knative
from cli.__main__ import main
from tests import backends
from tests.conftest import REPO


def readme_table() -> dict[tuple[int, int], str]:
    """README's table: Kubernetes minor → the newest Knative it names ("none" when it names none)."""
    found = {}
    for _harvester, versions, newest in re.findall(r"^\| ([\d., x]+) \| ([\d., ]+) \| ([^|]+) \|$",
                                                  (REPO / "README.md").read_text(), re.M):
        for version in versions.split(","):
            major, minor = version.strip().split(".")
            found[(int(major), int(minor))] = "none" if newest.startswith("none") else newest.strip()
    return found


@pytest.mark.parametrize("minor", range(29, 36))
def test_the_plan_is_readmes_table(minor):
    table = readme_table()
    assert (1, minor) in table, f"README's table has no row for Kubernetes 1.{minor}"
    found = knative.plan((1, minor))
    assert (found.release.minor if found.release else "none") == table[(1, minor)]


def test_a_refusal_names_the_reason_and_the_upgrade():
    found = knative.plan((1, 30))
    assert found.refused and "Harvester 1.4.1" in found.reason and "1.18 needs 1.31" in found.reason
    assert "Harvester 1.4.2 or 1.4.3 for Knative 1.18" in found.reason
    assert "Harvester 1.7 for Knative 1.22" in found.reason
    assert main(["knative", "plan", "--kubernetes", "1.29"]) == 3


def test_the_version_is_read_as_kubernetes_writes_it():
    assert knative.kubernetes_version("v1.33.13+rke2r1") == (1, 33)
    assert knative.kubernetes_version("1.35.2") == (1, 35)
    with pytest.raises(ValueError):
        knative.kubernetes_version("latest")


def test_the_plan_names_readmes_release_files_in_knatives_order():
    steps = knative.plan((1, 34)).steps()
    assert [s.url() for s in steps] == [
        "https://github.com/knative/serving/releases/download/knative-v1.22.1/serving-crds.yaml",
        "https://github.com/knative/serving/releases/download/knative-v1.22.1/serving-core.yaml",
        "https://github.com/knative-extensions/net-kourier/releases/download/knative-v1.22.0/kourier.yaml",
        "https://github.com/knative/eventing/releases/download/knative-v1.22.2/eventing-crds.yaml",
        "https://github.com/knative/eventing/releases/download/knative-v1.22.2/eventing-core.yaml",
        "https://github.com/knative/eventing/releases/download/knative-v1.22.2/in-memory-channel.yaml",
        "https://github.com/knative/eventing/releases/download/knative-v1.22.2/mt-channel-broker.yaml"]


class Kubectl:
    """A kubectl that records what it is asked and answers as told."""

    def __init__(self, failing: str | None = None):
        self.calls: list[list[str]] = []
        self.failing = failing

    def __call__(self, args):
        self.calls.append(list(args))
        code = 1 if self.failing and self.failing in " ".join(args) else 0
        return subprocess.CompletedProcess(args, code, "", "error: the server could not find the requested resource"
                                           if code else "")


def test_install_applies_waits_for_the_crds_sets_kourier_and_waits_until_ready(tmp_path: Path):
    for step in knative.plan((1, 33)).steps():
        (tmp_path / step.file).write_text("# a release file\n")
    kubectl = Kubectl()
    knative.install(knative.plan((1, 33)), ["kubectl"], source=tmp_path, run=kubectl, say=lambda _: None)
    said = [" ".join(c[1:4]) for c in kubectl.calls]
    assert said == [f"apply -f {tmp_path}/serving-crds.yaml", "wait --for=condition=Established crd",
                    f"apply -f {tmp_path}/serving-core.yaml", f"apply -f {tmp_path}/kourier.yaml",
                    "patch configmap/config-network -n", f"apply -f {tmp_path}/eventing-crds.yaml",
                    "wait --for=condition=Established crd", f"apply -f {tmp_path}/eventing-core.yaml",
                    f"apply -f {tmp_path}/in-memory-channel.yaml", f"apply -f {tmp_path}/mt-channel-broker.yaml",
                    "wait --for=condition=Available deployment", "wait --for=condition=Available deployment",
                    "wait --for=condition=Available deployment"]
    assert [c[-2] for c in kubectl.calls if "--for=condition=Available" in c] == [
        "knative-serving", "kourier-system", "knative-eventing"]


def test_install_stops_at_the_step_that_fails_naming_it(tmp_path: Path):
    with pytest.raises(knative.InstallError, match="has no serving-crds.yaml"):
        knative.install(knative.plan((1, 33)), ["kubectl"], source=tmp_path, run=Kubectl(), say=lambda _: None)
    kubectl = Kubectl(failing="kourier.yaml")
    with pytest.raises(knative.InstallError, match="kubectl apply -f .*could not find the requested resource"):
        knative.install(knative.plan((1, 33)), ["kubectl"], run=kubectl, say=lambda _: None)
    assert not any("eventing" in " ".join(c) for c in kubectl.calls), "went on after a failed step"


# -- on the real control plane ------------------------------------------------------------------------------
@pytest.mark.real
@pytest.mark.timeout(1500)
@pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                    reason=f"real control plane: {backends.real_missing()}")
def test_it_reads_the_real_control_planes_version_and_installs_knative_eventing(tmp_path: Path):
    """A control plane of its own (Knative on the session's would be installed twice), a node stand-in that runs
    Knative's Deployments (controlplane/kubelet.py), and the release files written from the vendored Knative
    1.21.2 config (its ko:// images are the binaries controlplane/build.py builds from the same Go modules)."""
    from controlplane import build
    from controlplane.knative import Api, write_release
    from controlplane.kubelet import Kubelet
    from controlplane.server import ControlPlane
    from tests.deploy.kustomize import kubectl

    plane = ControlPlane(workdir=tmp_path / "plane", die_with_parent=True).start()
    kubelet = None
    try:
        kubeconfig = str(plane.admin_kubeconfig)
        done = subprocess.run([sys.executable, "-m", "cli", "knative", "plan", "--kubeconfig", kubeconfig],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith(
            f"Kubernetes {build.KUBE.version[1:].rsplit('.', 1)[0]} (Harvester 1.6): Knative 1.21"), done
        release = write_release(tmp_path / "release")
        binaries = build.ensure(build.KNATIVE)
        images = {f"ko://knative.dev/eventing/cmd/{c}": binaries / c.rsplit("/", 1)[-1] for c in build.KNATIVE_COMMANDS}
        (tmp_path / "pods").mkdir()
        kubelet = Kubelet(plane, Api(plane), images, tmp_path / "pods", die_with_parent=True)
        kubelet.start()
        done = subprocess.run([sys.executable, "-m", "cli", "knative", "install", "--kubeconfig", kubeconfig,
                               "--from", str(release), "--components", "eventing", "--timeout", "900",
                               "--kubectl", kubectl()], capture_output=True, text=True, cwd=REPO, timeout=1000)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "waiting until every Deployment in knative-eventing is Available" in done.stdout
        assert "Knative 1.21 is ready (eventing)" in done.stdout
    finally:
        if kubelet is not None:
            kubelet.stop()
        plane.remove()

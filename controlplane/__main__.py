"""`python -m controlplane up|down|status|build|guest`: a real control plane for a person (`make cluster`).

`up` builds what is not cached, starts etcd, kube-apiserver and kube-controller-manager in the background,
installs the upstream CRDs and deploy/ (as `make deploy` would on a real cluster), starts KubeVirt's
virt-controller (KUBEVIRT_VERSION) and the node stand-in (scheduler, kubelet, virt-handler: `node`), then Knative
(its broker, channel, sources and webhooks; controlplane/knative_up.py keeps it running; KNATIVE=0 skips it),
prints `KUBECONFIG=<path>` and returns. `guest poweroff|crash NAMESPACE/NAME` is what the guest of a running VMI
does, as the node reports it. `down` stops them all and removes their folder. State lives in
~/.cache/vmevents/cluster/ (VMEVENTS_CACHE moves it), so `down` works from any shell.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from controlplane import build


def _state_dir() -> Path:
    return build.cache_root().parent / "cluster"


def _state_file() -> Path:
    return _state_dir() / "state.json"


def _alive(pid: int) -> bool:
    """The process is running and is one of ours (a pid from an old state file may belong to another now)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in command for name in (b"etcd", b"kube-apiserver", b"kube-controller-manager",
                                            b"virt-controller", b"controlplane\x00node", b"controlplane.knative_up"))


def up(event_ttl: str, kubevirt_version: str, knative: bool = True) -> int:
    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    state = _read_state()
    if state and all(_alive(pid) for pid in state["pids"].values()):
        print(f"already running: KUBECONFIG={state['kubeconfig']}")
        return 0
    _stop(state)
    workdir = _state_dir() / "run"
    shutil.rmtree(workdir, ignore_errors=True)  # a crashed run's etcd data would not match fresh certificates
    started = time.monotonic()
    plane = ControlPlane(event_ttl=event_ttl, workdir=workdir)
    plane.start(say=lambda text: print(text, file=sys.stderr, flush=True))
    try:
        # No fault proxy: it lives in this process, which returns, and virt-controller would talk through it.
        cluster = RealCluster(plane, kubevirt_version, fault_proxy=False).start()
        cluster.stop()
        state = {**plane.state(), "kubevirt_version": kubevirt_version}
        controller = cluster.virt_controller
        if controller is not None and controller.process is not None:
            state["pids"]["virt-controller"] = controller.process.pid
        _state_file().write_text(json.dumps(state, indent=2))
        log = open(workdir / "node-stand-in.log", "wb")  # noqa: SIM115 - the child keeps it
        node = subprocess.Popen([sys.executable, "-m", "controlplane", "node"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        state["pids"]["controlplane node"] = node.pid
    except BaseException:
        plane.remove()
        raise
    _state_file().write_text(json.dumps(state, indent=2))
    plane.processes.clear()  # they keep running after this process exits: `down` stops them
    if knative:
        state["pids"]["knative"] = _start_knative(workdir)
        _state_file().write_text(json.dumps(state, indent=2))
    print(f"control plane ready in {time.monotonic() - started:.1f}s (kube-apiserver {build.KUBE.version}, "
          f"etcd {build.ETCD.version}, KubeVirt {kubevirt_version}: virt-controller and the node stand-in, "
          f"deploy/ applied, --event-ttl={event_ttl}"
          f"{', Knative ' + build.KNATIVE.version + ' (eventing, broker, channel, webhooks)' if knative else ''})",
          file=sys.stderr)
    print(f"KUBECONFIG={plane.admin_kubeconfig}")
    return 0


def _start_knative(workdir: Path, timeout: float = 300.0) -> int:
    """Knative's process (controlplane/knative_up.py), in the background; its pid once Knative is ready."""
    import subprocess

    log = open(workdir / "knative.log", "wb")  # noqa: SIM115 - the process keeps it
    process = subprocess.Popen([sys.executable, "-m", "controlplane.knative_up", str(_state_file())],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    deadline = time.monotonic() + timeout
    while not (workdir / "knative.ready").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Knative did not start; see {workdir / 'knative.log'}")
        time.sleep(0.5)
    return process.pid


def _read_state() -> dict | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None


def _stop(state: dict | None) -> None:
    if not state:
        return
    for name in ("knative", "controlplane node", "virt-controller", "kube-controller-manager", "kube-apiserver",
                 "etcd"):
        pid = state["pids"].get(name)
        if pid and _alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)


def down() -> int:
    state = _read_state()
    if not state:
        print("no control plane is running")
        return 0
    _stop(state)
    shutil.rmtree(state["workdir"], ignore_errors=True)
    _state_file().unlink(missing_ok=True)
    print("control plane stopped")
    return 0


def status() -> int:
    state = _read_state()
    if not state or not all(_alive(pid) for pid in state["pids"].values()):
        print("no control plane is running (make cluster starts one)")
        return 1
    print(f"running at {state['url']}: KUBECONFIG={state['kubeconfig']}")
    return 0


class _Running:
    """The running cluster of the state file, with what simcluster.kubevirt.sim.KubeVirtSim asks of a cluster."""

    backend = "real"
    runs_virt_controller = True

    def __init__(self, state: dict):
        self.kubevirt_version = state.get("kubevirt_version", "1.3.1")
        self._kubeconfig = state["kubeconfig"]

    def api_client(self, service_account: str | None = None):
        from kubernetes import config

        return config.new_client_from_config(config_file=self._kubeconfig)


def _running_cluster() -> _Running:
    state = _read_state()
    if not state:
        raise RuntimeError("no control plane is running (make cluster starts one)")
    return _Running(state)


def node() -> int:
    """The node stand-in for `make cluster`, in the foreground until it is stopped (`down` does)."""
    from simcluster.kubevirt.sim import KubeVirtSim

    kubevirt = KubeVirtSim(_running_cluster(), node_only=True).start()
    stopped = {"yes": False}
    signal.signal(signal.SIGTERM, lambda *_: stopped.update(yes=True))
    while not stopped["yes"]:
        time.sleep(0.5)
    kubevirt.stop()
    return 0


def guest(action: str, target: str) -> int:
    """The guest of a running VMI powers off or crashes, as virt-handler reports it (one write, then done)."""
    from simcluster.kubevirt.sim import KubeVirtSim

    namespace, _, name = target.rpartition("/")
    kubevirt = KubeVirtSim(_running_cluster(), node_only=True)  # not started: the action runs here, once
    (kubevirt.guest_power_off if action == "poweroff" else kubevirt.guest_crash)(namespace or "default", name)
    print(f"the guest of VMI {namespace or 'default'}/{name}: {action}")
    return 0


def start(target: str) -> int:
    """What `virtctl start` asks of virt-api (no virt-api runs here): the same patch of the VM's spec or status
    that the simulator's subresource computes (simcluster.apiserver._start_patch), as the admin."""
    from kubernetes import client

    from simcluster.apiserver import _start_patch
    from simcluster.store import ApiError

    namespace, _, name = target.rpartition("/")
    namespace = namespace or "default"
    api = client.CustomObjectsApi(_running_cluster().api_client())
    vm = api.get_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", name)
    try:
        vmi = api.get_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances", name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        vmi = None
    try:
        where, operations = _start_patch(vm, vmi, name, {}, None, None)
    except ApiError as exc:  # virt-api's 409: already running, or the run strategy takes no start request
        print(f"controlplane: VM {namespace}/{name}: {exc}", file=sys.stderr)
        return 1
    patch = api.patch_namespaced_custom_object_status if where == "status" else api.patch_namespaced_custom_object
    patch("kubevirt.io", "v1", namespace, "virtualmachines", name, operations,
          _content_type="application/json-patch+json")
    print(f"VM {namespace}/{name}: start requested ({where})")
    return 0


def prepare() -> int:
    """Before the tests (`make test`): start the control plane's builds in the background if Go is here (what
    is cached is not rebuilt). The tests that need no binary run first, and the first that needs one waits for
    the builds (tests/conftest.py). Without Go the real-backend tests skip, saying so once; with CI=true a
    missing Go is an error."""
    if not build.buildable():
        if os.environ.get("CI", "").lower() == "true":
            print("controlplane: CI=true but no `go` on PATH: the real-control-plane tests cannot run", file=sys.stderr)
            return 1
        print("real control plane: not built (no Go on PATH); its tests will skip. Install Go >= 1.25 to run them.")
        return 0
    state = build.start_background()
    if state != "built":
        print(f"real control plane: building in the background ({state}; log: {build.background_log()}); "
              "the tests that need it run last and wait for it")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "status", "build", "prepare", "node", "guest", "start"))
    parser.add_argument("args", nargs="*", help="guest: poweroff|crash NAMESPACE/NAME; start: NAMESPACE/NAME")
    parser.add_argument("--event-ttl", default=os.environ.get("EVENT_TTL", "1h"),
                        help="kube-apiserver --event-ttl (default 1h, as Kubernetes)")
    parser.add_argument("--kubevirt", default=os.environ.get("KUBEVIRT_VERSION", "1.3.1"),
                        help="the KubeVirt version whose CRDs and virt-controller run (default 1.3.1)")
    parser.add_argument("--no-knative", action="store_true", default=os.environ.get("KNATIVE") == "0",
                        help="skip Knative (its broker, channel, sources and webhooks; KNATIVE=0 does the same)")
    args = parser.parse_args(argv)
    _state_dir().mkdir(parents=True, exist_ok=True)
    try:
        if args.command == "build":
            return build.main()
        if args.command == "prepare":
            return prepare()
        if args.command == "up":
            return up(args.event_ttl, args.kubevirt, knative=not args.no_knative)
        if args.command == "down":
            return down()
        if args.command == "node":
            return node()
        if args.command == "guest":
            if len(args.args) != 2 or args.args[0] not in ("poweroff", "crash"):
                parser.error("guest needs: poweroff|crash NAMESPACE/NAME")
            return guest(*args.args)
        if args.command == "start":
            if len(args.args) != 1:
                parser.error("start needs: NAMESPACE/NAME")
            return start(args.args[0])
        return status()
    except (build.BuildError, RuntimeError) as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

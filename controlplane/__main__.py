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
    return any(name in command for name in (b"etcd", b"kube-apiserver", b"kube-controller-manager", b"kube-scheduler",
                                            b"virt-controller", b"controlplane\x00node", b"controlplane.knative_up",
                                            b"controlplane.node_up"))


def up(event_ttl: str, kubevirt_version: str, knative: bool = True, node: str = "stand-in") -> int:
    if node == "real":
        return up_real_node(event_ttl, knative)
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


def up_real_node(event_ttl: str, knative: bool) -> int:
    """`make cluster NODE=real`: the control plane with kube-scheduler, and a real node (containerd, kubelet,
    kube-proxy) with KubeVirt installed on it by virt-operator (controlplane/node_up.py keeps them): no node stand-in
    and no virt-controller of the host's. docs/control-plane.md, "The real node"."""
    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    state = _read_state()
    if state and all(_alive(pid) for pid in state["pids"].values()):
        print(f"already running: KUBECONFIG={state['kubeconfig']}")
        return 0
    _stop(state)
    workdir = _state_dir() / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    started = time.monotonic()
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    plane = ControlPlane(event_ttl=event_ttl, workdir=workdir, node=True)
    plane.start(say=say)
    state = {**plane.state(), "kubevirt_version": build.KUBEVIRT_NODE_VERSION.lstrip("v"), "node": "real"}
    try:
        _state_file().write_text(json.dumps(state, indent=2))
        log = open(workdir / "real-node.log", "wb")  # noqa: SIM115 - the child keeps it
        node = subprocess.Popen([sys.executable, "-m", "controlplane.node_up", str(_state_file())], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=build.REPO)
        state["pids"]["real node"] = node.pid
        _state_file().write_text(json.dumps(state, indent=2))
        deadline = time.monotonic() + 1800   # a cold machine builds KubeVirt's images first
        while not (workdir / "realnode.ready").exists():
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the real node did not start; see {workdir / 'real-node.log'}:\n"
                                   f"{(workdir / 'real-node.log').read_text(errors='replace')[-3000:]}")
            time.sleep(1)
        state["node_init_pid"] = json.loads((workdir / "realnode.ready").read_text())["init_pid"]
        _state_file().write_text(json.dumps(state, indent=2))
        cluster = RealCluster(plane, state["kubevirt_version"], fault_proxy=False, real_node=True).start()
        cluster.stop()
    except BaseException:
        _stop(state)
        plane.remove()
        raise
    plane.processes.clear()  # they keep running after this process exits: `down` stops them
    if knative:
        state["pids"]["knative"] = _start_knative(workdir)
        _state_file().write_text(json.dumps(state, indent=2))
    print(f"control plane with a real node ready in {time.monotonic() - started:.1f}s (Kubernetes "
          f"{build.KUBE.version}: kube-scheduler, kubelet and kube-proxy on containerd; KubeVirt "
          f"{build.KUBEVIRT_NODE_VERSION} by virt-operator, useEmulation; deploy/ applied"
          f"{', Knative ' + build.KNATIVE.version if knative else ''})", file=sys.stderr)
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
    for name in ("knative", "controlplane node", "real node", "virt-controller", "kube-scheduler",
                 "kube-controller-manager", "kube-apiserver", "etcd"):
        pid = state["pids"].get(name)
        if pid and _alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + (60 if name == "real node" else 15)
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


def _real_node_state() -> dict | None:
    state = _read_state()
    return state if state and state.get("node") == "real" else None


def guest(action: str, target: str) -> int:
    """The guest of a running VMI powers off or crashes. On the real node: `poweroff` is typed at the guest's shell
    through its serial console (virt-api's console subresource), and a crash is QEMU killed (KubeVirt 1.3 gives the
    guest no panic device: controlplane/guest/rc). On the stand-in: as virt-handler reports it (one write)."""
    from simcluster.kubevirt.sim import KubeVirtSim

    namespace, _, name = target.rpartition("/")
    real = _real_node_state()
    if real is not None:
        from controlplane import node as realnode
        from controlplane.console import run
        from controlplane.node_up import attach_node

        if action == "poweroff":
            run(attach_node(real), namespace or "default", name, "poweroff", expect="poweroff")
        else:
            realnode.kill_guest(int(real["node_init_pid"]), namespace or "default", name)
        print(f"the guest of VMI {namespace or 'default'}/{name}: {action}")
        return 0
    kubevirt = KubeVirtSim(_running_cluster(), node_only=True)  # not started: the action runs here, once
    (kubevirt.guest_power_off if action == "poweroff" else kubevirt.guest_crash)(namespace or "default", name)
    print(f"the guest of VMI {namespace or 'default'}/{name}: {action}")
    return 0


def start(target: str, action: str = "start") -> int:
    """`virtctl start` (or stop, restart). On the real node, virt-api's own subresource; elsewhere no virt-api runs,
    and a start is the same patch of the VM's spec or status that the simulator's subresource computes
    (simcluster.apiserver._start_patch), as the admin."""
    from kubernetes import client

    from simcluster.apiserver import _start_patch
    from simcluster.store import ApiError

    namespace, _, name = target.rpartition("/")
    namespace = namespace or "default"
    if _real_node_state() is not None:
        from controlplane.cluster import RealCluster, RealClusterError
        from controlplane.node_up import attach_node

        cluster = RealCluster(attach_node(_real_node_state() or {}), real_node=True, fault_proxy=False).connect()
        try:
            cluster.vm_subresource(namespace, name, action)
        except RealClusterError as exc:  # virt-api's refusal, in its words
            print(f"controlplane: VM {namespace}/{name}: {exc}", file=sys.stderr)
            return 1
        finally:
            cluster.stop()
        print(f"VM {namespace}/{name}: {action} requested (virt-api)")
        return 0
    if action != "start":
        print("controlplane: only `start` is stood in for without a real node (NODE=real)", file=sys.stderr)
        return 1
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


def kubelet(action: str) -> int:
    """`kubelet stop|start` on the real node: its kubelet stops (the node goes NotReady once the node lifecycle
    controller's grace period passes) or starts again. The node's process does it (SIGUSR1, SIGUSR2)."""
    state = _real_node_state()
    if state is None:
        print("controlplane: no real node is running (make cluster NODE=real starts one)", file=sys.stderr)
        return 1
    os.kill(state["pids"]["real node"], signal.SIGUSR1 if action == "stop" else signal.SIGUSR2)
    print(f"kubelet of the real node: {action} requested")
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
    parser.add_argument("command", choices=("up", "down", "status", "build", "prepare", "node", "guest", "start",
                                            "stop", "restart", "kubelet"))
    parser.add_argument("args", nargs="*", help="guest: poweroff|crash NAMESPACE/NAME; start|stop|restart: "
                                                "NAMESPACE/NAME (stop, restart: real node only); kubelet: stop|start")
    parser.add_argument("--event-ttl", default=os.environ.get("EVENT_TTL", "1h"),
                        help="kube-apiserver --event-ttl (default 1h, as Kubernetes)")
    parser.add_argument("--kubevirt", default=os.environ.get("KUBEVIRT_VERSION", "1.3.1"),
                        help="the KubeVirt version whose CRDs and virt-controller run (default 1.3.1)")
    parser.add_argument("--no-knative", action="store_true", default=os.environ.get("KNATIVE") == "0",
                        help="skip Knative (its broker, channel, sources and webhooks; KNATIVE=0 does the same)")
    parser.add_argument("--node", choices=("stand-in", "real"), default=os.environ.get("NODE") or "stand-in",
                        help="`real`: a real node (containerd, kubelet, kube-scheduler, kube-proxy) and KubeVirt "
                             f"{build.KUBEVIRT_NODE_VERSION} installed on it by virt-operator, instead of the node "
                             "stand-in (NODE=real does the same)")
    args = parser.parse_args(argv)
    _state_dir().mkdir(parents=True, exist_ok=True)
    try:
        if args.command == "build":
            return build.main()
        if args.command == "prepare":
            return prepare()
        if args.command == "up":
            return up(args.event_ttl, args.kubevirt, knative=not args.no_knative, node=args.node)
        if args.command == "down":
            return down()
        if args.command == "node":
            return node()
        if args.command == "guest":
            if len(args.args) != 2 or args.args[0] not in ("poweroff", "crash"):
                parser.error("guest needs: poweroff|crash NAMESPACE/NAME")
            return guest(*args.args)
        if args.command in ("start", "stop", "restart"):
            if len(args.args) != 1:
                parser.error(f"{args.command} needs: NAMESPACE/NAME")
            return start(args.args[0], args.command)
        if args.command == "kubelet":
            if args.args not in (["stop"], ["start"]):
                parser.error("kubelet needs: stop|start")
            return kubelet(args.args[0])
        return status()
    except (build.BuildError, RuntimeError) as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""A real Kubernetes node beside the real control plane: containerd and the CNI plugins (Debian's packages), and
the kubelet and kube-proxy built from the kube wrapper module, each as upstream ships it.

The node lives in network, mount and PID namespaces of its own, made by its first process (controlplane/node_init.py,
PID 1 there, under `unshare`), which the node's processes join (`nsenter`). When it ends, the kernel ends every process
of the node, containers included:

- **network**: the node's address (`pki.NODE_IP`) on the namespace's loopback, the CNI bridge and the pods behind it,
  kube-proxy's rules. Nothing of it is reachable from the host's namespace, and nothing in it reaches out: the
  namespace has no route to any other. Two forwarders join the two sides, both in this process: one listens inside
  the node on 127.0.0.1 and on the node's address at kube-apiserver's port and carries each connection to
  kube-apiserver on the host's loopback (the kubelet's and kube-proxy's connections, and, through the `kubernetes`
  Service whose endpoint kube-apiserver advertises as that address, every pod's); the other is kube-apiserver's
  egress proxy (`EgressProxy`: HTTP CONNECT on a unix socket, as konnectivity's server takes it, each tunnel dialled
  inside the node), by which kube-apiserver reaches the kubelet, webhooks and aggregated APIs (virt-api).
- **mount**: `/` made rshared (the host's is private; virt-handler mounts with Bidirectional propagation), and the
  node's state folders (/var/lib/kubelet, /var/lib/containerd, /run/containerd, /etc/cni/net.d, KubeVirt's
  /var/run/kubevirt…) bind-mounted from this node's own folder, so every component finds its usual paths and
  nothing of the host's is written.

The pods' cgroups go under a cgroup of this node's own (`cgroupRoot`), removed when it stops. docs/control-plane.md,
"The real node", gives each setting and why.
"""
from __future__ import annotations

import ipaddress
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from controlplane import build, pki
from controlplane.pods import Proxy, socket_in

NODE_NAME = "node1"
POD_SUBNET = "10.244.0.0/24"       # the CNI bridge's host-local range
CLUSTER_CIDR = "10.244.0.0/16"
CLUSTER_DNS = "10.0.0.10"          # no DNS server answers there: pods get a resolv.conf, as on a cluster, and nothing
                                   # KubeVirt runs resolves a name (kubelet's MissingClusterDNS Event is not written)
CNI_BIN = "/usr/lib/cni"           # Debian's containernetworking-plugins
# The node's folders at their usual paths, each bind-mounted from <workdir>/fs/<path> inside the node's mount namespace.
DISKS = "/var/lib/vmevents-disks"   # the node's hostPath PersistentVolumes (the VMs' disks): host_path()
NODE_PATHS = ("var/lib/kubelet", "var/lib/containerd", "run/containerd", "etc/cni/net.d", "var/lib/cni",
              "var/log/pods", "var/log/containers", "run/netns", "run/kubevirt", "run/kubevirt-private",
              "run/kubevirt-libvirt-runtimes", "var/lib/kubevirt", "var/lib/kubevirt-node-labeller",
              DISKS.lstrip("/"))
CGROUP_ROOT = "/sys/fs/cgroup"

def host_path(workdir: Path, node_path: str, name: str = NODE_NAME) -> Path:
    """Where a path of the node's own folders (NODE_PATHS) is on the host, for the control plane in `workdir`."""
    return Path(workdir) / f"node-{name}" / "fs" / node_path.lstrip("/")


class NodeError(RuntimeError):
    """The node did not start: the message says which part and where its log is."""


def _containerd_config(sandbox_image: str) -> str:
    # containerd 1.6's CRI plugin. restrict_oom_score_adj: runc's lowering of the sandbox's oom_score_adj is refused
    # on these machines ("can't get final child's PID from pipe: EOF"); with it, containerd keeps every container's
    # at or above its own (docs/control-plane.md, "The real node").
    return f'''version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "/etc/cni/net.d"
'''


CNI_CONFIG = {
    "cniVersion": "1.0.0", "name": "vmevents",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


def kubelet_config(cgroup_root: str, ca_cert: Path) -> dict:
    """The kubelet's KubeletConfiguration; each line that is not the default says why."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": pki.NODE_IP, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "authentication": {"x509": {"clientCAFile": str(ca_cert)}, "webhook": {"enabled": True},
                           "anonymous": {"enabled": False}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",                  # PID 1 is not systemd here
        "cgroupRoot": cgroup_root,                   # this node's own cgroup, removed when it stops
        "failSwapOn": False,
        "clusterDNS": [CLUSTER_DNS], "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "rotateCertificates": False, "serverTLSBootstrap": False,
        "serializeImagePulls": False,
        # Eviction only when the machine is really short: a loaded CI machine's free disk is not the story told.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 98, "imageGCLowThresholdPercent": 95,
        "staticPodPath": "",
        "maxPods": 110,
    }


class EgressProxy:
    """kube-apiserver's egress proxy for the `cluster` selection: HTTP CONNECT on a unix socket (konnectivity's
    server takes the same), each tunnel dialled inside the node's network namespace. So kube-apiserver, on the host's
    loopback, reaches the kubelet, webhooks and aggregated API servers at their cluster addresses without the host
    having a route to any of them."""

    def __init__(self, path: Path, netns: int):
        self.path, self.netns = path, netns
        path.unlink(missing_ok=True)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        path.chmod(0o600)
        self._server.listen(64)
        self._stopped = False
        self.tunnels = 0
        self._thread = threading.Thread(target=self._serve, name="egress proxy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            conn.settimeout(10)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            request, _, rest = head.partition(b"\r\n\r\n")
            method, target, _ = (request.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""])[:3]
            host, _, port = target.rpartition(":")
            try:  # an address only: a name would be resolved by the host's resolver, outside the node
                address = str(ipaddress.ip_address(host.strip("[]")))
            except ValueError:
                address = ""
            if method != "CONNECT" or not address or not port.isdigit():
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\nan address:port only\n")
                return
            upstream = socket_in(self.netns)
            upstream.settimeout(10)
            try:
                upstream.connect((address, int(port)))
            except OSError as exc:
                conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}".encode())
                return
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.tunnels += 1
            if rest:
                upstream.sendall(rest)
            conn.settimeout(None)
            upstream.settimeout(None)
            _splice(conn, upstream)
        except OSError:
            pass
        finally:
            conn.close()
            if upstream is not None:
                upstream.close()

    def stop(self) -> None:
        self._stopped = True
        self._server.close()
        self.path.unlink(missing_ok=True)


def _splice(a: socket.socket, b: socket.socket) -> None:
    pair = selectors.DefaultSelector()
    pair.register(a, selectors.EVENT_READ, b)
    pair.register(b, selectors.EVENT_READ, a)
    open_ends = 2
    try:
        while open_ends:
            for key, _ in pair.select():
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if data:
                    key.data.sendall(data)
                    continue
                open_ends -= 1
                pair.unregister(key.fileobj)
                try:
                    key.data.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        pair.close()
        a.close()
        b.close()


class RealNode:
    """One node: the holder of its namespaces, containerd, the kubelet and kube-proxy, and the two forwarders."""

    def __init__(self, plane: Any, name: str = NODE_NAME, images: tuple[Path, ...] = ()):
        """plane: a started controlplane.server.ControlPlane(node=True). images: OCI archives imported into
        containerd before the kubelet starts (the pause image always: controlplane/images.py)."""
        if not getattr(plane, "node", False):
            raise NodeError("the control plane was not started for a node (ControlPlane(node=True))")
        self.plane, self.name = plane, name
        self.workdir = Path(plane.workdir) / f"node-{name}"
        self.images = images
        self.cgroup = f"/vmevents-{name}-{uuid.uuid4().hex[:8]}"
        self.holder: subprocess.Popen | None = None   # `unshare`, whose child is the node's PID 1
        self.init_pid: int | None = None               # that PID 1, as the host numbers it
        self.processes: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list[str]] = {}
        self.netns: int | None = None
        self.pidns: int | None = None
        self.proxy: Proxy | None = None
        self.egress: EgressProxy | None = None
        self.started_after = 0.0

    # -- life --------------------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0, say=lambda text: None) -> RealNode:
        from controlplane import images

        started = time.monotonic()
        binaries = build.ensure(build.KUBE_NODE, say)
        for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "ip"):
            if not shutil.which(tool):
                raise NodeError(f"the real node needs `{tool}` (apt-get install containerd containernetworking-plugins "
                                "runc iptables util-linux iproute2; .ci/run installs them)")
        if not Path(CNI_BIN, "bridge").is_file():
            raise NodeError(f"no CNI plugins in {CNI_BIN} (apt-get install containernetworking-plugins)")
        pause = images.pause(say)
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_holder()
            self._make_cgroups()
            self._write_configs(pause.name)
            self._forward()
            self._spawn("containerd", ["containerd", "--config", str(self.workdir / "containerd.toml")])
            self._wait_socket(time.monotonic() + 30)
            for archive in (pause.archive, *self.images):
                self.import_image(archive)
            self._start_kubelet(binaries / "kubelet")
            self._start_kube_proxy(binaries / "kube-proxy")
            self.wait_ready(time.monotonic() + timeout)
            self._label_roles()
        except BaseException:
            self.stop()
            raise
        self.started_after = time.monotonic() - started
        return self

    def _start_holder(self) -> None:
        """`unshare`, whose child is the node's PID 1. It dies with this process, whoever started the control plane
        (PR_SET_PDEATHSIG: a node outlives nobody who could stop it), and its child with it (--kill-child); unshare
        ignores SIGTERM while it waits, so it is stopped with SIGKILL."""
        ready = self.workdir / "init.ready"
        ready.unlink(missing_ok=True)
        log = open(self.workdir / "init.log", "ab")  # noqa: SIM115 - the process keeps it
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
             "--propagation", "private", "--", sys.executable, str(Path(__file__).with_name("node_init.py")),
             str(self.workdir), str(ready), pki.NODE_IP, *NODE_PATHS],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + 15
        while not ready.exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"the node's namespaces were not made; see {self.workdir / 'init.log'}:\n"
                                f"{(self.workdir / 'init.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text().split()
        self.init_pid = int(children[0])
        self.netns = os.open(f"/proc/{self.init_pid}/ns/net", os.O_RDONLY)
        self.pidns = os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino

    def _preexec(self) -> None:
        if getattr(self.plane, "die_with_parent", False):
            _die_with_parent()

    def _make_cgroups(self) -> None:
        """The node's cgroup in every mounted v1 hierarchy (the kubelet requires its cgroupRoot to exist); cpuset's
        needs its cpus and mems before any task can join a child."""
        for hierarchy in Path(CGROUP_ROOT).iterdir():
            if not (hierarchy / "cgroup.procs").exists() or hierarchy.name == "unified":
                continue
            path = hierarchy / self.cgroup.lstrip("/")
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((hierarchy / name).read_text())

    def _write_configs(self, sandbox_image: str) -> None:
        p = self.plane.pki
        (self.workdir / "containerd.toml").write_text(_containerd_config(sandbox_image))
        cni = self.workdir / "fs" / "etc/cni/net.d"
        (cni / "10-vmevents.conflist").write_text(json.dumps(CNI_CONFIG, indent=2))
        server = f"https://127.0.0.1:{self.plane.port}"   # the forwarder inside the node
        cert, key = pki.client(p, f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes")
        self.kubelet_kubeconfig = self._kubeconfig("kubelet", server, cert, key)
        cert, key = pki.client(p, "kube-proxy", "system:kube-proxy")
        self.proxy_kubeconfig = self._kubeconfig("kube-proxy", server, cert, key)
        (self.workdir / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(self.cgroup, p.ca_cert)))
        (self.workdir / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.proxy_kubeconfig)},
            "hostnameOverride": self.name, "mode": "iptables", "clusterCIDR": CLUSTER_CIDR,
            "bindAddress": pki.NODE_IP, "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249", "nodePortAddresses": ["primary"],
            # 0: leave the conntrack table's size alone (it is the whole machine's, not this namespace's)
            "conntrack": {"maxPerCore": 0, "min": 0},
        }))

    def _kubeconfig(self, user: str, server: str, cert: Path, key: Path) -> Path:
        path = self.workdir / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "vmevents", "cluster": {"server": server,
                                                         "certificate-authority": str(self.plane.pki.ca_cert)}}],
            "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "vmevents", "user": user}}]}))
        path.chmod(0o600)
        return path

    def _forward(self) -> None:
        port = self.plane.port
        self.proxy = Proxy()
        for address in ("127.0.0.1", pki.NODE_IP):
            self.proxy.listen(self.netns, address, port, lambda: (None, "127.0.0.1", port))
        self.egress = EgressProxy(self.plane.egress_socket, self.netns)  # type: ignore[arg-type]

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """A process of the node: it joins the node's namespaces (nsenter forks it into the PID namespace; the two
        share a process group, which stop_process signals)."""
        assert self.init_pid is not None
        self.argv[name] = argv
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        process = subprocess.Popen(["nsenter", f"--target={self.init_pid}", "--mount", "--net", "--pid", "--", *argv],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True, preexec_fn=self._preexec)
        log.close()
        self.processes[name] = process
        return process

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "fs" / "run/containerd/containerd.sock"

    def _wait_socket(self, deadline: float) -> None:
        while not self.containerd_socket.exists():
            self._check_running("containerd")
            if time.monotonic() > deadline:
                raise NodeError(f"containerd did not open its socket; see {self.workdir / 'containerd.log'}")
            time.sleep(0.05)

    def _check_running(self, *names: str) -> None:
        for name in names:
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise NodeError(f"{name} exited with {process.returncode}; see {self.workdir / (name + '.log')}:\n"
                                f"{self.log_tail(name)}")

    def import_image(self, archive: Path) -> None:
        """An OCI archive into containerd's k8s.io namespace (the CRI's), unpacked for the overlayfs snapshotter."""
        done = subprocess.run(["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", "images",
                               "import", "--no-unpack=false", str(archive)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise NodeError(f"importing {archive.name} into containerd failed: {done.stderr.strip()}")

    def _start_kubelet(self, binary: Path) -> None:
        self._spawn("kubelet", [str(binary), f"--config={self.workdir / 'kubelet.yaml'}",
                                f"--kubeconfig={self.kubelet_kubeconfig}", f"--hostname-override={self.name}",
                                f"--node-ip={pki.NODE_IP}", f"--cert-dir={self.workdir / 'kubelet-pki'}", "--v=1"])

    def _start_kube_proxy(self, binary: Path) -> None:
        self._spawn("kube-proxy", [str(binary), f"--config={self.workdir / 'kube-proxy.yaml'}", "--v=1"])

    def wait_ready(self, deadline: float) -> None:
        """Until the API says the node is Ready (the kubelet's status) and carries no not-ready taint (the node
        lifecycle controller has lifted it)."""
        last = "not registered"
        while time.monotonic() < deadline:
            self._check_running("containerd", "kubelet", "kube-proxy")
            node = self.node_object()
            if node is not None:
                ready = {c["type"]: c for c in node.get("status", {}).get("conditions") or []}.get("Ready", {})
                taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
                if ready.get("status") == "True" and "node.kubernetes.io/not-ready" not in taints:
                    return
                last = f"Ready={ready.get('status')} ({ready.get('message')}), taints {taints}"
            time.sleep(0.2)
        raise NodeError(f"node {self.name} was not Ready in time ({last}); see {self.workdir / 'kubelet.log'}:\n"
                        f"{self.log_tail('kubelet')}")

    # A Harvester node is an RKE2 server: these roles are on every node of a small cluster, and KubeVirt's operator
    # runs its install-strategy Job only on a control-plane node (pkg/virt-operator/strategy_job.go). A kubelet may not
    # set node-role labels on itself (NodeRestriction), so the admin does, as RKE2's and kubeadm's installers do.
    ROLES = ("control-plane", "etcd", "master")

    def _label_roles(self) -> None:
        self._admin_request("PATCH", f"/api/v1/nodes/{self.name}", {"metadata": {"labels": {
            f"node-role.kubernetes.io/{role}": "true" for role in self.ROLES}}})

    def _admin_request(self, method: str, path: str, body: Any = None) -> dict | None:
        import ssl
        import urllib.error
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.plane.pki.ca_cert))
        context.load_cert_chain(str(self.plane.pki.admin_cert), str(self.plane.pki.admin_key))
        request = urllib.request.Request(
            f"{self.plane.url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def node_object(self) -> dict | None:
        return self._admin_request("GET", f"/api/v1/nodes/{self.name}")

    # -- faults: the kubelet stopped and started again ------------------------------------------------

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        process = self.processes[name]
        for signal_number, wait in ((sig, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, signal_number)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def start_process(self, name: str) -> None:
        if self.processes[name].poll() is None:
            raise NodeError(f"{name} is still running")
        self._spawn(name, self.argv[name])

    def log_tail(self, name: str, size: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of the node's own processes and, as `pods`, of every other process in its PID namespace
        (containerd's shims and the containers: virt-handler, virt-launcher, QEMU…), in MiB."""
        own = {child: name for name, p in self.processes.items() if p.poll() is None
               for child in _children(p.pid)}
        out: dict[str, float] = {name: 0.0 for name in own.values()}
        out["pods"] = 0.0
        for pid in self._members():
            rss = _rss(pid)
            out[own.get(pid, "pods")] = out.get(own.get(pid, "pods"), 0.0) + rss
        return out

    def _members(self) -> list[int]:
        """Every process in the node's PID namespace but its PID 1."""
        found: list[int] = []
        if self.pidns is None:
            return found
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.init_pid:
                continue
            try:
                if os.stat(entry / "ns" / "pid").st_ino == self.pidns:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self) -> None:
        """Stop the kubelet and kube-proxy, then containerd, then the node's PID 1, with which the kernel ends every
        process left in the namespace (containerd's shims, the containers); remove the cgroups."""
        for name in ("kubelet", "kube-proxy", "containerd"):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                self.stop_process(name, timeout=15)
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()   # unshare --kill-child: its child, the namespace's PID 1, gets SIGKILL
            self.holder.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self._members() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.egress is not None:
            self.egress.stop()
            self.egress = None
        if self.netns is not None:
            os.close(self.netns)
            self.netns = None
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        for hierarchy in Path(CGROUP_ROOT).iterdir():
            top = hierarchy / self.cgroup.lstrip("/")
            if not top.is_dir():
                continue
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    path.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass


def _die_with_parent() -> None:
    from controlplane.server import _die_with_parent as die

    die()


def kill_guest(init_pid: int, namespace: str, name: str) -> int:
    """SIGKILL the QEMU of VMI namespace/name on the node whose PID 1 is `init_pid` (KubeVirt names the domain
    `<namespace>_<name>`): libvirt then reports the domain shut off, crashed. The pid killed."""
    domain = f"guest={namespace}_{name}".encode()
    for pid, argv in _node_processes(init_pid):
        if argv[0].endswith(b"qemu-system-x86_64") and any(a.startswith(domain) for a in argv):
            os.kill(pid, signal.SIGKILL)
            return pid
    raise NodeError(f"no QEMU of VMI {namespace}/{name} runs on the node")


NS_GET_PARENT = 0xB702   # ioctl on a namespace file: its parent's (linux/nsfs.h, _IO(0xb7, 0x2))


def _node_processes(init_pid: int):
    """(pid, argv) of every process of the node: in its PID namespace or one nested in it (each container has its
    own)."""
    import fcntl

    node = os.stat(f"/proc/{init_pid}/ns/pid").st_ino
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fd = os.open(entry / "ns" / "pid", os.O_RDONLY)
        except OSError:
            continue
        inside = False
        try:
            while not inside:
                inside = os.fstat(fd).st_ino == node
                try:
                    parent = fcntl.ioctl(fd, NS_GET_PARENT)
                except OSError:   # the machine's own namespace, or one this process may not see above
                    break
                os.close(fd)
                fd = parent
        finally:
            os.close(fd)
        if inside and argv and argv[0]:
            yield int(entry.name), argv


def launcher_children(init_pid: int, vmi_uid: str) -> list[tuple[str, str]] | None:
    """The children of the compute container's first process (virt-launcher-monitor, PID 1 of its container) of the
    VMI with this uid on the node whose PID 1 is `init_pid`, as (name, state letter) pairs: `("virt-launcher", "Z")` is
    a virt-launcher that has exited and that the monitor never reaped (docs/facts.md §9). None: no such monitor runs.
    A Go process's children hang off the thread that forked them (or, once reparented, its leader), so every thread's
    list is read."""
    wanted = vmi_uid.encode()
    for pid, argv in _node_processes(init_pid):
        if not (argv[0].endswith(b"virt-launcher-monitor") and wanted in argv):
            continue
        children: list[tuple[str, str]] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                pids = (task / "children").read_text().split()
            except OSError:
                continue
            for pid in pids:
                fields = _status(int(pid))
                if fields:
                    children.append((fields.get("Name", "?"), fields.get("State", "?")[:1]))
        return children
    return None


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _children(pid: int) -> list[int]:
    """A process and its children (nsenter's one child is the component)."""
    try:
        return [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    except OSError:
        return [pid]


def _rss(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0

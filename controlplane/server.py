"""Starts and stops one real control plane on loopback: etcd, kube-apiserver and kube-controller-manager.

The flags follow controller-runtime's envtest (pkg/internal/testing/controlplane/apiserver.go) plus what
vmevents needs to be tested for real: TLS, `Node,RBAC` authorization, the TokenRequest API (a fresh
service-account key pair per run), ValidatingAdmissionPolicy, NamespaceLifecycle and ResourceQuota admission, a settable
`--event-ttl`, and an audit log at Metadata level, from which the tests learn which requests each
ServiceAccount made. kube-controller-manager runs only the controllers a namespace-per-test suite needs:
namespace deletion, garbage collection of owned objects, the `default` ServiceAccount in each namespace,
the root CA ConfigMap and ResourceQuota usage (see docs/control-plane.md).
"""
from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from controlplane import build, pki
from localknative.serving import free_port

# What kube-controller-manager runs, and why each (the rest, e.g. node or deployment controllers, have
# nothing to act on here: no kubelet, no Deployments).
CONTROLLERS = (
    "namespace-controller",                     # a deleted namespace is emptied and goes away
    "garbage-collector-controller",             # ownerReferences: a VM's VMI goes when the VM goes
    "serviceaccount-controller",                # the `default` ServiceAccount of every namespace
    "serviceaccount-token-controller",          # legacy token Secrets, as a real cluster has them
    "root-ca-certificate-publisher-controller",  # kube-root-ca.crt in every namespace
    "clusterrole-aggregation-controller",       # admin/edit/view get their aggregated rules
    "resourcequota-controller",                 # a ResourceQuota's status.used: without it, admission refuses
                                                # every pod a quota covers ("status unknown for quota")
    "disruption-controller",                    # a PodDisruptionBudget's status: KubeVirt's migration controller
                                                # creates a target pod only once the PDB it expanded is seen
                                                # protecting two pods (migration.go isMigrationProtected)
)
# With a real node (ControlPlane(node=True), controlplane/node.py) the controllers a node's objects need, besides:
NODE_CONTROLLERS = (
    "node-lifecycle-controller",       # the not-ready taint off a Ready node; NotReady (and the unreachable taints)
                                       # when its kubelet stops posting status
    "taint-eviction-controller",       # pods on a NotReady node are evicted once their tolerations run out
    "endpointslice-controller",        # kube-proxy programs Services from EndpointSlices (virt-api's, the API's)
    "endpoints-controller",
    "replicaset-controller",           # virt-operator's Deployments (virt-api, virt-controller) and their pods
    "deployment-controller",
    "daemonset-controller",            # virt-handler
    "job-controller",                  # virt-operator's install-strategy dump Job
    "pod-garbage-collector-controller",     # a deleted node's pods; terminated pods past the threshold
    "persistentvolume-binder-controller",   # a PVC binds to its PV, or stays Pending with the binder's Event
    "persistentvolumeclaim-protection-controller",  # a deleted PVC goes once no pod uses it
    "persistentvolume-protection-controller",
    "ttl-after-finished-controller",   # a finished Job with a TTL goes
    "disruption-controller",           # virt-operator's PodDisruptionBudgets
)
ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "omitStages": ["RequestReceived", "ResponseStarted"],
                "rules": [{"level": "None", "userGroups": ["system:nodes"]},
                          {"level": "Metadata"}]}


class ControlPlaneError(RuntimeError):
    """The control plane did not start: the message names the component and where its log is."""


@dataclass
class ControlPlane:
    """One etcd + kube-apiserver + kube-controller-manager, all on 127.0.0.1, in a fresh temporary folder."""

    event_ttl: str = "1h"
    workdir: Path | None = None
    controller_manager: bool = True
    # Tests: the processes get SIGKILL when the process that started them dies (a killed CI run leaves none).
    die_with_parent: bool = False
    # A real node joins (controlplane/node.py): kube-scheduler runs; kube-apiserver allows privileged pods, reaches
    # the node's network (kubelet, webhooks, aggregated APIs) through the egress proxy on a unix socket, advertises
    # the node-side address its forwarder listens on, and proxies aggregated APIs with a front-proxy certificate;
    # kube-controller-manager runs NODE_CONTROLLERS too.
    node: bool = False
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)  # how each process was started, to start it again

    def start(self, timeout: float = 120.0, say=lambda text: None) -> ControlPlane:
        binaries = {**{b: build.ensure(build.KUBE, say) / b for b in build.KUBE.binaries},
                    "etcd": build.ensure(build.ETCD, say) / "etcd"}
        if self.node:
            binaries["kube-scheduler"] = build.ensure(build.KUBE_NODE, say) / "kube-scheduler"
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="vmevents-controlplane-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = pki.make(self.workdir / "pki")
        if self.node:
            self.front_proxy = pki.front_proxy(self.workdir / "pki")
            self.egress_socket = self.workdir / "egress.sock"  # controlplane/node.py listens here
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.audit_log = self.workdir / "audit.log"
        self.admin_kubeconfig = self._write_admin_kubeconfig()
        started = time.monotonic()
        try:
            etcd_url = self._start_etcd(binaries["etcd"])
            self._start_apiserver(binaries["kube-apiserver"], etcd_url)
            self._wait_ready(started + timeout)
            if self.controller_manager:
                self._start_controller_manager(binaries["kube-controller-manager"])
            if self.node:
                self._start_scheduler(binaries["kube-scheduler"])
        except BaseException:
            self.stop()
            raise
        self.ready_after = time.monotonic() - started
        return self

    # -- the three processes -------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        self.argv[name] = argv
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env or _clean_env(), start_new_session=True,
                                   preexec_fn=_die_with_parent if self.die_with_parent else None)
        log.close()
        self.processes[name] = process
        return process

    def _start_etcd(self, binary: Path) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [str(binary), "--name=vmevents", f"--data-dir={self.workdir / 'etcd'}",
                             f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                             f"--listen-peer-urls=http://127.0.0.1:{peer}",
                             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                             f"--initial-cluster=vmevents=http://127.0.0.1:{peer}",
                             "--unsafe-no-fsync=true", "--log-level=warn", "--quota-backend-bytes=8589934592"])
        return url

    def _start_apiserver(self, binary: Path, etcd_url: str) -> None:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        p = self.pki
        self._spawn("kube-apiserver", [
            str(binary), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={p.server_cert}", f"--tls-private-key-file={p.server_key}",
            f"--client-ca-file={p.ca_cert}", "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
            f"--service-account-key-file={p.sa_public}", f"--service-account-signing-key-file={p.sa_private}",
            "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
            f"--event-ttl={self.event_ttl}",
            # With a node, NodeRestriction too: a kubelet writes only its own Node and its pods (as kubeadm has it).
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,ValidatingAdmissionPolicy,ResourceQuota"
            + (",NodeRestriction" if self.node else ""),
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
            "--audit-log-maxsize=1024", "--audit-log-mode=blocking",
            f"--cert-dir={self.workdir / 'certs'}", "--profiling=false", "--v=0",
            *self._node_apiserver_flags(),
        ])

    def _node_apiserver_flags(self) -> list[str]:
        """What kube-apiserver needs beside a real node (controlplane/node.py): docs/control-plane.md, "The real
        node"."""
        if not self.node:
            return []
        egress = self.workdir / "egress-selector.yaml"
        egress.write_text(yaml.safe_dump({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [{"name": "cluster", "connection": {
                "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(self.egress_socket)}}}}]}))
        kubelet_cert, kubelet_key = pki.client(self.pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                               "system:masters")
        front = self.front_proxy
        return [
            "--allow-privileged=true",             # virt-handler (and node-labeller) run privileged
            f"--egress-selector-config-file={egress}",
            f"--advertise-address={pki.NODE_IP}", "--endpoint-reconciler-type=lease",
            f"--kubelet-client-certificate={kubelet_cert}", f"--kubelet-client-key={kubelet_key}",
            # The node's address, not its name (no DNS here; kubeadm sets the same list with InternalIP first).
            "--kubelet-preferred-address-types=InternalIP",
            f"--requestheader-client-ca-file={front.ca_cert}", f"--requestheader-allowed-names={front.client_name}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front.client_cert}", f"--proxy-client-key-file={front.client_key}",
        ]

    def _start_scheduler(self, binary: Path) -> None:
        cert, key = pki.client(self.pki, "kube-scheduler", "system:kube-scheduler")
        kubeconfig = self.write_kubeconfig("kube-scheduler", {"client-certificate": str(cert), "client-key": str(key)})
        self._spawn("kube-scheduler", [
            str(binary), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", f"--cert-dir={self.workdir / 'scheduler-certs'}", "--profiling=false",
            "--v=0",
        ])

    def _start_controller_manager(self, binary: Path) -> None:
        p = self.pki
        self._spawn("kube-controller-manager", [
            str(binary), f"--kubeconfig={self.admin_kubeconfig}",
            f"--controllers={','.join(CONTROLLERS + (NODE_CONTROLLERS if self.node else ()))}",
            f"--service-account-private-key-file={p.sa_private}", f"--root-ca-file={p.ca_cert}",
            "--leader-elect=false", "--use-service-account-credentials=false", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--concurrent-gc-syncs=5", "--concurrent-namespace-syncs=5",
            f"--cert-dir={self.workdir / 'kcm-certs'}", "--profiling=false", "--v=0",
        ])

    def _wait_ready(self, deadline: float) -> None:
        context = self.ssl_context()
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {process.returncode} while starting; "
                                            f"see {self.workdir / (name + '.log')}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ControlPlaneError(f"kube-apiserver was not ready within the time allowed ({last}); "
                                f"see {self.workdir / 'kube-apiserver.log'}:\n{self.log_tail('kube-apiserver')}")

    # -- faults: a component stopped, killed and started again (tests/faults/) ------------------------

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 90.0) -> float:
        """Stop one component (SIGTERM: a clean shutdown, as an upgrade does; SIGKILL: a crash), SIGKILL it if it
        has not exited within `timeout`; the seconds it took to exit."""
        process, started = self.processes[name], time.monotonic()
        for signal_number, wait in ((sig, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, signal_number)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        return time.monotonic() - started

    def start_process(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped component again with the same flags (same ports, etcd's same data directory), and wait
        until kube-apiserver answers /readyz."""
        if self.processes[name].poll() is None:
            raise ControlPlaneError(f"{name} is still running")
        self._spawn(name, self.argv[name])
        self._wait_ready(time.monotonic() + timeout)

    def revive(self, timeout: float = 60.0) -> list[str]:
        """Start again, in dependency order, every component that has exited (a test that stopped etcd and failed
        before starting it, a crash); the names started. A session's tests share one plane: one left broken must
        not fail every test after it (the last CI run: 147 errors behind one etcd left stopped)."""
        started = [name for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
                   if name in self.processes and self.processes[name].poll() is not None]
        for name in started:
            self._spawn(name, self.argv[name])
        if started:
            self._wait_ready(time.monotonic() + timeout)
        return started

    def log_tail(self, name: str, size: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def stop(self) -> None:
        from controlplane import kubevirt

        kubevirt.stop_on(self)  # KubeVirt's virt-controller, when a RealCluster started one here
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=5)

    def remove(self) -> None:
        self.stop()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- access --------------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def _write_admin_kubeconfig(self) -> Path:
        return self.write_kubeconfig("admin", {"client-certificate": str(self.pki.admin_cert),
                                               "client-key": str(self.pki.admin_key)})

    def write_kubeconfig(self, user: str, credentials: dict, namespace: str = "default",
                         server: str | None = None) -> Path:
        """`server`: where the kubeconfig points instead of kube-apiserver (e.g. controlplane/faultproxy.py)."""
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "vmevents",
                  "clusters": [{"name": "vmevents", "cluster": {"server": server or self.url,
                                                               "certificate-authority": str(self.pki.ca_cert)}}],
                  "users": [{"name": user, "user": credentials}],
                  "contexts": [{"name": "vmevents", "context": {"cluster": "vmevents", "user": user,
                                                               "namespace": namespace}}]}
        path = self.workdir / "kubeconfigs" / f"{user.replace('/', '-').replace(':', '-')}.yaml"
        path.parent.mkdir(exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(yaml.safe_dump(config))
        partial.chmod(0o600)
        partial.replace(path)
        return path

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each process (from /proc), in MiB."""
        out = {}
        for name, process in self.processes.items():
            try:
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) / 1024
            except OSError:
                pass
        return out

    def cpu_seconds(self, name: str = "kube-apiserver") -> float:
        """User + system CPU time the process has used so far (from /proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.processes[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def state(self) -> dict:
        return {"url": self.url, "workdir": str(self.workdir), "kubeconfig": str(self.admin_kubeconfig),
                "pids": {n: p.pid for n, p in self.processes.items()}, "event_ttl": self.event_ttl, "node": self.node}


def _die_with_parent() -> None:
    """In the child, before exec: prctl(PR_SET_PDEATHSIG, SIGKILL), so it dies with its parent."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _clean_env() -> dict[str, str]:
    # The components read no KUBECONFIG or proxy settings of the person running them.
    return {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "TMPDIR", "LANG", "TZ")} | {"NO_PROXY": "127.0.0.1,localhost"}

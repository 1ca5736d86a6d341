"""`make bench`: how cheaply vmi-cleanup answers the events it does not care about, next to a no-op.

The broker sends vmi-cleanup every VMI update in the cluster, and nearly all of them are a Running
VMI's status changing: those must cost about what answering at all costs, and no Kubernetes API
call. Machines are noisy, so nothing here is an absolute verdict: the two servers run side by side
in one run, alternately (A/B/A/B...), and the report gives medians and their ratio. It prints
PASS/MISS against the targets and exits 0 either way; it is a report, not a test.

    python -m bench.vmi_cleanup [--rounds 12] [--seconds 2] [--generator auto|wrk|python] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.load import Generator, Load, Result, choose
from functions.vmi_cleanup.declaration import CLEANUP_AFTER
from localknative.serving import stop_group

REPO = Path(__file__).resolve().parents[1]
SERVICE_ACCOUNT = "vmevents/vmi-cleanup"
SOURCE = "https://10.43.0.1:443"  # ApiServerSource's `source`: the API server URL it watches
TARGET_RATIO = 0.9                # vmi-cleanup ≥ 0.9 × the no-op's throughput on irrelevant events
TARGET_CALLS = 0                  # Kubernetes API calls per irrelevant event
_HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


@dataclass(frozen=True)
class Spec:
    name: str
    source: str  # relative to the repo root, as FUNCTION_SOURCE is in the manifests


VMI_CLEANUP = Spec("vmi-cleanup", "functions/vmi_cleanup/main.py")
NOOP = Spec("no-op", "bench/noop.py")


@dataclass(frozen=True)
class Config:
    rounds: int = 12
    load: Load = Load(seconds=2, connections=8, threads=1)
    warmup: Load = Load(seconds=1, connections=8, threads=1)
    relevant: Load = Load(seconds=3, connections=8, threads=1)
    startups: int = 3
    generator: str = "auto"


# -- the events ----------------------------------------------------------------------------------
def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_vm(name: str, namespace: str = "default") -> dict:
    """A Harvester-made VM with runStrategy Manual (KubeVirt never removes or restarts its VMI)."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"harvesterhci.io/creator": "harvester", "harvesterhci.io/os": "ubuntu"},
                         "annotations": {"harvesterhci.io/vmRunStrategy": "Manual"}},
            "spec": {"runStrategy": "Manual",
                     "template": {"metadata": {"labels": {"harvesterhci.io/vmName": name}},
                                  "spec": {"domain": {"devices": {}, "memory": {"guest": "1948Mi"},
                                                      "resources": {"requests": {"memory": "1365Mi"}}}}}}}


def make_vmi(name: str, namespace: str = "default", *, phase: str = "Running", vm: dict | None = None,
             now: datetime | None = None) -> dict:
    """A VMI as the API server returns it for a Harvester VM (seed: harvester-issue-auto-clean-vmi):
    spec, conditions, interfaces, guest OS, volumes and phase history; a few KB of JSON."""
    now = now or datetime.now(UTC)
    started = now - timedelta(hours=2)
    transitions = [{"phase": p, "phaseTransitionTimestamp": stamp(started + timedelta(seconds=s))}
                   for p, s in (("Pending", 0), ("Scheduling", 1), ("Scheduled", 9), ("Running", 12))]
    if phase in ("Succeeded", "Failed"):
        transitions.append({"phase": phase, "phaseTransitionTimestamp": stamp(now)})
    uid = str(uuid.uuid4())
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": uid, "resourceVersion": "3598009", "generation": 11,
        "creationTimestamp": stamp(started),
        "labels": {"harvesterhci.io/vmName": name, "kubevirt.io/nodeName": "harv41"},
        "annotations": {"harvesterhci.io/sshNames": "[]", "kubevirt.io/latest-observed-api-version": "v1",
                        "kubevirt.io/storage-observed-api-version": "v1",
                        "kubevirt.io/vm-generation": "2"},
        "finalizers": ["kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"]}
    if vm is not None:
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                    "name": vm["metadata"]["name"], "uid": vm["metadata"]["uid"],
                                    "controller": True, "blockOwnerDeletion": True}]
    disk_claim = f"{name}-disk-0-u0qfn"
    spec = {
        "architecture": "amd64",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "network.harvesterhci.io/mgmt", "operator": "In", "values": ["true"]}]}]}}},
        "domain": {
            "cpu": {"cores": 2, "sockets": 1, "threads": 1, "model": "host-model"},
            "devices": {
                "disks": [{"bootOrder": 1, "disk": {"bus": "virtio"}, "name": "disk-0"},
                          {"disk": {"bus": "virtio"}, "name": "cloudinitdisk"}],
                "inputs": [{"bus": "usb", "name": "tablet", "type": "tablet"}],
                "interfaces": [{"bridge": {}, "macAddress": "76:a3:07:37:03:4b", "model": "virtio",
                                "name": "default"}]},
            "features": {"acpi": {"enabled": True}},
            "firmware": {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, name))},
            "machine": {"type": "q35"},
            "memory": {"guest": "8092Mi"},
            "resources": {"limits": {"cpu": "2", "memory": "8Gi"}, "requests": {"cpu": "125m", "memory": "5461Mi"}}},
        "evictionStrategy": "LiveMigrate",
        "hostname": name,
        "networks": [{"multus": {"networkName": "default/my-dhcp"}, "name": "default"}],
        "terminationGracePeriodSeconds": 120,
        "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": disk_claim}},
                    {"cloudInitNoCloud": {"networkDataSecretRef": {"name": f"{name}-8vknj"},
                                          "secretRef": {"name": f"{name}-8vknj"}}, "name": "cloudinitdisk"}]}
    ready = "True" if phase == "Running" else "False"
    status = {
        "activePods": {str(uuid.uuid4()): "harv41"},
        "conditions": [
            {"lastProbeTime": None, "lastTransitionTime": stamp(started + timedelta(seconds=14)),
             "status": ready, "type": "Ready"},
            {"lastProbeTime": None, "lastTransitionTime": None, "status": "True", "type": "LiveMigratable"},
            {"lastProbeTime": stamp(started + timedelta(seconds=40)), "lastTransitionTime": None,
             "status": "True", "type": "AgentConnected"}],
        "currentCPUTopology": {"cores": 2, "sockets": 1, "threads": 1},
        "guestOSInfo": {"id": "ubuntu", "kernelRelease": "5.15.0-94-generic",
                        "kernelVersion": "#104-Ubuntu SMP Tue Jan 9 15:25:40 UTC 2024", "machine": "x86_64",
                        "name": "Ubuntu", "prettyName": "Ubuntu 22.04.3 LTS",
                        "version": "22.04.3 LTS (Jammy Jellyfish)",
                        "versionId": "22.04"},
        "interfaces": [{"infoSource": "domain, guest-agent, multus-status", "interfaceName": "enp1s0",
                        "ipAddress": "10.52.0.199", "ipAddresses": ["10.52.0.199", "fe80::74a3:7ff:fe37:34b"],
                        "mac": "76:a3:07:37:03:4b", "name": "default", "podInterfaceName": "pod7e0055a6880",
                        "queueCount": 1}],
        "launcherContainerImageVersion": "registry.suse.com/suse/sles/15.5/virt-launcher:1.1.0-150500.8.6.1",
        "machine": {"type": "pc-q35-7.1"},
        "memory": {"guestAtBoot": "8092Mi", "guestCurrent": "8092Mi", "guestRequested": "8092Mi"},
        "migrationMethod": "BlockMigration",
        "migrationTransport": "Unix",
        "nodeName": "harv41",
        "phase": phase,
        "phaseTransitionTimestamps": transitions,
        "qosClass": "Burstable",
        "runtimeUser": 107,
        "selinuxContext": "none",
        "virtualMachineRevisionName": f"revision-start-vm-{uuid.uuid4()}-2",
        "volumeStatus": [
            {"name": "cloudinitdisk", "size": 1048576, "target": "vdb"},
            {"name": "disk-0", "target": "vda", "persistentVolumeClaimInfo": {
                "accessModes": ["ReadWriteMany"], "capacity": {"storage": "10Gi"}, "claimName": disk_claim,
                "filesystemOverhead": "0.055", "requests": {"storage": "10Gi"}, "volumeMode": "Block"}}]}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": spec,
            "status": status}


def binary_event(obj: Mapping[str, Any], operation: str = "update") -> tuple[dict[str, str], bytes]:
    """The binary-mode CloudEvent ApiServerSource (Resource mode) sends for one watch event
    (knative/eventing pkg/adapter/apiserver/events/events.go, as localknative/sources.py builds it)."""
    meta = obj["metadata"]
    headers = {
        "Content-Type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-type": f"dev.knative.apiserver.resource.{operation}",
        "ce-source": SOURCE,
        "ce-subject": (f"/apis/{obj['apiVersion']}/namespaces/{meta['namespace']}"
                       f"/virtualmachineinstances/{meta['name']}"),
        "ce-kind": obj["kind"],
        "ce-apiversion": obj["apiVersion"],
        "ce-name": meta["name"],
        "ce-namespace": meta["namespace"],
    }
    return headers, json.dumps(obj, separators=(",", ":")).encode()


# -- the servers ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, headers: Mapping[str, str], body: bytes, timeout: float = 5.0) -> int:
    """One POST on a fresh connection; the status code."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/", body=body, headers=dict(headers))
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Server:
    """One functions-framework process (gunicorn master + worker) in its own process group."""

    def __init__(self, spec: Spec, kubeconfig: str, workdir: Path, env: Mapping[str, str] | None = None,
                 prefix: list[str] | None = None):
        self.spec = spec
        self.prefix = list(prefix or [])  # a command the server runs under (bench/irrelevant.py: in-cluster)
        self.kubeconfig = kubeconfig
        self.env = dict(env or {})  # the function's settings
        self.log_path = workdir / f"{spec.name}-{uuid.uuid4().hex[:6]}.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.spawned = 0.0

    def start(self) -> Server:
        self.port = _free_port()
        env = {k: os.environ[k] for k in _HOST_ENV if k in os.environ}
        env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", KUBECONFIG=self.kubeconfig, PORT=str(self.port),
                   K_SERVICE=self.spec.name)
        env.update(self.env)
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.spawned = time.perf_counter()
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "functions_framework", "--target", "handle",
                 "--source", self.spec.source, "--signature-type", "http", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        return self

    def first_answer(self, headers: Mapping[str, str], body: bytes, timeout: float = 30.0) -> float:
        """Seconds from spawn to the first 2xx answer to a POST of this event."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with code {self.proc.returncode} while starting:\n"
                                   + self.log_tail())
            try:
                status = post(self.port, headers, body)
            except OSError:
                time.sleep(0.005)
                continue
            if 200 <= status < 300:
                return time.perf_counter() - self.spawned
            raise RuntimeError(f"{self.spec.name} answered {status} to the benchmark event:\n{self.log_tail()}")
        raise RuntimeError(f"{self.spec.name} did not answer within {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def rss_kib(self) -> int:
        """VmRSS of the gunicorn master and every descendant (the worker), in KiB."""
        return sum(_vmrss(pid) for pid in _tree(self.proc.pid))

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the gunicorn master and its worker have used so far, every thread's."""
        return sum(_cpu_seconds(pid) for pid in _tree(self.proc.pid))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc)  # the whole group: master and worker


def _tree(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # the field after the parenthesised command name is the state, then the ppid
                ppid = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, ()))
    return found


def _cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        # after the parenthesised command name: state is field 3, utime and stime fields 14 and 15 (proc(5))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _vmrss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def decisions(log_path: Path) -> tuple[Counter, dict[str, float]]:
    """What the function logged: decisions counted, and the median in-handler duration_ms of each."""
    counts: Counter = Counter()
    durations: dict[str, list[float]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            counts[entry["verdict"]] += 1
            durations.setdefault(entry["verdict"], []).append(entry["duration_ms"])
    return counts, {k: statistics.median(v) for k, v in durations.items()}


# -- the cluster ---------------------------------------------------------------------------------
class Cluster:
    """The simulated API server (simcluster.apiserver.SimCluster): counts the function's requests."""

    def __init__(self):
        from simcluster.apiserver import SimCluster

        self.sim = SimCluster().start()

    def kubeconfig(self) -> str:
        return str(self.sim.kubeconfig(service_account=SERVICE_ACCOUNT))

    def calls(self) -> int:
        """HTTP requests served so far that the function made (its ServiceAccount's token)."""
        return sum(1 for r in list(self.sim.requests)
                   if getattr(r, "service_account", SERVICE_ACCOUNT) == SERVICE_ACCOUNT)

    def create(self, obj: dict) -> dict:
        return self.sim.create(copy.deepcopy(obj))

    def settle(self, log: Path, timeout: float = 5.0) -> None:
        """Wait until requests still in flight when the generator stopped have been answered and logged."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            now = (self.calls(), log.stat().st_size)
            if now == last:
                return
            last = now
            time.sleep(0.2)

    def stop(self) -> None:
        self.sim.stop()


# -- the measurements ----------------------------------------------------------------------------
@dataclass
class Run:
    """One load run against one server: what the generator saw."""
    server: str
    requests: int
    per_second: float
    p50_ms: float
    p99_ms: float
    failed: int

    @classmethod
    def of(cls, server: str, result: Result) -> Run:
        return cls(server, result.requests, round(result.per_second, 1), round(result.p50_ms, 3),
                   round(result.p99_ms, 3), result.failed)


@dataclass
class Report:
    generator: str
    settings: dict
    rounds: list[dict] = field(default_factory=list)      # every Run, in the order they ran
    throughput: dict = field(default_factory=dict)        # server -> medians over rounds
    ratio: float = 0.0                                    # vmi-cleanup ÷ no-op, medians
    paired_ratios: list[float] = field(default_factory=list)
    irrelevant: dict = field(default_factory=dict)        # API calls per event, logged decisions
    relevant: dict = field(default_factory=dict)          # Succeeded-not-due: calls/event, latency
    startup_s: dict = field(default_factory=dict)         # server -> median seconds spawn → first 2xx
    rss_mib: dict = field(default_factory=dict)           # server -> MiB after the load

    @property
    def throughput_verdict(self) -> str:
        return "PASS" if self.ratio >= TARGET_RATIO else "MISS"

    @property
    def calls_verdict(self) -> str:
        return "PASS" if self.irrelevant.get("api_calls_per_event") == TARGET_CALLS else "MISS"


def _medians(runs: list[Run]) -> dict:
    return {"events_per_s": round(statistics.median(r.per_second for r in runs), 1),
            "p50_ms": round(statistics.median(r.p50_ms for r in runs), 3),
            "p99_ms": round(statistics.median(r.p99_ms for r in runs), 3),
            "requests": sum(r.requests for r in runs), "failed": sum(r.failed for r in runs)}


def measure_startup(spec: Spec, kubeconfig: str, workdir: Path, event: tuple[dict, bytes]) -> float:
    server = Server(spec, kubeconfig, workdir).start()
    try:
        return server.first_answer(*event)
    finally:
        server.stop()


def run_bench(config: Config, workdir: Path, stack: contextlib.ExitStack,
              say: Callable[[str], None] = lambda _: None) -> Report:
    generator: Generator = choose(config.generator)
    report = Report(generator=generator.name, settings={
        "load": generator.describe(config.load), "rounds": config.rounds, "warmup_s": config.warmup.seconds,
        "relevant_s": config.relevant.seconds, "startups": config.startups, "cpus": os.cpu_count(),
        "event_bytes": 0})
    cluster = Cluster()
    stack.callback(cluster.stop)
    kubeconfig = cluster.kubeconfig()

    vm = cluster.create(make_vm("bench-running"))
    running = make_vmi("bench-running", vm=vm)
    cluster.create(running)
    irrelevant = binary_event(running)
    report.settings["event_bytes"] = len(irrelevant[1])

    # 4. start-up: spawn → first 2xx, alternating, median of `startups`
    say("start-up ...")
    startups: dict[str, list[float]] = {VMI_CLEANUP.name: [], NOOP.name: []}
    for _ in range(config.startups):
        for spec in (VMI_CLEANUP, NOOP):
            startups[spec.name].append(measure_startup(spec, kubeconfig, workdir, irrelevant))
    report.startup_s = {name: round(statistics.median(v), 3) for name, v in startups.items()}

    # 1 + 2. irrelevant events: A/B rounds on two long-lived servers; count the function's API calls
    servers = {}
    for spec in (VMI_CLEANUP, NOOP):
        servers[spec.name] = stack.enter_context(_running(Server(spec, kubeconfig, workdir)))
        servers[spec.name].first_answer(*irrelevant)
    calls_before = cluster.calls()
    for name, server in servers.items():
        say(f"warm-up {name} ...")
        generator.run(server.port, *irrelevant, config.warmup)
    runs: list[Run] = []
    for index in range(config.rounds):
        for name, server in servers.items():
            say(f"round {index + 1}/{config.rounds}: {name} ...")
            runs.append(Run.of(name, generator.run(server.port, *irrelevant, config.load)))
    function_log = servers[VMI_CLEANUP.name].log_path
    cluster.settle(function_log)
    counts, in_handler = decisions(function_log)
    irrelevant_events = counts["irrelevant"]
    calls = cluster.calls() - calls_before
    report.rounds = [asdict(r) for r in runs]
    by_server = {name: [r for r in runs if r.server == name] for name in servers}
    report.throughput = {name: _medians(rs) for name, rs in by_server.items()}
    noop_rate = report.throughput[NOOP.name]["events_per_s"]
    report.ratio = round(report.throughput[VMI_CLEANUP.name]["events_per_s"] / noop_rate, 3) if noop_rate else 0.0
    report.paired_ratios = [round(a.per_second / b.per_second, 3) if b.per_second else 0.0
                            for a, b in zip(by_server[VMI_CLEANUP.name], by_server[NOOP.name], strict=False)]
    report.irrelevant = {"events": irrelevant_events, "api_calls": calls,
                         "api_calls_per_event": round(calls / irrelevant_events, 4) if irrelevant_events else None,
                         "decisions": dict(counts), "in_handler_ms_p50": in_handler.get("irrelevant")}

    # 5. memory after the load
    report.rss_mib = {name: round(server.rss_kib() / 1024, 1) for name, server in servers.items()}

    # 3. relevant but cheap: a Succeeded VMI not yet due (the default CLEANUP_AFTER): re-read VMI and VM, wait
    say("relevant, not yet due ...")
    vm = cluster.create(make_vm("bench-succeeded"))
    succeeded = cluster.create(make_vmi("bench-succeeded", phase="Succeeded", vm=vm))
    relevant = binary_event(succeeded)
    function = servers[VMI_CLEANUP.name]
    calls_before, counts_before = cluster.calls(), counts
    result = generator.run(function.port, *relevant, config.relevant)
    cluster.settle(function_log)
    calls = cluster.calls() - calls_before
    counts, in_handler = decisions(function_log)
    new = counts - counts_before
    handled = sum(new.values())
    report.relevant = {**asdict(Run.of(VMI_CLEANUP.name, result)), "api_calls": calls,
                       "api_calls_per_event": round(calls / handled, 3) if handled else None,
                       "decisions": dict(new), "in_handler_ms_p50": in_handler.get("wait")}
    return report


@contextlib.contextmanager
def _running(part):
    """Start a Server (or anything with start() and stop(), such as a webhook Receiver); stop it on leaving."""
    part.start()
    try:
        yield part
    finally:
        part.stop()


# -- the report ----------------------------------------------------------------------------------
def render(report: Report) -> str:
    fn, noop = report.throughput[VMI_CLEANUP.name], report.throughput[NOOP.name]
    s = report.settings
    lines = [
        f"vmevents benchmark: vmi-cleanup vs a no-op functions-framework target ({s['cpus']} CPUs)",
        f"load generator: {report.generator} ({s['load']})",
        f"event: binary-mode dev.knative.apiserver.resource.update, data = a Running VMI "
        f"({s['event_bytes']} bytes); {s['rounds']} rounds A/B after {s['warmup_s']}s warm-up each; medians",
        "",
        f"{'irrelevant VMI updates':<26}{'events/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{'non-2xx':>9}",
    ]
    for name, row in ((VMI_CLEANUP.name, fn), (NOOP.name, noop)):
        lines.append(f"  {name:<24}{row['events_per_s']:>10.1f}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}"
                     f"{row['requests']:>10}{row['failed']:>9}")
    paired = report.paired_ratios
    lines += [
        f"  throughput ratio vmi-cleanup / no-op: {report.ratio:.3f} (target >= {TARGET_RATIO}) "
        f"{report.throughput_verdict}",
        f"    per-round ratios: {', '.join(f'{r:.2f}' for r in paired)}"
        f" (median {statistics.median(paired) if paired else 0:.2f})",
        f"  Kubernetes API calls per irrelevant event: {report.irrelevant['api_calls_per_event']} "
        f"({report.irrelevant['api_calls']} calls / {report.irrelevant['events']} events; target {TARGET_CALLS}) "
        f"{report.calls_verdict}",
        f"  logged decisions: {_counts(report.irrelevant['decisions'])}; in-handler p50 "
        f"{_ms(report.irrelevant['in_handler_ms_p50'])}",
        "",
    ]
    rel = report.relevant
    lines += [
        f"relevant, not yet due (Succeeded VMI update, CLEANUP_AFTER {CLEANUP_AFTER.default}; {s['relevant_s']}s; "
        "simulated API server)",
        f"  {'vmi-cleanup':<24}{rel['per_second']:>10.1f}{rel['p50_ms']:>9.2f}{rel['p99_ms']:>9.2f}"
        f"{rel['requests']:>10}{rel['failed']:>9}",
        f"  Kubernetes API calls per event: {rel['api_calls_per_event']} ({rel['api_calls']} calls); "
        f"logged decisions: {_counts(rel['decisions'])}; in-handler p50 {_ms(rel['in_handler_ms_p50'])}",
        "",
        f"{'process':<26}{'start-up s':>12}{'RSS MiB':>10}",
        f"  {'(spawn → first 2xx POST, median of ' + str(s['startups']) + '; RSS master+worker after load)'}",
    ]
    for name in (VMI_CLEANUP.name, NOOP.name):
        lines.append(f"  {name:<24}{report.startup_s[name]:>12.3f}{report.rss_mib[name]:>10.1f}")
    fn_rss, noop_rss = report.rss_mib[VMI_CLEANUP.name], report.rss_mib[NOOP.name]
    fn_up, noop_up = report.startup_s[VMI_CLEANUP.name], report.startup_s[NOOP.name]
    up_ratio, rss_ratio = fn_up / noop_up if noop_up else 0, fn_rss / noop_rss if noop_rss else 0
    lines.append(f"  {'ratio':<24}{up_ratio:>11.2f}x{rss_ratio:>9.2f}x")
    return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vmi_cleanup", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=Config.rounds)
    parser.add_argument("--seconds", type=int, default=Config.load.seconds, help="per round and server")
    parser.add_argument("--connections", type=int, default=Config.load.connections)
    parser.add_argument("--startups", type=int, default=Config.startups)
    parser.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--json", action="store_true", help="also print the whole report as JSON")
    args = parser.parse_args(argv)
    load = Load(seconds=args.seconds, connections=args.connections)
    config = Config(rounds=args.rounds, load=load, warmup=Load(seconds=1, connections=args.connections),
                    relevant=Load(seconds=3, connections=args.connections), startups=args.startups,
                    generator=args.generator)

    # SIGTERM unwinds like Ctrl-C does, so the ExitStack stops every server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
            report = run_bench(config, workdir, stack, say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print("interrupted; every server the benchmark started has been stopped", file=sys.stderr)
        return 130
    print(render(report))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Each function's most common irrelevant event, and the no-op's, as the benchmarks send them.

One place for what "irrelevant" means per function, so the load benchmark (bench/irrelevant.py), the
in-process driver (bench/inprocess.py) and the instruction-count test answer the same question:

- vmi-cleanup and io-pause-report: a Running VMI's status update (the update a cluster sends most);
- device-conflict: a VM without a device whose status KubeVirt wrote (observedGeneration = generation);
- vm-stuck-report: the same Running VM's status write (it names no state a VM is stuck in);
- migration-report: a migration still under way;
- alert-forwarder: an info finding below MIN_SEVERITY (dropped, delivered nowhere);
- dead-letter has no irrelevant event (everything it gets is logged at error level), so it is not here.

Every one is answered 204 with no API call: the kubeconfig the cases are given points at a closed port,
so a call would turn the answer into a 503.
"""
from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from catalog import declared

_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: nobody, user: {token: not-a-token}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


def unreachable_kubeconfig() -> str:
    """A kubeconfig naming 127.0.0.1:9 (discard; nothing listens): any API call fails."""
    path = os.path.join(tempfile.gettempdir(), "vmevents-bench-unreachable.kubeconfig")
    if not os.path.exists(path):
        with open(path, "w") as out:
            out.write(_KUBECONFIG)
    return path


@dataclass(frozen=True)
class Case:
    function: str                                   # the K_SERVICE name
    source: str                                     # FUNCTION_SOURCE, relative to the repo
    event: Callable[[], tuple[dict[str, str], bytes]]
    settings: dict[str, str] = field(default_factory=dict)
    status: int = 204
    verdict: str | None = "irrelevant"              # the log line's verdict (None: the no-op writes none)

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": unreachable_kubeconfig(), "K_SERVICE": self.function, **self.settings}


def _running_vmi() -> tuple[dict[str, str], bytes]:
    from bench.vmi_cleanup import binary_event, make_vm, make_vmi

    vm = make_vm("bench-running")
    vm["metadata"]["uid"] = "3f0e8a54-2f5c-4b7e-9c1d-6a1b2c3d4e5f"
    return binary_event(make_vmi("bench-running", vm=vm))


def _plain_vm() -> tuple[dict[str, str], bytes]:
    from bench.vmi_cleanup import binary_event
    from simcluster.builders.devices import seed_vm1

    plain = seed_vm1("plain", host_devices=[])
    del plain["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"]
    plain["metadata"].setdefault("generation", 2)
    plain.setdefault("status", {})["observedGeneration"] = plain["metadata"]["generation"]
    return binary_event(plain)


def _running_vmim() -> tuple[dict[str, str], bytes]:
    from bench.migration_report import binary_event

    vmim = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "bench-running-migration", "namespace": "default", "generation": 1,
                         "uid": "8d6f4c2a-1b3e-4f5a-9c7d-0e1f2a3b4c5d", "resourceVersion": "4100213",
                         "creationTimestamp": "2026-12-01T10:00:00Z",
                         "labels": {"kubevirt.io/vmi-name": "bench-running"},
                         "finalizers": ["kubevirt.io/migrationJobFinalize"]},
            "spec": {"vmiName": "bench-running"},
            "status": {"phase": "Running", "migrationState": {
                "sourceNode": "harv41", "targetNode": "harv42", "mode": "PreCopy",
                "startTimestamp": "2026-12-01T10:00:09Z", "targetPod": "virt-launcher-bench-running-7xk2p"},
                "phaseTransitionTimestamps": [
                    {"phase": p, "phaseTransitionTimestamp": f"2026-12-01T10:00:0{i}Z"}
                    for i, p in enumerate(("Pending", "Scheduling", "Scheduled", "PreparingTarget",
                                           "TargetReady", "Running"))]}}
    return binary_event(vmim)


def _info_finding() -> tuple[dict[str, str], bytes]:
    from bench.alert_forwarder import binary
    from simcluster.builders import findings as b

    return binary("io.vmevents.vmi-cleanup.cleaned", b.cleaned())


def _ready_node() -> tuple[dict[str, str], bytes]:
    """A Ready, schedulable Harvester node's status update, as its kubelet posts them (the heartbeat conditions,
    images, addresses): what evacuation-report is sent most, and answers without decoding."""
    when = "2026-12-01T10:00:00Z"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "harvester-node-3", "uid": "5f0c2d7e-8a1b-4c3d-9e2f-1a2b3c4d5e6f",
                         "resourceVersion": "4100317", "creationTimestamp": "2026-11-01T08:00:00Z",
                         "labels": {"kubernetes.io/hostname": "harvester-node-3", "kubernetes.io/os": "linux",
                                    "node-role.kubernetes.io/control-plane": "true", "kubevirt.io/schedulable": "true",
                                    "harvesterhci.io/managed": "true"},
                         "annotations": {"kubevirt.io/heartbeat": when, "node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"podCIDR": "10.52.3.0/24", "providerID": "rke2://harvester-node-3"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.168.10.13"},
                              {"type": "Hostname", "address": "harvester-node-3"}],
                "allocatable": {"cpu": "62", "memory": "503Gi", "pods": "200", "devices.kubevirt.io/kvm": "1k"},
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "200", "devices.kubevirt.io/kvm": "1k"},
                "conditions": [{"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": when,
                                "lastTransitionTime": "2026-11-01T08:01:00Z"}
                               for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has "
                                                "sufficient memory available"),
                                               ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk "
                                                "pressure"),
                                               ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID "
                                                "available"))]
                + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status", "lastHeartbeatTime": when,
                    "lastTransitionTime": "2026-11-01T08:01:00Z"}],
                "nodeInfo": {"kubeletVersion": "v1.33.4+rke2r1", "osImage": "Harvester v1.6.1",
                             "containerRuntimeVersion": "containerd://2.0.5-k3s1", "architecture": "amd64"},
                "images": [{"names": [f"registry.suse.com/suse/sles/15.6/virt-launcher:1.5.{i}"],
                            "sizeBytes": 400000000 + i} for i in range(8)]}}
    headers = {"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": str(uuid.uuid4()),
               "ce-type": "dev.knative.apiserver.resource.update", "ce-source": "https://10.43.0.1:443",
               "ce-subject": "/api/v1/nodes/harvester-node-3", "ce-kind": "Node", "ce-apiversion": "v1",
               "ce-name": "harvester-node-3"}
    return headers, json.dumps(node, separators=(",", ":")).encode()


def _case(function: str, event: Callable[[], tuple[dict[str, str], bytes]], **options: Any) -> Case:
    """The case of a declared function (catalog.FUNCTIONS): its FUNCTION_SOURCE is its package's main.py."""
    return Case(function, f"functions/{declared(function).package}/main.py", event, **options)


NOOP = Case("no-op", "bench/noop.py", _running_vmi, verdict=None)
# tests/test_catalog.py fails, naming this file, when a declared function that takes events has no case here.
IRRELEVANT: dict[str, Case] = {case.function: case for case in (
    NOOP,
    _case("vmi-cleanup", _running_vmi),
    _case("device-conflict", _plain_vm),
    _case("migration-report", _running_vmim),
    _case("io-pause-report", _running_vmi),
    _case("vm-stuck-report", _plain_vm),
    _case("evacuation-report", _ready_node),
    _case("alert-forwarder", _info_finding, settings={"WEBHOOK_URL": "http://127.0.0.1:9/hook"}, verdict="drop"),
)}


def baseline(function: str) -> str:
    """The name under which the no-op answering `function`'s own event is counted: "no-op" for the VMI event the
    no-op is sent anyway (vmi-cleanup, io-pause-report), "no-op/<function>" for another event. A function is
    compared with the no-op answering the same request: serving a 697-byte finding with 6 headers costs the
    no-op's gunicorn worker a tenth less than the 4-KB VMI event with 10 (docs/hot-path.md)."""
    case = IRRELEVANT[function]
    return NOOP.function if case.event is NOOP.event else f"{NOOP.function}/{function}"


def case_of(name: str) -> Case:
    """The case a name of `baseline` or IRRELEVANT stands for: "no-op/<function>" is the no-op with that event."""
    if name in IRRELEVANT:
        return IRRELEVANT[name]
    noop, _, function = name.partition("/")
    if noop != NOOP.function or function not in IRRELEVANT:
        raise KeyError(name)
    return Case(NOOP.function, NOOP.source, IRRELEVANT[function].event, status=NOOP.status, verdict=None)


def describe(case: Case) -> str:
    headers, body = case.event()
    return f"{headers.get('ce-type')} {headers.get('ce-kind', '')} ({len(body)} bytes): {json.dumps(case.verdict)}"

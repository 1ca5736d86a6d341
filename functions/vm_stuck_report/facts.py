"""What vm-stuck-report reads, as values: the VM, its VMI and VMIM (`Facts`), and for a VM stuck past its threshold
what explains it (`Detail`): the pod, volumes, node, quotas and Events; with the ResourceQuota arithmetic. Pure
(decide.py's rules apply); the words for all of it are wording.py's."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared import objects as o

PURE = True


@dataclass(frozen=True)
class Stuck:
    """A VM in a state past its threshold (or not yet: `Verdict.action` says)."""

    state: str              # printableStatus, or MigrationPending / MigrationScheduling
    group: str              # starting | stopping | terminating | migrating
    since: datetime
    instance: str           # what the episode is of: the VMIM's uid, else the VMI's, else the VM's
    threshold: timedelta
    migration: str | None = None  # the VMIM's name for a migration that does not start
    namespace: str = "default"    # the VM's: the next steps name it
    vm: str = ""


@dataclass(frozen=True)
class EventFact:
    """A Kubernetes Event someone else recorded (the scheduler, the kubelet, KubeVirt)."""

    on: str          # "Pod/virt-launcher-x", "VirtualMachineInstance/vm1"
    reason: str
    message: str
    count: int = 1   # how often it happened: `series.count` for the events.k8s.io recorder's, else `count`
    component: str = ""  # who recorded it: source.component, else reportingComponent ("kubelet", "default-scheduler")


@dataclass(frozen=True)
class Waiting:
    """A container of the pod that waits: the kubelet's reason and message (an init container's first: the kubelet
    runs them before the others, and KubeVirt pulls a containerDisk's image in one, docs/facts.md §7)."""

    container: str
    reason: str
    message: str = ""
    init: bool = False
    image: str = ""


@dataclass(frozen=True)
class Ended:
    """A container of the pod that ended: the kubelet's terminated reason, message and exit code."""

    container: str
    reason: str
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class PodFacts:
    name: str
    node: str = ""
    phase: str = ""
    scheduled: tuple[str, str, str] | None = None   # PodScheduled (status, reason, message)
    waiting: tuple[Waiting, ...] = ()               # its containers that wait, init containers first
    events: tuple[EventFact, ...] = ()              # the Events on the pod, oldest first
    ended: tuple[Ended, ...] = ()                   # its containers that ended with an error


@dataclass(frozen=True)
class VolumeFacts:
    volume: str
    claim: str
    found: bool = True
    phase: str = ""
    storage_class: str = ""
    class_found: bool | None = None
    provisioner: str = ""
    binding_mode: str = ""
    datavolume: bool = False           # the volume is a DataVolume's (CDI creates its PVC, of the same name)
    longhorn: str = ""                 # the Longhorn volume's name, when the PV is Longhorn's
    longhorn_state: str = ""
    longhorn_robustness: str = ""


@dataclass(frozen=True)
class NodeFacts:
    name: str
    found: bool = True
    ready: str = ""                    # the Ready condition's status: True, False, Unknown
    ready_reason: str = ""
    ready_since: str = ""
    unschedulable: bool = False
    taints: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()     # why it is being emptied (shared.nodes.draining): evacuation-report's


@dataclass(frozen=True)
class QuotaFacts:
    name: str
    resource: str
    hard: str
    used: str
    requested: str


# CDI's DataVolume, as KubeVirt reads it (pkg/storage/types/dv.go HasDataVolumeErrors, HasDataVolumeProvisioning;
# the phases and conditions: containerized-data-importer-api v1beta1 types.go; docs/facts.md §7).
DV_DONE = ("Succeeded", "PendingPopulation")
DV_ERRORS = ("Error", "ImagePullFailed")  # the Running condition's reasons KubeVirt counts as an error (v1.8.3)


@dataclass(frozen=True)
class DataVolumeFacts:
    name: str
    found: bool = True
    uid: str = ""
    created: datetime | None = None
    phase: str = ""
    progress: str = ""                             # "12.50%", "N/A"
    running: tuple[str, str, str] | None = None    # the Running condition (status, reason, message)
    bound: tuple[str, str, str] | None = None      # the Bound condition
    restarts: int = 0                              # status.restartCount: the importer's restarts

    @property
    def error(self) -> bool:
        """KubeVirt prints DataVolumeError: the DataVolume Failed, or its importer stopped on an error."""
        return self.phase == "Failed" or (self.running is not None and self.running[0] == "False"
                                          and self.running[1] in DV_ERRORS)

    @property
    def provisioning(self) -> bool:
        """KubeVirt prints Provisioning: not done, and bound or past WaitForFirstConsumer."""
        bound = self.bound is not None and self.bound[0] == "True"
        return self.found and self.phase not in DV_DONE and (bound or self.phase != "WaitForFirstConsumer")


# KubeVirt's back-off between a VM's failed starts (pkg/virt-controller/watch/vm.go calculateStartBackoffTime,
# v1.3.1 and v1.8.3): after the n-th failure in a row it waits 10·n² s plus up to half that again, at most 300 s.
BACKOFF_STEP, BACKOFF_MAX = 10, 300


@dataclass(frozen=True)
class StartFailures:
    """status.startFailure: KubeVirt counts a VM's VMIs that failed before they ever ran (syncStartFailureStatus),
    and clears it once one runs. It prints CrashLoopBackOff while it waits to start the next."""

    count: int
    retry_after: datetime | None
    last_vmi: str = ""

    def since(self) -> datetime | None:
        """The latest the first of these failures can have happened: the n-th was at least min(10·n², 300) s before
        `retry_after`, and each earlier one at least its own back-off before the next. Timed so, a crash loop is
        never reported before it has lasted its threshold."""
        if self.retry_after is None or self.count < 1:
            return None
        waited = sum(min(BACKOFF_STEP * k * k, BACKOFF_MAX) for k in range(1, self.count + 1))
        return self.retry_after - timedelta(seconds=waited)


@dataclass(frozen=True)
class QueueFacts:
    """KubeVirt's migration queue, as its migration controller counts it before it creates a target pod
    (handleTargetPodCreation, docs/facts.md §7): the running migrations (not final and past Pending, or Pending
    with a target pod) against `parallelMigrationsPerCluster`, and those out of the VMI's node against
    `parallelOutboundMigrationsPerNode` (the KubeVirt CR's spec.configuration.migrations; 5 and 2 when absent)."""

    running: int
    cluster_limit: int
    node: str
    outbound: int
    node_limit: int
    kubevirt: str = ""   # "namespace/name" of the KubeVirt CR read ("": none found, KubeVirt's defaults)

    @property
    def full(self) -> bool:
        return self.running >= self.cluster_limit or self.outbound >= self.node_limit

    @property
    def held(self) -> bool:
        """A limit of 0 that holds it: the queue never moves."""
        return (self.running >= self.cluster_limit == 0) or (self.outbound >= self.node_limit == 0)


@dataclass(frozen=True)
class Refusal:
    """The ResourceQuota admission's refusal of a pod, as its message names it (k8s.io/apiserver
    plugin/resourcequota controller.go): "exceeded quota: <name>, requested: <r=q,…>, used: <…>, limited: <…>" —
    only the resources it exceeds —, or "failed quota: <name>: must specify <resources> for: <containers>"."""

    quota: str
    requested: Mapping[str, str] = field(default_factory=dict)
    used: Mapping[str, str] = field(default_factory=dict)
    limited: Mapping[str, str] = field(default_factory=dict)
    unspecified: str = ""   # "must specify …": what the pod lacks


_EXCEEDED = re.compile(r"exceeded quota: ([a-z0-9.-]+)(?:, requested: (\S+), used: (\S+), limited: ([^\s\\\"']+))?")
_UNSPECIFIED = re.compile(r"failed quota: ([a-z0-9.-]+): must specify ([^\\\"']+)")


def refusal(message: str) -> Refusal | None:
    """The quota refusal a message carries (KubeVirt's FailedCreate "Error creating pod: …", the VMI's Synchronized
    condition "failed to create virtual machine pod: …"), or None."""
    found = _EXCEEDED.search(message)
    if found:
        def pairs(text: str | None) -> dict[str, str]:
            return dict(p.partition("=")[::2] for p in (text or "").rstrip(".,").split(",") if "=" in p)
        return Refusal(found.group(1), pairs(found.group(2)), pairs(found.group(3)), pairs(found.group(4)))
    found = _UNSPECIFIED.search(message)
    return Refusal(found.group(1), unspecified=found.group(2).strip()) if found else None


@dataclass(frozen=True)
class Detail:
    """What the handler read fresh to explain one stuck VM (only for a VM stuck past its threshold)."""

    synchronized: tuple[str, str, str] | None = None    # the VMI's Synchronized condition (status, reason, message)
    container_disks: Mapping[str, str] = field(default_factory=dict)  # the VM's containerDisk volumes: name -> image
    pod: PodFacts | None = None
    pod_looked_for: str = ""                            # "launcher" or "migration target"
    volumes: tuple[VolumeFacts, ...] = ()
    node: NodeFacts | None = None
    quotas: tuple[QuotaFacts, ...] = ()                 # the ResourceQuotas the pod would exceed
    cordoned: tuple[str, ...] = ()                      # the cordoned nodes (read when the scheduler names some)
    queue: QueueFacts | None = None                     # for a migration with no target pod: KubeVirt's queue
    datavolumes: tuple[DataVolumeFacts, ...] = ()       # the VM's DataVolumes (read for Provisioning, DataVolumeError)
    start_failures: StartFailures | None = None         # the VM's status.startFailure
    longhorn_namespace: str = "longhorn-system"
    kubevirt_events: tuple[EventFact, ...] = ()         # on the VM, VMI and VMIM: FailedCreate, FailedPvcNotFound
    device_resources: frozenset[str] = frozenset()      # the VM's hostDevices' and gpus' deviceNames
    nodes_with: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # resource -> nodes that have any
    nodes_total: int = 0
    device_conflict: str = ""                           # device-conflict's open finding on this VM (its summary)
    source_node: NodeFacts | None = None                # a Migrating VM's node (the VMI's status.nodeName)


@dataclass(frozen=True)
class Facts:
    """What the handler read fresh for one decision: the VM, its VMI, the VMIM of a migration that does not start
    (`migration_gone`: the event named one that no longer exists); and, once the VM is found stuck past its
    threshold, the `detail` that explains it."""

    vm: Mapping[str, Any] | None
    vmi: Mapping[str, Any] | None = None
    vmim: Mapping[str, Any] | None = None
    migration_gone: bool = False
    datavolumes: tuple[DataVolumeFacts, ...] = ()   # read for a VM that is Provisioning or DataVolumeError
    detail: Detail | None = None


# -- quantities (the ResourceQuota check) -----------------------------------------------------------
_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?\d+))?([numkKMGTPE]i?)?$")


def quantity(text: object) -> float | None:
    """A Kubernetes quantity ('500m', '2Gi', '1.5') as a number; None when unreadable."""
    match = _QUANTITY.match(str(text).strip()) if text is not None else None
    if not match or (match.group(3) or "") not in _SUFFIX:
        return None
    try:
        value = float(match.group(1)) * (10 ** int(match.group(2)) if match.group(2) else 1)
    except ValueError:
        return None
    return value * _SUFFIX[match.group(3) or ""]


def exceeded(quota: Mapping, requests: Mapping[str, str],
             limits: Mapping[str, str] | None = None) -> tuple[QuotaFacts, ...]:
    """The resources of a ResourceQuota (its status: hard and used, kept by kube-controller-manager) that one
    more pod with these requests and limits would exceed (the quota admission's rule: used + requested > hard).
    Harvester's and Rancher's namespace quotas are usually on limits.cpu and limits.memory."""
    hard, used = o.strings(quota, "status", "hard"), o.strings(quota, "status", "used")
    name = o.string(quota, "metadata", "name")
    asked = {"pods": "1", "count/pods": "1"}
    for resource, value in requests.items():
        asked[f"requests.{resource}"] = value
        if resource in ("cpu", "memory"):
            asked[resource] = value
    for resource, value in (limits or {}).items():
        asked[f"limits.{resource}"] = value
    out = []
    for resource, value in sorted(asked.items()):
        limit, now, need = quantity(hard.get(resource)), quantity(used.get(resource, "0")), quantity(value)
        if limit is not None and now is not None and need is not None and now + need > limit + 1e-9:
            out.append(QuotaFacts(name, resource, hard[resource], used.get(resource, "0"), value))
    return tuple(out)

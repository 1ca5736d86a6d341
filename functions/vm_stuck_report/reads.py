"""vm-stuck-report's reads: what explains one stuck VM, read fresh and turned into its Detail (facts.py) — the
launcher or migration target pod, its condition, container states and Events; the PVCs, StorageClasses, PVs and
Longhorn volumes; the node; the ResourceQuotas; KubeVirt's Events. Only what the state can need is read."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from functions.vm_stuck_report.causes import ATTACH_REASONS
from functions.vm_stuck_report.facts import (
    DataVolumeFacts,
    Detail,
    Ended,
    EventFact,
    NodeFacts,
    PodFacts,
    QueueFacts,
    Stuck,
    VolumeFacts,
    Waiting,
    exceeded,
    quantity,
)
from functions.vm_stuck_report.settings import Settings
from shared import kubevirt as kv
from shared import nodes
from shared import objects as o
from shared.kinds import EVENT, KUBEVIRT, POD, PV, PVC, VMI, VMIM, Kind
from shared.ledger import record_of
from shared.runtime import KubeContext

NODE = Kind("v1", "Node", "nodes", namespaced=False)
QUOTA = Kind("v1", "ResourceQuota", "resourcequotas")
STORAGE_CLASS = Kind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)
LONGHORN_VOLUME = Kind("longhorn.io/v1beta2", "Volume", "volumes")
DATAVOLUME = Kind("cdi.kubevirt.io/v1beta1", "DataVolume", "datavolumes")
LONGHORN_DRIVER = "driver.longhorn.io"
CREATED_BY = "kubevirt.io/created-by"          # types.go CreatedByLabel: the launcher pod's VMI uid
MIGRATION_JOB = "kubevirt.io/migrationJobUID"  # types.go MigrationJobLabel: the target pod's VMIM uid
KUBEVIRT_REASONS = ("FailedCreate", "FailedPvcNotFound", "FailedScheduling")
DEVICE_CONFLICT = "device-conflict"


def read_detail(ctx: KubeContext[Settings], s: Stuck, vm: dict, vmi: dict | None, vmim: dict | None,
                events: list[dict]) -> Detail:
    """Everything decide.diagnose looks at, read fresh; nothing is read that the state cannot need."""
    namespace = kv.meta(vm).get("namespace") or "default"
    vmi_uid = kv.meta(vmi).get("uid") if vmi else None
    spec = o.mapping(vmi, "spec") if vmi else o.mapping(vm, "spec", "template", "spec")
    kubevirt_events = tuple(_event(e) for e in events if e.get("reason") in KUBEVIRT_REASONS
                            and _current(e, s, vmi_uid))
    synchronized = _condition(vmi, "Synchronized")
    disks = {str(v.get("name") or ""): o.string(v, "containerDisk", "image") for v in o.objects(spec, "volumes")
             if o.text(v, "containerDisk", "image")}
    if s.group in ("stopping", "terminating"):
        # only a VMI handed over to its node can hang stopping (one that is not yet, KubeVirt fails as soon as its
        # launcher pod is going down: docs/facts.md §7), and only when that node stopped answering, which is
        # evacuation-report's to tell (causes.diagnose): its node is all a stop needs
        return Detail(node=_node(ctx, o.string(vmi, "status", "nodeName")) if vmi else None,
                      kubevirt_events=kubevirt_events)
    conflict = next((r.finding.summary for r in (record_of(e) for e in events if source_of(e) == DEVICE_CONFLICT)
                     if r is not None and r.open and r.involved.get("kind") == "VirtualMachine"), "")
    if conflict:
        return Detail(device_conflict=conflict)
    looked_for = "migration target" if vmim else "launcher"
    selector = f"{MIGRATION_JOB}={kv.meta(vmim).get('uid')}" if vmim else (f"{CREATED_BY}={vmi_uid}" if vmi_uid
                                                                             else None)
    pod = _newest(list(ctx.kube.list(POD, namespace, label_selector=selector))) if selector else None
    pod_facts = _pod(ctx, pod, namespace) if pod else None
    queue = _queue(ctx, vmim, vmi) if vmim is not None and vmi is not None and pod is None else None
    attach = bool(pod_facts and any(e.reason in ATTACH_REASONS for e in pod_facts.events))
    volumes = tuple(_volume(ctx, namespace, v, attach) for v in o.objects(spec, "volumes")
                    if o.text(v, "persistentVolumeClaim", "claimName") or o.text(v, "dataVolume", "name"))
    node_name = (o.string(pod, "spec", "nodeName") if pod else "") or (o.string(vmi, "status", "nodeName")
                                                                         if vmi and not vmim else "")
    quotas: tuple = ()
    refused = any(e.reason == "FailedCreate" and "quota" in e.message for e in kubevirt_events) or \
        bool(synchronized and synchronized[1] == "FailedCreate" and "quota" in synchronized[2])
    if pod is None or refused:  # a pod that exists was admitted: a quota cannot be what holds it
        source = _newest(list(ctx.kube.list(POD, namespace, label_selector=f"{CREATED_BY}={vmi_uid}"))) \
            if vmim and vmi_uid else None
        requests, limits = _resources(source) if source else _vmi_resources(spec)
        quotas = tuple(q for quota in ctx.kube.list(QUOTA, namespace) for q in exceeded(quota, requests, limits))
    devices = frozenset(str(d.get("deviceName")) for key in ("hostDevices", "gpus")
                        for d in o.objects(spec, "domain", "devices", key) if d.get("deviceName"))
    nodes_with: dict[str, tuple[str, ...]] = {}
    total, cordoned = 0, tuple[str, ...]()
    message = pod_facts.scheduled[2] if pod_facts and pod_facts.scheduled else ""
    wanted = [d for d in devices if f"Insufficient {d}" in message]
    if wanted or "were unschedulable" in message:  # which nodes have the device; which are cordoned
        nodes = list(ctx.kube.list(NODE))
        total = len(nodes)
        cordoned = tuple(sorted(o.string(n, "metadata", "name") for n in nodes
                                if o.flag(n, "spec", "unschedulable") is True))
        for device in devices:
            nodes_with[device] = tuple(sorted(
                o.string(n, "metadata", "name") for n in nodes
                if (quantity(o.strings(n, "status", "allocatable").get(device)) or 0) > 0))
    # a migrating VM's own node: one being emptied is evacuation-report's (causes.diagnose)
    source_node = _node(ctx, o.string(vmi, "status", "nodeName")) if s.group == "migrating" and vmi and not vmim \
        else None
    return Detail(synchronized=synchronized, source_node=source_node, container_disks=disks,
                  pod=pod_facts, pod_looked_for=looked_for, volumes=volumes,
                  node=_node(ctx, node_name) if node_name else None, quotas=quotas, cordoned=cordoned, queue=queue,
                  longhorn_namespace=ctx.settings.longhorn_namespace,
                  kubevirt_events=kubevirt_events, device_resources=devices, nodes_with=nodes_with, nodes_total=total)


# KubeVirt's defaults when the KubeVirt CR sets none (pkg/virt-config/virt-config.go, v1.3.1 and v1.8.3)
PARALLEL_MIGRATIONS_PER_CLUSTER, PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE = 5, 2
NOT_YET_RUNNING = ("", "Pending", "WaitingForSync", "Synchronizing")  # types.go VMIM IsRunning (v1.8.3's list)
FINAL = ("Succeeded", "Failed")


def _queue(ctx: KubeContext[Settings], vmim: Mapping, vmi: Mapping) -> QueueFacts:
    """KubeVirt's migration queue as its migration controller counts it (findRunningMigrations,
    outboundMigrationsOnNode, handleTargetPodCreation; docs/facts.md §7): every unfinished migration that runs, or
    is Pending with a target pod already; those whose VMI is on (or migrates out of) this VMI's node; and the
    limits in the KubeVirt CR (KubeVirt's defaults when it sets none). Read only for a migration stuck past its
    threshold with no target pod."""
    config = next(iter(ctx.kube.list(KUBEVIRT, None, cached=True)), None)
    migrations = o.mapping(config, "spec", "configuration", "migrations") if config else {}

    def limit(key: str, default: int) -> int:
        value = migrations.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    uid = o.string(vmim, "metadata", "uid")
    targets = {str((kv.meta(p).get("labels") or {}).get(MIGRATION_JOB))
               for p in ctx.kube.list(POD, None, label_selector=MIGRATION_JOB)
               if o.string(p, "status", "phase") not in FINAL}
    running = [m for m in ctx.kube.list(VMIM, None, cached=True)
               if o.string(m, "metadata", "uid") != uid and o.string(m, "status", "phase") not in FINAL
               and (o.string(m, "status", "phase") not in NOT_YET_RUNNING
                    or o.string(m, "metadata", "uid") in targets)]
    node = o.string(vmi, "status", "nodeName")
    outbound = 0
    for m in running:
        source = ctx.kube.get(VMI, o.string(m, "metadata", "namespace"), o.string(m, "spec", "vmiName"))
        if source is not None and node and node in (o.string(source, "status", "nodeName"),
                                                    o.string(source, "status", "migrationState", "sourceNode")):
            outbound += 1
    where = f"{kv.meta(config).get('namespace')}/{kv.meta(config).get('name')}" if config else ""
    return QueueFacts(len(running), limit("parallelMigrationsPerCluster", PARALLEL_MIGRATIONS_PER_CLUSTER), node,
                      outbound, limit("parallelOutboundMigrationsPerNode", PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE),
                      where)


def read_datavolumes(ctx: KubeContext[Settings], vm: Mapping) -> tuple[DataVolumeFacts, ...]:
    """The VM's DataVolumes (its template's dataVolume volumes), as CDI keeps them: read for a VM KubeVirt prints
    Provisioning or DataVolumeError, whose time is theirs (docs/facts.md §7)."""
    namespace = kv.meta(vm).get("namespace") or "default"
    out = []
    for volume in o.objects(vm, "spec", "template", "spec", "volumes"):
        name = o.text(volume, "dataVolume", "name")
        if not name:
            continue
        dv = ctx.kube.get(DATAVOLUME, namespace, str(name))
        if dv is None:
            out.append(DataVolumeFacts(str(name), found=False))
            continue
        restarts = o.mapping(dv, "status").get("restartCount")
        out.append(DataVolumeFacts(str(name), uid=o.string(dv, "metadata", "uid"),
                                   created=kv.parse_time(o.text(dv, "metadata", "creationTimestamp")),
                                   phase=o.string(dv, "status", "phase"), progress=o.string(dv, "status", "progress"),
                                   running=_condition(dv, "Running"), bound=_condition(dv, "Bound"),
                                   restarts=restarts if isinstance(restarts, int) else 0))
    return tuple(out)


def _current(event: dict, s: Stuck, vmi_uid: str | None) -> bool:
    """KubeVirt's Event about this episode: on this VMI (or the VM), written since the episode began."""
    involved = event.get("involvedObject") or {}
    if involved.get("kind") == "VirtualMachineInstance" and vmi_uid and involved.get("uid") not in (None, vmi_uid):
        return False
    last = kv.parse_time(last_seen(event))
    return last is None or last >= s.since.replace(microsecond=0)


def last_seen(event: dict) -> str:
    """When an Event last happened. The events.k8s.io recorder (client-go tools/events, kube-scheduler's) writes
    `eventTime` once and counts repeats in `series` (count, lastObservedTime), leaving `lastTimestamp` and `count`
    empty; the core/v1 recorder (tools/record, the kubelet's, KubeVirt's) keeps `lastTimestamp` and `count`
    (docs/facts.md §7)."""
    series = event.get("series")
    series = series if isinstance(series, dict) else {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime") or "")


def _event(event: dict) -> EventFact:
    involved = event.get("involvedObject") or {}
    series = event.get("series")
    series = series if isinstance(series, dict) else {}
    count = series.get("count") or event.get("count") or 1
    component = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    return EventFact(f"{involved.get('kind')}/{involved.get('name')}", str(event.get("reason") or ""),
                     str(event.get("message") or ""), int(count) if isinstance(count, int) else 1, str(component))


def _condition(obj: Mapping | None, kind: str) -> tuple[str, str, str] | None:
    found = next((c for c in kv.conditions_of(obj) if c.get("type") == kind), None) if obj else None
    if found is None:
        return None
    return str(found.get("status") or ""), str(found.get("reason") or ""), str(found.get("message") or "")


def source_of(event: dict) -> str:
    return str((event.get("source") or {}).get("component") or "")


def _newest(pods: list[dict]) -> dict | None:
    live = [p for p in pods if not kv.meta(p).get("deletionTimestamp")] or pods
    return max(live, key=lambda p: str(kv.meta(p).get("creationTimestamp") or ""), default=None)


def _pod(ctx: KubeContext[Settings], pod: dict, namespace: str) -> PodFacts:
    name = o.string(pod, "metadata", "name")
    images = {str(c.get("name") or ""): str(c.get("image") or "")
              for key in ("initContainers", "containers") for c in o.objects(pod, "spec", key)}
    # The kubelet runs the init containers first, one after another; KubeVirt pulls each containerDisk's image in
    # one of them (`volume<name>-init`), so an image that cannot be pulled waits there while the others wait
    # PodInitializing (docs/facts.md §7).
    waiting = tuple(Waiting(str(c.get("name") or ""), o.string(c, "state", "waiting", "reason"),
                            o.string(c, "state", "waiting", "message"), init,
                            o.string(c, "image") or images.get(str(c.get("name") or ""), ""))
                    for key, init in (("initContainerStatuses", True), ("containerStatuses", False))
                    for c in o.objects(pod, "status", key) if o.text(c, "state", "waiting", "reason"))
    events = tuple(_event(e) for e in sorted(
        ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.name={name}"), key=last_seen)
        if (e.get("involvedObject") or {}).get("kind") == "Pod")
    ended = tuple(Ended(str(c.get("name") or ""), o.string(c, "state", "terminated", "reason"),
                        o.string(c, "state", "terminated", "message"), code if isinstance(code, int) else None)
                  for c in o.objects(pod, "status", "containerStatuses")
                  for code in [o.mapping(c, "state", "terminated").get("exitCode")]
                  if o.mapping(c, "state", "terminated") and code != 0)
    return PodFacts(name, o.string(pod, "spec", "nodeName"), o.string(pod, "status", "phase"),
                    _condition(pod, "PodScheduled"), waiting, events, ended)


def _volume(ctx: KubeContext[Settings], namespace: str, volume: dict, follow: bool) -> VolumeFacts:
    """A PVC-backed volume: the PVC's phase; for a pending one its StorageClass; for one whose attach failed,
    followed through its PV to the Longhorn volume."""
    claim = o.text(volume, "persistentVolumeClaim", "claimName") or o.string(volume, "dataVolume", "name")
    facts = VolumeFacts(str(volume.get("name") or ""), claim, datavolume=bool(o.text(volume, "dataVolume", "name")))
    pvc = ctx.kube.get(PVC, namespace, claim)
    if pvc is None:
        return replace(facts, found=False)
    facts = replace(facts, phase=o.string(pvc, "status", "phase"), storage_class=o.string(pvc, "spec",
                                                                                           "storageClassName"))
    if facts.phase != "Bound" and facts.storage_class:
        sc = ctx.kube.get(STORAGE_CLASS, None, facts.storage_class)
        return replace(facts, class_found=sc is not None, provisioner=o.string(sc, "provisioner") if sc else "",
                       binding_mode=o.string(sc, "volumeBindingMode") if sc else "")
    pv_name = o.text(pvc, "spec", "volumeName")
    if not follow or facts.phase != "Bound" or not pv_name:
        return facts
    pv = ctx.kube.get(PV, None, pv_name)
    csi = o.mapping(pv, "spec", "csi")
    if not pv or csi.get("driver") != LONGHORN_DRIVER or not o.text(csi, "volumeHandle"):
        return facts
    lh = ctx.kube.get(LONGHORN_VOLUME, ctx.settings.longhorn_namespace, str(csi["volumeHandle"]))
    return replace(facts, longhorn=str(csi["volumeHandle"]),
                   longhorn_state=o.string(lh, "status", "state") if lh else "not found",
                   longhorn_robustness=o.string(lh, "status", "robustness") if lh else "")


def _node(ctx: KubeContext[Settings], name: str) -> NodeFacts | None:
    if not name:
        return None
    node = ctx.kube.get(NODE, None, name)
    if node is None:
        return NodeFacts(name, found=False)
    ready = next((c for c in kv.conditions_of(node) if c.get("type") == "Ready"), {})
    taints = tuple(f"{t.get('key')}:{t.get('effect')}" for t in o.objects(node, "spec", "taints"))
    return NodeFacts(name, ready=str(ready.get("status") or ""), ready_reason=str(ready.get("reason") or ""),
                     ready_since=str(ready.get("lastTransitionTime") or ""),
                     unschedulable=o.flag(node, "spec", "unschedulable") is True, taints=taints,
                     draining=nodes.draining(node))


def _resources(pod: dict) -> tuple[dict[str, str], dict[str, str]]:
    """A pod's cpu and memory requests and limits, summed over its containers (what the quota admission counts;
    a migration's target pod repeats its source's: pkg/virt-controller/watch/migration.go)."""
    def total(kind: str) -> dict[str, str]:
        found: dict[str, float] = {}
        for container in o.objects(pod, "spec", "containers"):
            for resource, value in o.strings(container, "resources", kind).items():
                if resource in ("cpu", "memory"):
                    found[resource] = found.get(resource, 0.0) + (quantity(value) or 0.0)
        return {k: _format(k, v) for k, v in found.items()}
    return total("requests"), total("limits")


def _vmi_resources(spec: Mapping) -> tuple[dict[str, str], dict[str, str]]:
    """The guest's own requests and limits, for a launcher pod that could not be created (KubeVirt adds its
    overhead: the refusal's message, when there is one, has the pod's numbers)."""
    def found(kind: str) -> dict[str, str]:
        return {k: v for k, v in o.strings(spec, "domain", "resources", kind).items() if k in ("cpu", "memory")}
    return found("requests"), found("limits")


def _format(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{value / 2**30:.0f}Gi" if value % 2**30 == 0 else f"{value / 2**20:.0f}Mi" if value >= 2**20 \
            else f"{value:.0f}"
    return f"{value * 1000:.0f}m"

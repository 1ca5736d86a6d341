"""vm-stuck-report's pure part: is this VM (or its migration) stuck, and why — from facts read fresh.

Two decisions, both without I/O or clock: `stuck()` says whether a VM has stayed in a transitional or error
state (KubeVirt's `status.printableStatus`, or its VMIM's phase) longer than that state's threshold, and since
when; `diagnose()` names exactly one cause with its evidence and one next step, or says the cause is unknown and
what was checked. It never guesses: every cause rests on a fact KubeVirt, the scheduler, the kubelet, the quota
admission or Longhorn wrote (docs/facts.md §7).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from functions.vm_stuck_report.facts import (
    EventFact,
    Facts,
    NodeFacts,
    PodFacts,
    QuotaFacts,
    Stuck,
    VolumeFacts,
    checked_words,
    exceeded,
    quantity,
    stamp,
    state_words,
)
from functions.vm_stuck_report.settings import GROUPS, MIGRATION_PHASES, OPT_OUT, Settings
from shared import kubevirt as kv
from shared import objects as o


class Cause(StrEnum):
    INSUFFICIENT = "insufficient-resources"      # the scheduler: Insufficient cpu / memory / a device resource
    DEVICE_ON_ONE_NODE = "device-on-one-node"    # ... a device resource only one node has at all
    PLACEMENT = "node-placement"                 # node affinity / selector, or taints the pod does not tolerate
    NODE_UNSCHEDULABLE = "node-unschedulable"    # the nodes that fit are cordoned (maintenance, drain)
    VOLUME_MISSING = "volume-missing"            # a PVC the VM names does not exist (ErrorPvcNotFound)
    VOLUME_UNBOUND = "volume-unbound"            # a PVC is Pending: nothing provisioned or bound it
    VOLUME_ATTACH = "volume-attach"              # FailedAttachVolume / FailedMount on the pod
    IMAGE_PULL = "image-pull"                    # a container waits in ErrImagePull / ImagePullBackOff
    QUOTA = "quota-exceeded"                     # a ResourceQuota refused the (target) pod
    UNKNOWN = "unknown"


class Action(StrEnum):
    REPORT = "report"      # stuck past its threshold: open (or see again) its finding
    WAIT = "wait"          # in a stuck state, not for long enough yet
    SETTLED = "settled"    # not stuck (any open finding of this VM ends)
    DEFER = "defer"        # another function's finding (device-conflict, migration-report, evacuation-report)
    SKIP = "skip"          # out of scope, or opted out


__all__ = ["Action", "Cause", "EventFact", "Facts", "NodeFacts", "PodFacts", "QuotaFacts", "Stuck", "Verdict",
           "VolumeFacts", "diagnose", "exceeded", "quantity", "stamp", "stuck"]


# -- is it stuck? ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    stuck: Stuck | None = None
    cause: Cause | None = None
    evidence: tuple[str, ...] = ()
    next_step: str = ""
    checked: tuple[str, ...] = ()


def stuck(vm: Mapping | None, vmi: Mapping | None, vmim: Mapping | None, settings: Settings,
          now: datetime) -> Verdict:
    """Whether the VM (with its VMI and, for a migration, the VMIM) is stuck, and since when."""
    if vm is None:
        return Verdict(Action.SETTLED, "the VM no longer exists")
    meta = kv.meta(vm)
    if not settings.in_scope(str(meta.get("namespace") or "default")):
        return Verdict(Action.SKIP, "the VM's namespace is out of scope (VM_STUCK_NAMESPACES)")
    if kv.annotations_of(vm).get(OPT_OUT, "").lower() in ("skip", "false", "off"):
        return Verdict(Action.SKIP, f"the VM opted out ({OPT_OUT})")
    if vmim is not None:
        return _migration(vm, vmi, vmim, settings, now)
    state = o.string(vm, "status", "printableStatus")
    group = GROUPS.get(state)
    if group is None or state.startswith("Migration"):
        return Verdict(Action.SETTLED, f"the VM is {state or 'without a status'}")
    if group == "starting" and vmi is not None and kv.phase(vmi) == "Running":
        # KubeVirt prints Running (or Paused, Migrating, Stopping, Terminating) before any starting word whenever the
        # VMI runs (setPrintableStatus, docs/facts.md §7): this status was written from an older VMI, as
        # virt-controller does from a lagging cache after a restart, and its next sync rewrites it.
        return Verdict(Action.SETTLED, f"the VM reads {state}, but its VMI is Running: the VM's status is behind")
    since, instance = _since(vm, vmi, group)
    if since is None:
        return Verdict(Action.WAIT, f"the VM is {state}, and nothing records since when (no live VMI, or a stop not "
                                    f"yet requested)")
    found = Stuck(state, group, since, instance, settings.threshold(state))
    if now - since < found.threshold:
        return Verdict(Action.WAIT, f"the VM is {state} since {stamp(since)}, not yet {_words(found.threshold)}",
                       found)
    return Verdict(Action.REPORT, f"the VM is {state} since {stamp(since)}, over {_words(found.threshold)}", found)


def _migration(vm: Mapping, vmi: Mapping | None, vmim: Mapping, settings: Settings, now: datetime) -> Verdict:
    phase = o.string(vmim, "status", "phase") or "Pending"  # a VMIM without a phase yet is pending
    evacuated = kv.annotations_of(vmim).get(EVACUATION)
    if evacuated:  # KubeVirt's evacuation of a drained node (docs/facts.md §10): that node's finding lists it
        return Verdict(Action.DEFER, f"an evacuation of node {evacuated}: evacuation-report speaks for it")
    if phase not in MIGRATION_PHASES:
        # a migration that failed is migration-report's; one that runs or ended is not stuck starting
        return Verdict(Action.SETTLED if phase != "Failed" else Action.DEFER,
                       f"the migration is {phase}" + (": migration-report explains it" if phase == "Failed" else ""))
    if vmi is None or kv.phase(vmi) in kv.FINAL_PHASES:
        return Verdict(Action.SETTLED, "the VMI to migrate is gone or has ended")
    state = f"Migration{phase}"
    created = kv.parse_time(o.text(vmim, "metadata", "creationTimestamp"))
    if created is None:
        return Verdict(Action.WAIT, "the migration has no creation time")
    found = Stuck(state, "migrating", created, o.string(vmim, "metadata", "uid"), settings.threshold(state),
                  o.string(vmim, "metadata", "name"))
    if now - created < found.threshold:
        return Verdict(Action.WAIT, f"the migration is {phase} since {stamp(created)}", found)
    return Verdict(Action.REPORT, f"the migration is {phase} since {stamp(created)}, over "
                                  f"{_words(found.threshold)}", found)


def _since(vm: Mapping, vmi: Mapping | None, group: str) -> tuple[datetime | None, str]:
    """When the VM entered its state, from what KubeVirt records (docs/facts.md §7), and the instance."""
    vm_uid = o.string(vm, "metadata", "uid")
    live = vmi is not None and kv.phase(vmi) not in kv.FINAL_PHASES
    vmi_uid = o.string(vmi, "metadata", "uid") if vmi is not None else ""
    if group == "terminating":
        return kv.parse_time(o.text(vm, "metadata", "deletionTimestamp")), vm_uid
    if group == "stopping":  # a stop deletes the VMI (vm.go stopVMI): its deletionTimestamp is when
        return (kv.parse_time(o.text(vmi, "metadata", "deletionTimestamp")) if live else None), vmi_uid
    if group == "migrating":
        return (kv.parse_time(o.text(vmi, "status", "migrationState", "startTimestamp")) if live else None), vmi_uid
    if live:  # starting: every starting phase of this VMI (Pending, Scheduling, Scheduled) counts from its creation
        return kv.parse_time(o.text(vmi, "metadata", "creationTimestamp")), vmi_uid
    # No live VMI: nothing KubeVirt writes says when this began. The VM's Ready condition (VMINotExists) dates from
    # the last stop, often days before a start; and a status that needs a VMI (ErrorUnschedulable, ErrImagePull, …)
    # next to none is a moment stale. Not timed, never guessed: KubeVirt's VirtualMachineStuckInUnhealthyState
    # covers a VM stuck with no VMI (docs/facts.md §7).
    return None, vm_uid


_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([A-Za-z0-9./_-]+)")
_PLACEMENT = re.compile(r"(\d+) node\(s\) (didn't match Pod's node affinity/selector|didn't match node selector|"
                        r"had untolerated taint[^,.]*|had taint[^,.]*|didn't match pod (?:anti-)?affinity rules)")
_CORDONED = re.compile(r"(\d+) node\(s\) were unschedulable")
_UNBOUND = re.compile(r"unbound immediate PersistentVolumeClaims|pod has unbound")
_QUOTA = re.compile(r"exceeded quota")
EVACUATION = "kubevirt.io/evacuationMigration"  # types.go EvacuationMigrationAnnotation
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
ATTACH_REASONS = ("FailedAttachVolume", "FailedMount")


def diagnose(facts: Facts) -> Verdict:
    """Exactly one cause, its evidence and one next step; or the cause unknown, with what was checked."""
    s = facts.stuck
    node = facts.node
    if node is not None and node.found and node.ready != "True":
        # the VMs of a node that stopped answering are evacuation-report's: what Harvester and KubeVirt will do with
        # them and when, and what blocks them (docs/evacuation-report.md, who speaks for what)
        return Verdict(Action.DEFER, f"node {node.name} is Ready={node.ready or 'unknown'}: evacuation-report speaks "
                                     f"for the VMs of a node that stopped answering", s)
    source = facts.source_node
    if s.group == "migrating" and source is not None and source.draining:
        return Verdict(Action.DEFER, f"node {source.name} is being emptied ({'; '.join(source.draining)}): "
                                     f"evacuation-report speaks for its migrations", s)
    if s.group in ("stopping", "terminating"):
        return _unknown(facts)
    if facts.device_conflict:  # a start blocked by a device another VM holds is device-conflict's finding
        return Verdict(Action.DEFER, f"device-conflict reports it: {facts.device_conflict}", s)
    for rule in (_volume_missing, _quota, _scheduling, _volume_unbound, _attach, _image):
        found = rule(facts)
        if found is not None:
            return found
    return _unknown(facts)


def _report(facts: Facts, cause: Cause, evidence: list[str], next_step: str) -> Verdict:
    s = facts.stuck
    return Verdict(Action.REPORT, f"{state_words(s)} since {stamp(s.since)}: {cause.value}", s, cause,
                   tuple(evidence), next_step, checked_words(facts))


def _volume_missing(facts: Facts) -> Verdict | None:
    missing = [v for v in facts.volumes if not v.found]
    if not missing:
        return None
    v = missing[0]
    evidence = [f"volume {v.volume} names PVC {v.claim}, which does not exist"]
    evidence += [f"{e.on}: {e.reason}: {e.message}" for e in facts.kubevirt_events if e.reason == "FailedPvcNotFound"]
    return _report(facts, Cause.VOLUME_MISSING, evidence,
                   f"Create PVC {v.claim} (or restore it), or edit the VM so that volume {v.volume} names a PVC "
                   f"that exists; KubeVirt starts the VM once it appears.")


def _quota(facts: Facts) -> Verdict | None:
    refused = [e for e in facts.kubevirt_events if e.reason == "FailedCreate" and _QUOTA.search(e.message)]
    if not refused and not facts.quotas:
        return None
    evidence = [f"{e.on}: {e.reason}: {e.message}" for e in refused[:1]]
    evidence += [f"ResourceQuota {q.name}: {q.resource} used {q.used} of {q.hard}, the "
                 f"{facts.pod_looked_for or 'launcher'} pod needs {q.requested}" for q in facts.quotas]
    which = facts.quotas[0].name if facts.quotas else "the namespace's ResourceQuota"
    what = "migrate" if facts.stuck.group == "migrating" else "start"
    return _report(facts, Cause.QUOTA, evidence,
                   f"Raise {which} (`kubectl edit resourcequota {which}`) or free room in the namespace: the "
                   f"{'target' if what == 'migrate' else 'launcher'} pod must fit beside the pods already counted "
                   f"(a migration briefly needs the VM's resources twice), then KubeVirt retries and the VM can "
                   f"{what}.")


def _scheduling(facts: Facts) -> Verdict | None:
    pod = facts.pod
    if pod is None or pod.scheduled is None or pod.scheduled[0] != "False":
        return None
    message = pod.scheduled[2] or next((e.message for e in pod.events if e.reason == "FailedScheduling"), "")
    failed = [e for e in pod.events if e.reason == "FailedScheduling"]
    evidence = [f"pod {pod.name}: PodScheduled=False ({pod.scheduled[1]}): {message}"]
    if failed:
        evidence.append(f"{failed[-1].on}: FailedScheduling ×{failed[-1].count}: {failed[-1].message}")
    reasons: list[tuple[int, int, str, str]] = []  # (nodes, order, kind, detail)
    for count, resource in _INSUFFICIENT.findall(message):
        reasons.append((int(count), 0, "insufficient", resource.rstrip(".")))
    for count, why in _PLACEMENT.findall(message):
        reasons.append((int(count), 1, "placement", why))
    for count in _CORDONED.findall(message):
        reasons.append((int(count), 2, "cordoned", ""))
    if _UNBOUND.search(message):
        return _volume_unbound(facts, evidence) or _report(
            facts, Cause.VOLUME_UNBOUND, evidence, "Bind the VM's PVCs: check their StorageClass and provisioner.")
    if not reasons:
        return None  # the scheduler said something we cannot read: unknown, with its message among the checks
    _, _, kind, detail = max(reasons, key=lambda r: (r[0], -r[1]))
    if kind == "insufficient":
        return _insufficient(facts, detail, evidence)
    if kind == "placement":
        return _report(facts, Cause.PLACEMENT, evidence,
                       "No node matches the VM's placement: relax `spec.template.spec.nodeSelector` / `affinity`, "
                       "add a toleration for the nodes' taints, or label / untaint a node that should run it.")
    cordoned = "Uncordon a node (`kubectl uncordon <node>`) once its maintenance is over, or add capacity"
    return _report(facts, Cause.NODE_UNSCHEDULABLE, evidence, f"The nodes that would fit are cordoned "
                   f"(maintenance or a drain). {cordoned}; the scheduler retries by itself.")


def _insufficient(facts: Facts, resource: str, evidence: list[str]) -> Verdict:
    having = facts.nodes_with.get(resource)
    if resource in facts.device_resources and having is not None and len(having) == 1:
        evidence.append(f"only node {having[0]} of {facts.nodes_total} has any {resource}")
        return _report(facts, Cause.DEVICE_ON_ONE_NODE, evidence,
                       f"Only {having[0]} has {resource}: free it there (stop the VM holding it), or give this VM "
                       f"another device type; the VM can run nowhere else.")
    if resource in facts.device_resources and having is not None and not having:
        evidence.append(f"no node has any {resource}")
    what = "device" if resource in facts.device_resources or "/" in resource else resource
    return _report(facts, Cause.INSUFFICIENT, evidence,
                   f"No node has the {what} the VM requests free ({resource}): free it (stop or move another VM), "
                   f"lower the VM's request, or add a node with more; the scheduler retries by itself.")


def _volume_unbound(facts: Facts, evidence: list[str] | None = None) -> Verdict | None:
    pending = [v for v in facts.volumes if v.found and v.phase and v.phase != "Bound"]
    if not pending:
        return None
    v = pending[0]
    out = list(evidence or ())
    out.append(f"PVC {v.claim} is {v.phase}" + (f", StorageClass {v.storage_class}" if v.storage_class else
                                                ", with no StorageClass"))
    if v.storage_class and v.class_found is False:
        out.append(f"StorageClass {v.storage_class} does not exist")
        step = (f"Create StorageClass {v.storage_class}, or recreate PVC {v.claim} with a StorageClass that "
                f"exists (`kubectl get storageclass`).")
    elif v.storage_class:
        out.append(f"StorageClass {v.storage_class}: provisioner {v.provisioner or 'unknown'}"
                   + (f", volumeBindingMode {v.binding_mode}" if v.binding_mode else ""))
        step = (f"Check provisioner {v.provisioner or 'of ' + v.storage_class} (its pods and its Events on PVC "
                f"{v.claim}, `kubectl describe pvc {v.claim}`): it has not provisioned a volume.")
    else:
        step = f"Give PVC {v.claim} a StorageClass, or create a PersistentVolume it can bind to."
    return _report(facts, Cause.VOLUME_UNBOUND, out, step)


def _attach(facts: Facts) -> Verdict | None:
    pod = facts.pod
    failed = [e for e in (pod.events if pod else ()) if e.reason in ATTACH_REASONS]
    if not failed:
        return None
    event = failed[-1]
    evidence = [f"{event.on}: {event.reason} ×{event.count}: {event.message}"]
    longhorn = [v for v in facts.volumes if v.longhorn]
    for v in longhorn:
        evidence.append(f"PVC {v.claim} → Longhorn volume {v.longhorn}: state {v.longhorn_state or 'unknown'}, "
                        f"robustness {v.longhorn_robustness or 'unknown'}")
    bad = next((v for v in longhorn if v.longhorn_robustness == "faulted"), None)
    if bad is not None:
        step = (f"Longhorn volume {bad.longhorn} is faulted (no healthy replica): salvage it in the Longhorn UI "
                f"(Volume → Salvage) or restore it from a backup, then the attach succeeds.")
    elif longhorn:
        step = (f"See why Longhorn cannot attach {longhorn[0].longhorn} to node {pod.node if pod else '?'}: its "
                f"replicas and engine in the Longhorn UI, and longhorn-manager's log on that node.")
    else:
        step = "See why the CSI driver cannot attach or mount the volume: `kubectl describe` the VolumeAttachment " \
               "and the driver's node plugin log on the pod's node."
    return _report(facts, Cause.VOLUME_ATTACH, evidence, step)


def _image(facts: Facts) -> Verdict | None:
    pod = facts.pod
    waiting = [w for w in (pod.waiting if pod else ()) if w[1] in IMAGE_PULL_REASONS]
    if not waiting:
        return None
    container, reason, message = waiting[0]
    return _report(facts, Cause.IMAGE_PULL, [f"pod {pod.name if pod else '?'}: container {container} waits: "
                                             f"{reason}: {message}"],
                   f"Fix the image the VM's {container} container pulls (its name and tag, the registry's "
                   f"reachability from node {pod.node if pod and pod.node else '?'}, an imagePullSecret); the kubelet "
                   f"retries by itself.")


def _unknown(facts: Facts) -> Verdict:
    s = facts.stuck
    return Verdict(Action.REPORT, f"{state_words(s)} since {stamp(s.since)}: cause unknown", s, Cause.UNKNOWN, (),
                   "The cause is not among the facts checked: read `kubectl describe vm`, the VMI and its launcher "
                   "pod, and virt-controller's and virt-handler's logs.", checked_words(facts))


def _words(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes < 120 else f"{minutes // 60}h{minutes % 60:02d}m"

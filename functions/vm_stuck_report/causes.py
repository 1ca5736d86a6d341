"""vm-stuck-report's causes: why a VM stuck past its threshold is stuck, from what was read to explain it (Detail).

`diagnose` tries the rules of the stuck state's group (RULES, in order; docs/vm-stuck-report.md, The causes): the first
whose facts hold names exactly one cause with its evidence and one next step; when none does, the cause is unknown.
It never guesses: every cause rests on a fact KubeVirt, CDI, the scheduler, the kubelet, the quota admission or
Longhorn wrote (docs/facts.md §7). The verdict says what to tell people as `Say` values (a kind and its values);
wording.py words them. Pure (decide.py's rules apply: decide.py imports it).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from functions.vm_stuck_report.facts import Detail, EventFact, Stuck, refusal

DV_STATES = ("Provisioning", "DataVolumeError")  # printed while the VM's DataVolumes are not ready: no VMI yet

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
    MIGRATION_QUEUED = "migration-queued"        # KubeVirt's migration limits hold it, and one of them is 0
    VOLUME_IMPORT = "volume-import"              # a DataVolume's import fails or does not end (CDI)
    CRASH_LOOP = "crash-loop"                    # every VMI fails before it runs (status.startFailure)
    UNKNOWN = "unknown"


class Action(StrEnum):
    REPORT = "report"      # stuck past its threshold: open (or see again) its finding
    EXPLAIN = "explain"    # stuck past its threshold, and the facts do not yet carry what explains it: read it
    WAIT = "wait"          # in a stuck state, not for long enough yet
    SETTLED = "settled"    # not stuck (any open finding of this VM ends)
    DEFER = "defer"        # another function's finding (device-conflict, migration-report, evacuation-report)
    SKIP = "skip"          # out of scope, or opted out


@dataclass(frozen=True)
class Say:
    """Something to tell people, as a kind and its values: wording.py words it."""

    kind: str
    values: Mapping[str, Any] = field(default_factory=dict)


def say(kind: str, **values: Any) -> Say:
    return Say(kind, values)


@dataclass(frozen=True)
class Verdict:
    action: Action
    why: Say                            # the reason (the log line; a resolution's `because`)
    stuck: Stuck | None = None
    cause: Cause | None = None
    evidence: tuple[Say, ...] = ()
    step: Say | None = None             # the one next step


# -- why: one cause, its evidence, one next step ----------------------------------------------------
_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([A-Za-z0-9./_-]+)")
_PLACEMENT = re.compile(r"(\d+) node\(s\) (didn't match Pod's node affinity/selector|didn't match node selector|"
                        r"had untolerated taint[^,.]*|had taint[^,.]*|didn't match pod (?:anti-)?affinity rules)")
_CORDONED = re.compile(r"(\d+) node\(s\) were unschedulable")
_UNBOUND = re.compile(r"unbound immediate PersistentVolumeClaims|pod has unbound")
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
ATTACH_REASONS = ("FailedAttachVolume", "FailedMount")


def diagnose(s: Stuck, detail: Detail) -> Verdict:
    """Exactly one cause, its evidence and one next step; or the cause unknown (wording lists what was checked).
    The rule: the first of the group's RULES whose facts hold (docs/vm-stuck-report.md, The causes). First, what
    another function speaks for (docs/vm-stuck-report.md, Who speaks for what)."""
    node = detail.node
    if node is not None and node.found and node.ready != "True":
        # the VMs of a node that stopped answering are evacuation-report's: what Harvester and KubeVirt will do with
        # them and when, and what blocks them (docs/evacuation-report.md, who speaks for what)
        return Verdict(Action.DEFER, say("node-down", node=node.name, ready=node.ready), s)
    source = detail.source_node
    if s.group == "migrating" and source is not None and source.draining:
        return Verdict(Action.DEFER, say("node-emptied", node=source.name, why=source.draining), s)
    if s.group in ("starting", "migrating") and detail.device_conflict:
        # a start blocked by a device another VM holds is device-conflict's finding
        return Verdict(Action.DEFER, say("device-conflict", summary=detail.device_conflict), s)
    for rule, _ in _RULES[s.group]:
        found = rule(s, detail)
        if found is not None:
            return found
    return _unknown(s, detail)


def _report(s: Stuck, cause: Cause, evidence: list[Say], step: Say) -> Verdict:
    return Verdict(Action.REPORT, say("reported", stuck=s, cause=cause), s, cause, tuple(evidence), step)


def _queued(s: Stuck, d: Detail) -> Verdict | None:
    """A migration KubeVirt keeps Pending because its limits are in use is queued, not stuck: draining a node, or
    Harvester's maintenance mode, keeps the tail of the queue Pending for long (docs/facts.md §7). It is not
    reported; its finding, if one was open, ends. Only a limit of 0 holds it for ever: that is reported, as queued,
    with the numbers. KubeVirt counts before it creates the target pod, so a queue full now comes before any older
    refusal of one."""
    q = d.queue
    if q is None or d.pod is not None or not q.full:
        return None
    if not q.held:
        return Verdict(Action.SETTLED, say("queued", queue=q), s)
    return _report(s, Cause.MIGRATION_QUEUED, [say("queue", queue=q)], say("raise-migration-limits", queue=q))


def _datavolume(s: Stuck, d: Detail) -> Verdict | None:
    """The VM's DataVolume does not get ready: its import (clone, upload) fails, as CDI's Running condition says,
    or it is still under way; KubeVirt creates no VMI meanwhile (vm.go handleDataVolumes). A DataVolume whose claim
    is not bound is the claim's story (volume-unbound)."""
    bad = [dv for dv in d.datavolumes if dv.error]
    busy = [dv for dv in d.datavolumes if dv.provisioning and dv.bound is not None and dv.bound[0] == "True"]
    found = bad or (busy if s.state in DV_STATES else [])
    if not found:
        return None
    dv = found[0]
    return _report(s, Cause.VOLUME_IMPORT, [say("datavolume", dv=dv)],
                   say("check-import", namespace=s.namespace, vm=s.vm, dv=dv.name, failing=dv.error))


def _crash_loop(s: Stuck, d: Detail) -> Verdict | None:
    """KubeVirt counted failed starts in a row (status.startFailure): each VMI failed before it ever ran."""
    failures = d.start_failures
    if failures is None:
        return None
    evidence = [say("start-failures", failures=failures)]
    if d.pod is not None:
        evidence += [say("ended", pod=d.pod.name, ended=e) for e in d.pod.ended]
    return _report(s, Cause.CRASH_LOOP, evidence, say("read-why-it-fails", namespace=s.namespace, vm=s.vm,
                                                       pod=d.pod.name if d.pod is not None else ""))


def _volume_missing(s: Stuck, d: Detail) -> Verdict | None:
    made = {dv.name for dv in d.datavolumes if dv.found}  # CDI creates a DataVolume's claim: not missing
    missing = [v for v in d.volumes if not v.found and not (v.datavolume and v.claim in made)]
    if not missing:
        return None
    v = missing[0]
    evidence = [say("claim-missing", volume=v.volume, claim=v.claim)]
    evidence += [say("kubevirt-event", event=e) for e in d.kubevirt_events if e.reason == "FailedPvcNotFound"]
    return _report(s, Cause.VOLUME_MISSING, evidence,
                   say("create-claim", namespace=s.namespace, vm=s.vm, volume=v.volume, claim=v.claim))


def _quota(s: Stuck, d: Detail) -> Verdict | None:
    """A ResourceQuota refused the (target) pod. Its refusal names the quota and the resources it exceeds, with
    the numbers the admission counted (KubeVirt's FailedCreate on the VMI for a start or a migration; the VMI's
    Synchronized condition for a start); else the quotas' status says which one has no room (docs/facts.md §7)."""
    refusals = [(e, r) for e in d.kubevirt_events if e.reason == "FailedCreate" for r in [refusal(e.message)] if r]
    synced = d.synchronized if d.synchronized and d.synchronized[:2] == ("False", "FailedCreate") else None
    said = refusal(synced[2]) if synced else None
    if not refusals and said is None and not d.quotas:
        return None
    evidence = [say("kubevirt-event", event=refusals[-1][0])] if refusals else \
        [say("synchronized", vmi=s.vm, condition=synced)] if said else []
    refused = refusals[-1][1] if refusals else said
    if refused is not None and refused.limited:
        evidence += [say("refused", refusal=refused, resource=r, looked_for=d.pod_looked_for)
                     for r in sorted(refused.limited)]
    else:
        evidence += [say("quota", quota=q, looked_for=d.pod_looked_for) for q in d.quotas]
    name = refused.quota if refused is not None else d.quotas[0].name if d.quotas else ""
    if refused is not None and refused.unspecified:
        return _report(s, Cause.QUOTA, evidence, say("set-limits", namespace=s.namespace, vm=s.vm, quota=name,
                                                     unspecified=refused.unspecified))
    return _report(s, Cause.QUOTA, evidence, say("raise-quota", namespace=s.namespace, quota=name,
                                                 migrating=s.group == "migrating"))


def _scheduling(s: Stuck, d: Detail) -> Verdict | None:
    pod = d.pod
    if pod is None or pod.scheduled is None or pod.scheduled[0] != "False":
        return None
    message = pod.scheduled[2] or next((e.message for e in pod.events if e.reason == "FailedScheduling"), "")
    failed = [e for e in pod.events if e.reason == "FailedScheduling"]
    evidence = [say("pod-scheduled", pod=pod.name, status=pod.scheduled[0], reason=pod.scheduled[1],
                    message=message)]
    if failed:
        evidence.append(say("event", event=failed[-1]))
    reasons: list[tuple[int, int, str, str]] = []  # (nodes, order, kind, detail)
    for count, resource in _INSUFFICIENT.findall(message):
        reasons.append((int(count), 0, "insufficient", resource.rstrip(".")))
    for count, why in _PLACEMENT.findall(message):
        reasons.append((int(count), 1, "placement", why))
    for count in _CORDONED.findall(message):
        reasons.append((int(count), 2, "cordoned", ""))
    if _UNBOUND.search(message):
        return _volume_unbound(s, d, evidence) or _report(s, Cause.VOLUME_UNBOUND, evidence,
                                                          say("bind-claims", namespace=s.namespace))
    if not reasons:
        return None  # the scheduler said something we cannot read: unknown, with its message among the checks
    _, _, kind, detail = max(reasons, key=lambda r: (r[0], -r[1]))
    if kind == "insufficient":
        return _insufficient(s, d, detail, evidence)
    if kind == "placement":
        return _report(s, Cause.PLACEMENT, evidence, say("relax-placement", namespace=s.namespace, vm=s.vm))
    return _report(s, Cause.NODE_UNSCHEDULABLE, evidence, say("uncordon", nodes=d.cordoned))


def _insufficient(s: Stuck, d: Detail, resource: str, evidence: list[Say]) -> Verdict:
    having = d.nodes_with.get(resource)
    if resource in d.device_resources and having is not None and len(having) == 1:
        evidence.append(say("only-node-has", node=having[0], total=d.nodes_total, resource=resource))
        return _report(s, Cause.DEVICE_ON_ONE_NODE, evidence,
                       say("free-device", namespace=s.namespace, vm=s.vm, node=having[0], resource=resource))
    if resource in d.device_resources and having is not None and not having:
        evidence.append(say("no-node-has", resource=resource))
    device = resource in d.device_resources or "/" in resource
    return _report(s, Cause.INSUFFICIENT, evidence, say("free-resource", namespace=s.namespace, vm=s.vm,
                                                         resource=resource, device=device))


def _volume_unbound(s: Stuck, d: Detail, evidence: list[Say] | None = None) -> Verdict | None:
    pending = [v for v in d.volumes if v.found and v.phase and v.phase != "Bound"]
    if not pending:
        return None
    v = pending[0]
    out = list(evidence or ())
    out.append(say("claim-pending", volume=v))
    if v.storage_class and v.class_found is False:
        out.append(say("class-missing", name=v.storage_class))
        step = say("create-class", volume=v)
    elif v.storage_class:
        out.append(say("class", volume=v))
        step = say("check-provisioner", namespace=s.namespace, volume=v)
    else:
        step = say("give-class", namespace=s.namespace, volume=v)
    return _report(s, Cause.VOLUME_UNBOUND, out, step)


def _attach(s: Stuck, d: Detail) -> Verdict | None:
    pod = d.pod
    failed = [e for e in (pod.events if pod else ()) if e.reason in ATTACH_REASONS]
    if not failed:
        return None
    evidence = [say("event", event=failed[-1])]
    longhorn = [v for v in d.volumes if v.longhorn]
    evidence += [say("longhorn", volume=v) for v in longhorn]
    bad = next((v for v in longhorn if v.longhorn_robustness == "faulted"), None)
    if bad is not None:
        step = say("salvage", volume=bad.longhorn, longhorn=d.longhorn_namespace)
    elif longhorn:
        step = say("longhorn-attach", volume=longhorn[0].longhorn, node=pod.node if pod else "",
                   longhorn=d.longhorn_namespace)
    else:
        step = say("csi-attach", namespace=s.namespace, pod=pod.name if pod else "")
    return _report(s, Cause.VOLUME_ATTACH, evidence, step)


def _image(s: Stuck, d: Detail) -> Verdict | None:
    """An image the kubelet cannot pull, as KubeVirt sees it: a container of the pod (an init container's first:
    a containerDisk's image is pulled in `volume<name>-init`) waits in ErrImagePull or ImagePullBackOff, which the
    VMI controller copies to the VMI's Synchronized condition (checkForContainerImageError, docs/facts.md §7)."""
    pod = d.pod
    waiting = [w for w in (pod.waiting if pod else ()) if w.reason in IMAGE_PULL_REASONS]
    synced = d.synchronized if d.synchronized and d.synchronized[0] == "False" \
        and d.synchronized[1] in IMAGE_PULL_REASONS else None
    if not waiting and synced is None:
        return None
    evidence = [say("synchronized", vmi=s.vm, condition=synced)] if synced else []
    if pod is not None and waiting:
        evidence.append(say("waiting", pod=pod.name, waiting=waiting[0]))
    pulls = [e for e in (pod.events if pod else ()) if e.component in ("kubelet", "") and
             (e.reason == "BackOff" and e.message.startswith("Back-off pulling image")
              or e.reason == "Failed" and e.message.startswith("Failed to pull image"))]
    evidence += [say("event", event=e) for e in _latest_by_reason(pulls)]
    first = waiting[0] if waiting else None
    image = first.image if first else ""
    volume = _disk_volume(first.container, d.container_disks) if first else ""
    if not image and len(d.container_disks) == 1:  # KubeVirt's condition alone: the VM's one containerDisk
        volume, image = next(iter(d.container_disks.items()))
    return _report(s, Cause.IMAGE_PULL, evidence,
                   say("fix-image", namespace=s.namespace, vm=s.vm, image=image or d.container_disks.get(volume, ""),
                       volume=volume, node=pod.node if pod else ""))


def _disk_volume(container: str, disks: Mapping[str, str]) -> str:
    """The VM's containerDisk volume a launcher container serves: KubeVirt names it `volume<name>` and pulls its
    image in `volume<name>-init` (pkg/container-disk/container-disk.go toContainerName)."""
    name = container.removesuffix("-init").removeprefix("volume")
    return name if container.startswith("volume") and name in disks else ""


def _latest_by_reason(events: list[EventFact]) -> list[EventFact]:
    """The newest Event of each reason, in the order they last happened (the list is oldest first)."""
    latest = {e.reason: e for e in events}
    return [e for e in events if latest[e.reason] is e]


Rule = Callable[[Stuck, Detail], "Verdict | None"]
_START: tuple[tuple[Rule, tuple[Cause, ...]], ...] = (
    (_datavolume, (Cause.VOLUME_IMPORT,)),
    (_volume_missing, (Cause.VOLUME_MISSING,)),
    (_quota, (Cause.QUOTA,)),
    # the scheduler's message: the reason that names the most nodes
    (_scheduling, (Cause.INSUFFICIENT, Cause.DEVICE_ON_ONE_NODE, Cause.PLACEMENT, Cause.NODE_UNSCHEDULABLE,
                   Cause.VOLUME_UNBOUND)),
    (_volume_unbound, (Cause.VOLUME_UNBOUND,)),
    (_attach, (Cause.VOLUME_ATTACH,)),
    (_image, (Cause.IMAGE_PULL,)),
    (_crash_loop, (Cause.CRASH_LOOP,)),
)
# For each group, the rules in the order they are tried: the first whose facts hold names the cause. A stop has
# none: a stop not honoured is one whose node stopped answering, and evacuation-report speaks for those (diagnose);
# any other is unknown, with what was checked. A migration that does not start is first looked up in KubeVirt's
# queue (queued: not stuck, or held by a limit of 0), then explained as a start of its target pod.
_RULES: dict[str, tuple[tuple[Rule, tuple[Cause, ...]], ...]] = {
    "starting": _START,
    "migrating": ((_queued, (Cause.MIGRATION_QUEUED,)), *_START),
    "stopping": (),
    "terminating": (),
}
RULES: dict[str, tuple[Cause, ...]] = {group: tuple(c for _, causes in rules for c in causes)
                                       for group, rules in _RULES.items()}


def _unknown(s: Stuck, d: Detail | None = None) -> Verdict:
    pod = d.pod.name if d is not None and d.pod is not None else ""
    return Verdict(Action.REPORT, say("reported", stuck=s, cause=Cause.UNKNOWN), s, Cause.UNKNOWN, (),
                   say("look", namespace=s.namespace, vm=s.vm, pod=pod))

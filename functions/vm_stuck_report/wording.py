"""What people read about a stuck VM: the reasons in the log, the Event's sentence, the finding (its report: cause,
evidence, next step, what was checked) and the end of an episode. decide.py says what to tell as `Say` values; each
kind is worded here, and nowhere else."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from functions.vm_stuck_report.decide import Say, Verdict
from functions.vm_stuck_report.facts import Detail, NodeFacts, Stuck
from shared import kubevirt as kv
from shared.finding import Finding
from shared.ledger import Record

FUNCTION = "vm-stuck-report"


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes < 120 else f"{minutes // 60}h{minutes % 60:02d}m"


def state_words(s: Stuck) -> str:
    if s.migration:
        return f"migration {s.migration} {s.state.removeprefix('Migration')}"
    return s.state


# -- the reason (the log line; a resolution's `because`) -------------------------------------------------
def _since_words(s: Stuck, over: bool) -> str:
    what = f"the migration is {s.state.removeprefix('Migration')}" if s.migration else f"the VM is {s.state}"
    if over:
        return f"{what} since {stamp(s.since)}, over {duration(s.threshold)}"
    return f"{what} since {stamp(s.since)}" if s.migration else \
        f"{what} since {stamp(s.since)}, not yet {duration(s.threshold)}"


_REASONS: dict[str, Callable[..., str]] = {
    "vm-gone": lambda: "the VM no longer exists",
    "migration-gone": lambda: "the migration no longer exists",
    "out-of-scope": lambda: "the VM's namespace is out of scope (VM_STUCK_NAMESPACES)",
    "opted-out": lambda annotation: f"the VM opted out ({annotation})",
    "not-stuck": lambda state: f"the VM is {state or 'without a status'}",
    "status-behind": lambda state: f"the VM reads {state}, but its VMI is Running: the VM's status is behind",
    "untimed": lambda state: (f"the VM is {state}, and nothing records since when (no live VMI, or a stop not "
                              f"yet requested)"),
    "not-yet": lambda stuck: _since_words(stuck, over=False),
    "past": lambda stuck: _since_words(stuck, over=True),
    "migration-phase": lambda phase: f"the migration is {phase}" + (": migration-report explains it"
                                                                     if phase == "Failed" else ""),
    "migration-vmi-gone": lambda: "the VMI to migrate is gone or has ended",
    "migration-untimed": lambda: "the migration has no creation time",
    "device-conflict": lambda summary: f"device-conflict reports it: {summary}",
    "queued": lambda queue: f"the migration is queued, not stuck: {_queue(queue)}",
    "reported": lambda stuck, cause: (f"{state_words(stuck)} since {stamp(stuck.since)}: "
                                      + ("cause unknown" if cause.value == "unknown" else cause.value)),
}


def reason(verdict: Verdict) -> str:
    return said(verdict.why)


def said(why: Say) -> str:
    """A reason on its own (one the handler gives without a verdict)."""
    return _word(_REASONS, why)


REDELIVERED = "a redelivered event"


# -- the evidence ------------------------------------------------------------------------------------
def node_words(node: NodeFacts) -> str:
    if not node.found:
        return f"node {node.name} does not exist"
    ready = f"Ready={node.ready or 'unknown'}" + (f" ({node.ready_reason})" if node.ready_reason else "") \
        + (f" since {node.ready_since}" if node.ready_since else "")
    return f"node {node.name}: {ready}" + (", cordoned (unschedulable)" if node.unschedulable else "") \
        + (f", taints {', '.join(node.taints)}" if node.taints else "")


def _queue(q: Any) -> str:
    where = f"the KubeVirt CR {q.kubevirt}" if q.kubevirt else "KubeVirt's defaults"
    return (f"{q.running} migration(s) running of parallelMigrationsPerCluster {q.cluster_limit}, {q.outbound} out "
            f"of node {q.node or '?'} of parallelOutboundMigrationsPerNode {q.node_limit} ({where})")


def _raise_migration_limits(queue: Any) -> str:
    namespace, _, name = queue.kubevirt.partition("/")
    command = f"`kubectl -n {namespace} edit kubevirt {name}`" if queue.kubevirt else "`kubectl get kubevirt -A`"
    return (f"KubeVirt runs no migration while a limit is 0: raise spec.configuration.migrations."
            f"{'parallelMigrationsPerCluster' if queue.cluster_limit == 0 else 'parallelOutboundMigrationsPerNode'} "
            f"({command}); the queued migrations then start in turn.")


def _condition(name: str, condition: tuple[str, str, str] | None) -> str:
    if condition is None:
        return ""
    status, why, message = condition
    return f", {name}={status}" + (f" ({why})" if why else "") + (f": {message}" if message else "")


def datavolume_words(dv: Any) -> str:
    if not dv.found:
        return f"DataVolume {dv.name} does not exist"
    progress = f" {dv.progress}" if dv.progress and dv.progress != "N/A" else ""
    return (f"DataVolume {dv.name}: phase {dv.phase or 'unknown'}{progress}" + _condition("Running", dv.running)
            + (_condition("Bound", dv.bound) if dv.bound and dv.bound[0] != "True" else "")
            + (f", {dv.restarts} restart(s)" if dv.restarts else "") + (f", created {stamp(dv.created)}"
                                                                        if dv.created else ""))


def _start_failures(failures: Any) -> str:
    after = f", the next try after {stamp(failures.retry_after)}" if failures.retry_after else ""
    last = f" (the last, VMI {failures.last_vmi})" if failures.last_vmi else ""
    return (f"KubeVirt counted {failures.count} start(s) in a row that failed before the VM ran{last}{after} "
            f"(status.startFailure)")


def _ended(pod: str, ended: Any) -> str:
    code = f" (exit code {ended.exit_code})" if ended.exit_code is not None else ""
    return f"pod {pod}: container {ended.container} ended: {ended.reason}{code}" + (
        f": {ended.message}" if ended.message else "")


def _finalizers(deleting: bool, finalizers: tuple[str, ...]) -> str:
    if deleting:
        return (f"the VMI was asked to stop (deletionTimestamp set) and still has the finalizers "
                f"{', '.join(finalizers)}")
    return f"the VMI still has the finalizers {', '.join(finalizers)}"


def _claim_pending(volume: Any) -> str:
    return f"PVC {volume.claim} is {volume.phase}" + (f", StorageClass {volume.storage_class}" if volume.storage_class
                                                      else ", with no StorageClass")


_EVIDENCE: dict[str, Callable[..., str]] = {
    "kubevirt-event": lambda event: f"{event.on}: {event.reason}: {event.message}",
    "event": lambda event: f"{event.on}: {event.reason} ×{event.count}: {event.message}",
    "pod-scheduled": lambda pod, status, reason, message: f"pod {pod}: PodScheduled={status} ({reason}): {message}",
    "finalizers": _finalizers,
    "launcher-on": lambda pod, node: (f"its launcher pod {pod} is bound to node {node}, where no kubelet confirms it "
                                      f"stopped (the VMI was never handed over to a node)"),
    "node": node_words,
    "claim-missing": lambda volume, claim: f"volume {volume} names PVC {claim}, which does not exist",
    "quota": lambda quota, looked_for: (f"ResourceQuota {quota.name}: {quota.resource} used {quota.used} of "
                                        f"{quota.hard}, the {looked_for or 'launcher'} pod needs {quota.requested}"),
    "refused": lambda refusal, resource, looked_for: (
        f"ResourceQuota {refusal.quota}: {resource} used {refusal.used.get(resource, '?')} of "
        f"{refusal.limited[resource]}, the {looked_for or 'launcher'} pod asked "
        f"{refusal.requested.get(resource, '?')}"),
    "only-node-has": lambda node, total, resource: f"only node {node} of {total} has any {resource}",
    "no-node-has": lambda resource: f"no node has any {resource}",
    "claim-pending": _claim_pending,
    "class-missing": lambda name: f"StorageClass {name} does not exist",
    "class": lambda volume: (f"StorageClass {volume.storage_class}: provisioner {volume.provisioner or 'unknown'}"
                             + (f", volumeBindingMode {volume.binding_mode}" if volume.binding_mode else "")),
    "longhorn": lambda volume: (f"PVC {volume.claim} → Longhorn volume {volume.longhorn}: state "
                                f"{volume.longhorn_state or 'unknown'}, robustness "
                                f"{volume.longhorn_robustness or 'unknown'}"),
    "queue": lambda queue: f"KubeVirt's migration queue: {_queue(queue)}",
    "datavolume": lambda dv: datavolume_words(dv),
    "start-failures": lambda failures: _start_failures(failures),
    "ended": _ended,
    "waiting": lambda pod, waiting: (
        f"pod {pod}: {'init container' if waiting.init else 'container'} {waiting.container}"
        + (f" (image {waiting.image})" if waiting.image else "") + f" waits: {waiting.reason}"
        + (f": {waiting.message}" if waiting.message else "")),
    "synchronized": lambda vmi, condition: (
        f"VirtualMachineInstance/{vmi}: Synchronized={condition[0]} ({condition[1]})"
        + (f": {condition[2]}" if condition[2] else "")),
}


def evidence(verdict: Verdict) -> list[str]:
    return [_word(_EVIDENCE, e) for e in verdict.evidence]


# -- the next step: each names a command to run as printed -------------------------------------------------
def _bring_back_or_delete_node(node: str) -> str:
    return (f"Bring node {node} back (`kubectl describe node {node}` says why it is not Ready); virt-handler there "
            f"completes the stop. If the node is gone for good, power it off for certain and then delete its Node "
            f"object (`kubectl delete node {node}`): KubeVirt then fails the VMI and the stop completes. Do not remove "
            f"the finalizers by hand while the guest may still run there.")


def _create_claim(namespace: str, vm: str, volume: str, claim: str) -> str:
    return (f"Create PVC {claim} in namespace {namespace} (or restore it), or point volume {volume} at a PVC that "
            f"exists (`kubectl -n {namespace} edit vm {vm}`); KubeVirt starts the VM once it appears.")


def _raise_quota(namespace: str, quota: str, migrating: bool) -> str:
    pod, what = ("target", "migrate") if migrating else ("launcher", "start")
    which = (f"Raise ResourceQuota {quota} (`kubectl -n {namespace} edit resourcequota {quota}`)" if quota else
             f"Raise the ResourceQuota that has no room (`kubectl -n {namespace} describe resourcequota` lists them)")
    return (f"{which} or free room in namespace {namespace}: the {pod} pod must fit beside the pods already counted"
            + (" (a migration briefly needs the VM's resources twice)" if migrating else "")
            + f", then KubeVirt retries and the VM can {what}.")


def _set_limits(namespace: str, vm: str, quota: str, unspecified: str) -> str:
    return (f"ResourceQuota {quota} admits only pods that specify {unspecified}: give the VM limits "
            f"(`kubectl -n {namespace} edit vm {vm}`, spec.template.spec.domain.resources.limits), or a LimitRange "
            f"default (`kubectl -n {namespace} get limitrange`); then KubeVirt retries.")


def _uncordon(nodes: tuple[str, ...]) -> str:
    command = f"`kubectl uncordon {' '.join(nodes)}`" if nodes else "`kubectl get nodes` shows them SchedulingDisabled"
    return (f"The nodes that would fit are cordoned (maintenance or a drain): uncordon them once it is over "
            f"({command}), or add capacity; the scheduler retries by itself.")


def _free_resource(namespace: str, vm: str, resource: str, device: bool) -> str:
    what = "device" if device else resource
    return (f"No node has the {what} the VM requests free ({resource}): free it on a node (stop or move another VM; "
            f"`kubectl describe nodes` shows what each has allocated), lower the VM's request "
            f"(`kubectl -n {namespace} edit vm {vm}`), or add a node with more; the scheduler retries by itself.")


def _free_device(namespace: str, vm: str, node: str, resource: str) -> str:
    return (f"Only node {node} has {resource}: free it there (`kubectl get vmi -A -o wide` lists the VMs on {node}; "
            f"stop the one holding it), or give this VM another device type (`kubectl -n {namespace} edit vm {vm}`); "
            f"the VM can run nowhere else.")


def _look(namespace: str, vm: str, pod: str) -> str:
    pods = f", `kubectl -n {namespace} describe pod {pod}`" if pod else ""
    return (f"The cause is not among the facts checked: read `kubectl -n {namespace} describe vm {vm}`, "
            f"`kubectl -n {namespace} describe vmi {vm}`{pods}, and virt-controller's and virt-handler's logs.")


def _fix_image(namespace: str, vm: str, image: str, volume: str, node: str) -> str:
    what = (f"image {image}" if image else "the VM's image") + (f" (containerDisk volume {volume})" if volume else "")
    where = f"node {node}" if node else "its node"
    return (f"The kubelet cannot pull {what}: correct its name or tag in the VM (`kubectl -n {namespace} edit vm "
            f"{vm}`), make the registry reachable from {where}, or give the VM an imagePullSecret; the kubelet "
            f"retries by itself.")


STEPS: dict[str, Callable[..., str]] = {
    "bring-back-or-delete-node": _bring_back_or_delete_node,
    "create-claim": _create_claim,
    "raise-quota": _raise_quota,
    "set-limits": _set_limits,
    "bind-claims": lambda namespace: (
        f"Bind the VM's PVCs: `kubectl -n {namespace} get pvc` shows which is Pending; check its StorageClass and "
        f"provisioner."),
    "relax-placement": lambda namespace, vm: (
        f"No node matches the VM's placement: relax its nodeSelector or affinity, or add a toleration for the nodes' "
        f"taints (`kubectl -n {namespace} edit vm {vm}`, spec.template.spec); or label or untaint a node that should "
        f"run it (`kubectl get nodes --show-labels`)."),
    "uncordon": _uncordon,
    "free-device": _free_device,
    "free-resource": _free_resource,
    "create-class": lambda volume: (
        f"Create StorageClass {volume.storage_class}, or recreate PVC {volume.claim} with a StorageClass that exists "
        f"(`kubectl get storageclass`)."),
    "check-provisioner": lambda namespace, volume: (
        f"Check provisioner {volume.provisioner or 'of ' + volume.storage_class} (its pods, and its Events on PVC "
        f"{volume.claim}: `kubectl -n {namespace} describe pvc {volume.claim}`): it has not provisioned a volume."),
    "give-class": lambda namespace, volume: (
        f"PVC {volume.claim} names no StorageClass and no PersistentVolume binds it (`kubectl -n {namespace} describe "
        f"pvc {volume.claim}`): recreate it with a StorageClass that exists (`kubectl get storageclass`), or create a "
        f"PersistentVolume it can bind to."),
    "salvage": lambda volume, longhorn: (
        f"Longhorn volume {volume} is faulted (no healthy replica: `kubectl -n {longhorn} get volumes.longhorn.io "
        f"{volume}`): salvage it in the Longhorn UI (Volume → Salvage) or restore it from a backup, then the attach "
        f"succeeds."),
    "longhorn-attach": lambda volume, node, longhorn: (
        f"See why Longhorn cannot attach {volume} to node {node or 'the pod’s node'}: `kubectl -n {longhorn} "
        f"describe volumes.longhorn.io {volume}`, its replicas and engine in the Longhorn UI, and longhorn-manager's "
        f"log on that node."),
    "csi-attach": lambda namespace, pod: (
        f"See why the CSI driver cannot attach or mount the volume: `kubectl -n {namespace} describe pod {pod}` and "
        f"`kubectl get volumeattachments` show its error; then the driver's node plugin log on the pod's node."),
    "fix-image": _fix_image,
    "bring-back-node": lambda namespace, vm, node: (
        f"Bring node {node} back (`kubectl describe node {node}`: its kubelet and virt-handler), or restart the VM so "
        f"that it is placed on a Ready node (`virtctl -n {namespace} restart {vm}`)."),
    "look": _look,
    "raise-migration-limits": _raise_migration_limits,
    "check-import": lambda namespace, vm, dv, failing: (
        (f"CDI cannot import DataVolume {dv}: read why (`kubectl -n {namespace} describe datavolume {dv}`, and its "
         f"importer pod's log), then fix its source in the VM (`kubectl -n {namespace} edit vm {vm}`, "
         f"spec.dataVolumeTemplates) or the source's reachability; CDI retries by itself.") if failing else
        (f"DataVolume {dv} is still importing: follow it (`kubectl -n {namespace} get datavolume {dv} -w`); a large "
         f"image from a slow source takes long, and KubeVirt starts the VM once it is done.")),
    "read-why-it-fails": lambda namespace, vm, pod: (
        f"Every start fails before the guest runs: read why (`kubectl -n {namespace} describe vmi {vm}`"
        + (f", `kubectl -n {namespace} logs {pod} -c compute`" if pod else "") + "), fix the VM "
        f"(`kubectl -n {namespace} edit vm {vm}`); KubeVirt tries again after its back-off, at most every 5 minutes."),
}


def next_step(verdict: Verdict) -> str:
    return _word(STEPS, verdict.step) if verdict.step is not None else ""


# -- what was checked ----------------------------------------------------------------------------------
def checked(detail: Detail | None) -> list[str]:
    """What was looked at, in words: an unknown cause says it, and every report lists it."""
    if detail is None:
        return []
    out = []
    pod = detail.pod
    if pod is None:
        out.append(f"no {detail.pod_looked_for or 'launcher'} pod exists")
    else:
        sched = f"PodScheduled={pod.scheduled[0]}" + (f" ({pod.scheduled[1]}: {pod.scheduled[2]})"
                                                        if pod.scheduled[0] != "True" else "") \
            if pod.scheduled else "no PodScheduled condition"
        waiting = "; ".join(f"{'init container ' if w.init else ''}{w.container} waiting {w.reason}"
                            for w in pod.waiting) or "no container waiting on an error"
        reasons = sorted({e.reason for e in pod.events}) or ["none"]
        out.append(f"{detail.pod_looked_for or 'launcher'} pod {pod.name}: phase {pod.phase or 'unknown'}, {sched}, "
                   f"{waiting}, its Events: {', '.join(reasons)}")
    for v in detail.volumes:
        out.append(f"PVC {v.claim}: " + ("not found" if not v.found else f"{v.phase or 'no phase'}"
                                         + (f", Longhorn {v.longhorn} {v.longhorn_state}/{v.longhorn_robustness}"
                                            if v.longhorn else "")))
    if detail.synchronized is not None:
        status, why, _ = detail.synchronized
        out.append(f"the VMI's Synchronized={status}" + (f" ({why})" if why else ""))
    if detail.node is not None:
        out.append(node_words(detail.node))
    out.append("ResourceQuotas: " + (", ".join(q.name for q in detail.quotas) or "none exceeded"))
    if detail.queue is not None:
        out.append(f"KubeVirt's migration queue: {_queue(detail.queue)}")
    out += [datavolume_words(dv) for dv in detail.datavolumes]
    if detail.start_failures is not None:
        out.append(_start_failures(detail.start_failures))
    kv_reasons = sorted({e.reason for e in detail.kubevirt_events}) or ["none"]
    out.append(f"KubeVirt's Events on the VM, VMI and migration: {', '.join(kv_reasons)}")
    return out


# -- the finding ---------------------------------------------------------------------------------------
def _vm_name(vm: Mapping) -> str:
    meta = kv.meta(vm)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def event_message(verdict: Verdict, vm: Mapping, migration: str | None, detail: Detail | None) -> str:
    """One sentence about the stuck VM, stable while its facts are: recording it again raises the count."""
    s = verdict.stuck
    assert s is not None
    what = f"migration {migration} is {s.state.removeprefix('Migration')}" if migration else f"is {s.state}"
    cause = verdict.cause.value if verdict.cause else "unknown"
    head = f"VM {_vm_name(vm)} {what} since {stamp(s.since)}"
    if cause == "unknown":
        return f"{head}; the cause is unknown (checked: {'; '.join(checked(detail))}). {next_step(verdict)}"
    return f"{head}: {cause}: {'; '.join(evidence(verdict))}. Next: {next_step(verdict)}"


def report_data(verdict: Verdict, vm: Mapping, migration: str | None, detail: Detail | None) -> dict:
    """The report: one cause, its evidence and one next step (or unknown, and what was checked)."""
    s = verdict.stuck
    assert s is not None
    return {"vm": _vm_name(vm), "state": s.state, "group": s.group, "since": stamp(s.since),
            "threshold": int(s.threshold.total_seconds()), "migration": migration, "instance": s.instance,
            "cause": verdict.cause.value if verdict.cause else "unknown", "evidence": evidence(verdict),
            "nextStep": next_step(verdict), "checked": checked(detail)}


def finding(verdict: Verdict, vm: Mapping, migration: str | None, detail: Detail | None) -> Finding:
    """A stuck episode as a finding (docs/findings.md): its identity is the state group and the instance that is
    stuck (the VMIM's uid, else the VMI's, else the VM's); the cause may change while it lasts, the identity
    does not."""
    s = verdict.stuck
    assert s is not None
    meta = kv.meta(vm)
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    message = event_message(verdict, vm, migration, detail)
    return Finding(FUNCTION, f"stuck-{s.group}", f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}",
                   s.instance, {"namespace": namespace, "vm": name, "state": s.group}, "warning", message,
                   (next_step(verdict),), report_data(verdict, vm, migration, detail))


# -- the end of an episode, and the re-scan ------------------------------------------------------------
def new_episode() -> str:
    return "a new episode began (another VMI or migration)"


def moved_on(s: Stuck) -> str:
    """The end of one group's episode when the same VM is found in another group (stuck starting, then stopping)."""
    return f"the VM is {state_words(s)} now"


def batch(notices: int) -> str:
    return f"{notices} notices about one VM"


def replaced(verdict: Verdict) -> str:
    return f"the VMI it was about is gone or was replaced ({reason(verdict)})"


def resolved_message(record: Record, because: str) -> str:
    d = record.finding.details
    what = f"migration {d.get('migration')}" if d.get("migration") else f"VM {d.get('vm')}"
    return f"{what} is no longer stuck ({d.get('state')} since {d.get('since')}): {because}."


def scanned_reason(scanned: Mapping[str, int], candidates: int, notices: int, renewed: int, progress: str) -> str:
    return (f"scanned {scanned['vms']} VM(s) and {scanned['migrations']} migration(s), {candidates} in a stuck state "
            f"or on record; {notices} notice(s), {renewed} renewed; {progress}")


def _word(table: Mapping[str, Callable[..., str]], said: Say) -> str:
    return table[said.kind](**said.values)

"""What people read about a stuck VM: the reasons in the log, the Event's sentence, the finding (its report: cause,
evidence, next step, what was checked) and the end of an episode. decide.py says what to tell as `Say` values; each
kind is worded here, and nowhere else."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from functions.vm_stuck_report.advice import next_step
from functions.vm_stuck_report.causes import Say, Verdict
from functions.vm_stuck_report.facts import Detail, NodeFacts, Stuck
from shared import kubevirt as kv
from shared.finding import Finding
from shared.ledger import Record

FUNCTION = "vm-stuck-report"


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(delta: timedelta) -> str:
    """A threshold as people read it: 45s, 10m, 1m30s, 2h05m (VM_STUCK_AFTER takes seconds: under a minute it
    read "0m", seen on the real node's lane with 2s)."""
    minutes, seconds = divmod(int(delta.total_seconds()), 60)
    if minutes >= 120:
        return f"{minutes // 60}h{minutes % 60:02d}m"
    if not minutes:
        return f"{seconds}s"
    return f"{minutes}m{seconds:02d}s" if seconds else f"{minutes}m"


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
    "evacuation": lambda node: f"an evacuation of node {node}: evacuation-report speaks for it",
    "node-down": lambda node, ready: (f"node {node} is Ready={ready or 'unknown'}: evacuation-report speaks for the "
                                      f"VMs of a node that stopped answering"),
    "node-emptied": lambda node, why: (f"node {node} is being emptied ({'; '.join(why)}): evacuation-report speaks "
                                       f"for its migrations"),
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


def _claim_pending(volume: Any) -> str:
    return f"PVC {volume.claim} is {volume.phase}" + (f", StorageClass {volume.storage_class}" if volume.storage_class
                                                      else ", with no StorageClass")


_EVIDENCE: dict[str, Callable[..., str]] = {
    "kubevirt-event": lambda event: f"{event.on}: {event.reason}: {event.message}",
    "event": lambda event: f"{event.on}: {event.reason} ×{event.count}: {event.message}",
    "pod-scheduled": lambda pod, status, reason, message: f"pod {pod}: PodScheduled={status} ({reason}): {message}",
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

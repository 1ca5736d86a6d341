"""What KubeVirt did in one migration, from the objects it keeps: every number it used (with where it came from) and,
for a failure, its category and the evidence KubeVirt or the scheduler wrote for it. Pure, like decide.py, which
reports it; the arithmetic is shared/migrations.py's, and the words people read are wording.py's (an `Explained` says
which explanation a category rests on when KubeVirt wrote none).
"""
from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from shared import kubevirt as kv
from shared.migrations import (
    DataSize,
    PolicyMatch,
    data_size,
    effective_configuration,
    match_policy,
    read_failure_reason,
)

if TYPE_CHECKING:
    from functions.migration_report.decide import Facts

VMIM_KIND = "VirtualMachineInstanceMigration"


class Explained(enum.StrEnum):
    """Why a failure is in its category when no words of KubeVirt's say it (wording.py's sentence for each)."""

    ABORT_REQUESTED = "abort-requested"        # the VMIM was deleted or AbortRequested
    JOB_CANCELLED = "job-cancelled"            # libvirt's job was cancelled: an abort was requested
    RAN_OUT = "ran-out"                        # it ran its whole completion budget
    PROGRESS_TIMEOUT = "progress-timeout"      # aborted before the budget ran out: the progress timeout
    UNSCHEDULABLE = "unschedulable"            # the target pod stayed unschedulable (no scheduler message read)
    VMI_STOPPED = "vmi-stopped"                # the VMI stopped or was deleted while it migrated
    NO_REASON = "no-reason"                    # KubeVirt recorded nothing that explains it


def finished_at(vmim: dict) -> datetime | None:
    phase = kv.phase(vmim)
    return kv.phase_since(vmim, phase) or kv.parse_time(migration_state(vmim, None).get("endTimestamp"))


def migration_state(vmim: dict, vmi: dict | None) -> dict:
    """The VMI's migrationState if it is this migration's, overlaid by the VMIM's copy (written once final,
    pkg/virt-controller/watch/migration/migration.go): the VMIM's survives the next migration. Up to v1.5 the
    copy is whatever the VMI holds, another migration's too (a VMIM that failed before its hand-off gets the
    previous migration's state; fixed in v1.6.0, commit ada65cb7d9): a copy of another migration is no fact
    about this one."""
    uid = kv.meta(vmim).get("uid")
    vmi_state = ((vmi or {}).get("status") or {}).get("migrationState") or {}
    if vmi_state.get("migrationUid") != uid:
        vmi_state = {}
    copy = (vmim.get("status") or {}).get("migrationState") or {}
    if copy.get("migrationUid") not in (None, uid):
        copy = {}
    return {**vmi_state, **copy}


def analyse(facts: Facts) -> tuple[dict[str, Any], Explained | None]:
    """Every number KubeVirt used for this migration, with where it came from, and the failure's category: the
    report (its `detail` KubeVirt's or the scheduler's own words, None when there are none), and what explains the
    category when KubeVirt wrote nothing."""
    vmim, vmi = facts.vmim, facts.vmi
    meta = kv.meta(vmim)
    state = migration_state(vmim, vmi)
    version_text = ((facts.kubevirt or {}).get("status") or {}).get("observedKubeVirtVersion")
    version = kv.parse_version(version_text)
    match = _policy(facts, state)
    cluster = (((facts.kubevirt or {}).get("spec") or {}).get("configuration") or {}).get("migrations") or {}
    config = effective_configuration(match.policy, cluster, version, state.get("migrationConfiguration"))
    sized = vmi if vmi is not None else _vm_as_vmi(facts.vm)
    size = data_size(sized) if sized is not None else None
    per_gib = int(config["completionTimeoutPerGiB"]["value"])
    budget = per_gib * size.gigabytes if size else None
    started, ended, took = _timing(vmim, state)
    failure, failure_source = _failure_reason(state, facts)
    report = {
        "migration": f"{meta.get('namespace')}/{meta.get('name')}", "uid": meta.get("uid"),
        "vmi": f"{meta.get('namespace')}/{(vmim.get('spec') or {}).get('vmiName')}",
        "vm": f"{meta.get('namespace')}/{kv.meta(facts.vm)['name']}" if facts.vm else None,
        "phase": kv.phase(vmim), "kubevirtVersion": version_text,
        "sourceNode": state.get("sourceNode"), "targetNode": state.get("targetNode"),
        "mode": state.get("mode"), "migrationMethod": ((vmi or {}).get("status") or {}).get("migrationMethod"),
        "failureReason": failure, "failureReasonSource": failure_source,
        "policy": {"name": (kv.meta(match.policy).get("name") if match.policy else match.name),
                   "how": match.how, "ties": list(match.ties)},
        "configuration": config,
        "dataSize": _size_dict(size),
        "timing": {"started": started and _stamp(started), "ended": ended and _stamp(ended), "tookSeconds": took},
        "budget": {"completionTimeoutPerGiB": per_gib, "completionTimeoutSeconds": budget,
                   "progressTimeoutSeconds": int(config["progressTimeout"]["value"]),
                   "usedRatio": round(took / budget, 3) if took is not None and budget else None},
        "kubevirtEvents": [{"object": e["involvedObject"].get("kind"), "reason": e.get("reason"),
                            "message": e.get("message")} for e in facts.events],
    }
    explained = None
    if kv.phase(vmim) == "Failed":
        report["category"], report["detail"], report["kubevirtSeconds"], explained = classify(report, facts, state)
    return report, explained


def _policy(facts: Facts, state: dict) -> PolicyMatch:
    recorded = state.get("migrationPolicyName")
    if recorded:
        policy = next((p for p in facts.policies if kv.meta(p).get("name") == recorded), None)
        return PolicyMatch(policy, "recorded" if policy else "recorded (deleted since)", name=recorded)
    if state.get("migrationConfiguration") is not None:
        return PolicyMatch(None, "none (KubeVirt recorded no policy)")
    labels = kv.meta(facts.vmi).get("labels") if facts.vmi else None
    ns_labels = kv.meta(facts.namespace).get("labels") if facts.namespace else None
    return match_policy(list(facts.policies), labels or None, ns_labels or {})


def _vm_as_vmi(vm: dict | None) -> dict | None:
    """No VMI left: the VM's template is what the VMI was made from."""
    template = ((vm or {}).get("spec") or {}).get("template")
    return {"spec": template.get("spec") or {}, "status": {}} if template else None


def _size_dict(size: DataSize | None) -> dict | None:
    """The data size; its `note` (what a BlockMigration's size leaves out) is wording.py's."""
    if size is None:
        return None
    return {"memory": size.memory, "from": size.source, "bytes": size.bytes, "gigabytes": size.gigabytes,
            "blockMigration": size.block_migration, "note": None}


def _timing(vmim: dict, state: dict) -> tuple[datetime | None, datetime | None, int | None]:
    started = kv.parse_time(state.get("startTimestamp")) or kv.phase_since(vmim, "Running")
    ended = kv.parse_time(state.get("endTimestamp")) or finished_at(vmim)
    took = int((ended - started).total_seconds()) if started and ended else None
    return started, ended, took


_MIGRATED = re.compile(r"migration uid (\S+) failed\. reason:\s*(.*)$", re.S)


def _failure_reason(state: dict, facts: Facts) -> tuple[str | None, str | None]:
    """migrationState.failureReason (KubeVirt ≥ 1.3), else the reason in KubeVirt's own Event on the VMI:
    "VirtualMachineInstance migration uid X failed. reason:<failureReason>" (every version)."""
    if state.get("failureReason"):
        return state["failureReason"], "migrationState.failureReason"
    uid = kv.meta(facts.vmim).get("uid")
    for event in facts.events:
        match = _MIGRATED.search(event.get("message") or "")
        if match and match.group(1) == uid and match.group(2).strip():
            return match.group(2).strip(), f"KubeVirt Event {event.get('reason')} on the VMI"
    return None, None


def _abort_requested(vmim: dict, state: dict) -> bool:
    conditions = (vmim.get("status") or {}).get("conditions") or ()
    return bool(state.get("abortRequested") or kv.meta(vmim).get("deletionTimestamp")
                or any(c.get("type") == "AbortRequested" and c.get("status") == "True" for c in conditions))


def classify(report: dict, facts: Facts, state: dict) -> tuple[str, str | None, int | None, Explained | None]:
    """(category, KubeVirt's or the scheduler's words for it or None, the seconds KubeVirt's own message names, what
    explains the category when no words do)."""
    text = report["failureReason"]
    took, budget = report["timing"]["tookSeconds"], report["budget"]["completionTimeoutSeconds"]
    if text:
        read = read_failure_reason(text)
        if read.category == "aborted-or-timeout":  # ≥ v1.9: one wording for both timeouts and an abort
            if _abort_requested(facts.vmim, state):
                return "aborted", None, None, Explained.ABORT_REQUESTED
            if took is not None and budget and took >= budget - 2:
                return "completion-timeout", None, None, Explained.RAN_OUT
            return "progress-stall", None, None, Explained.PROGRESS_TIMEOUT
        # Older virt-controllers write "target pod is down", newer ones "Target pod is down" (its migration
        # controller's failureReason): compare without case.
        target_down = "target pod is down" in text.lower()
        if read.category == "aborted" or target_down:
            if target_down:
                return "target-pod-removed", text, None, None
            return "aborted", None, None, Explained.JOB_CANCELLED
        detail = text if read.category == "libvirt-error" else text.strip()
        return read.category, detail, read.seconds, None
    messages = [(e.get("reason") or "", e.get("message") or "") for e in facts.events
                if (e.get("involvedObject") or {}).get("kind") == VMIM_KIND]
    if any(reason == "migrationTargetPodUnschedulable" for reason, _ in messages):
        scheduler = _scheduler_message(facts.events)
        return "target-unschedulable", scheduler, None, None if scheduler else Explained.UNSCHEDULABLE
    if any("vmi shutdown" in m or "vmi does not exist" in m for _, m in messages) or facts.vmi is None \
            or kv.phase(facts.vmi) in kv.FINAL_PHASES:
        return "vmi-shutdown", None, None, Explained.VMI_STOPPED
    if any("target pod" in m and ("removed" in m or "shutdown" in m) for _, m in messages):
        return "target-pod-removed", next(m for _, m in messages if "target pod" in m), None, None
    if _abort_requested(facts.vmim, state):
        return "aborted", None, None, Explained.ABORT_REQUESTED
    return "unknown", None, None, Explained.NO_REASON


def _scheduler_message(events: tuple[dict, ...]) -> str | None:
    failed = [e for e in events if e.get("reason") == "FailedScheduling" and e.get("message")]
    failed.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return failed[-1]["message"] if failed else None


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")

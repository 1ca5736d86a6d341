"""migration-report's pure part: whether a migration is worth a report, and its category, with KubeVirt's numbers.

Every fact is an argument (Facts, Settings, now): no API call, no clock, no environment. The arithmetic
is KubeVirt's (arithmetic.py); the words people read — the Event's sentence, the advice — are wording.py's.
"""
from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.migration_report.arithmetic import (
    DataSize,
    PolicyMatch,
    data_size,
    effective_configuration,
    match_policy,
    read_failure_reason,
)
from functions.migration_report.settings import Settings
from shared import kubevirt as kv

VMIM_KIND = "VirtualMachineInstanceMigration"


class Action(enum.StrEnum):
    SKIP = "skip"          # not final, out of scope, too old, or a success well inside its budget
    REPORT = "report"


# The categories of a failed migration; a success that used most of its budget is "near-timeout".
CATEGORIES = ("completion-timeout", "progress-stall", "target-unschedulable", "target-pod-removed", "vmi-shutdown",
              "aborted", "libvirt-error", "unknown")


@dataclass(frozen=True)
class Facts:
    """What the cluster keeps about one migration, read fresh."""

    vmim: dict
    vmi: dict | None = None          # None when gone, or a newer VMI of the same name (a restart since)
    vm: dict | None = None
    kubevirt: dict | None = None     # the KubeVirt CR
    policies: tuple[dict, ...] = ()
    namespace: dict | None = None
    events: tuple[dict, ...] = ()    # KubeVirt's Events on the VMIM and VMI, the scheduler's on target pods


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    notice: str | None = None        # which reply: "failed" | "near-timeout" (io.vmevents.migration-report.<notice>)
    report: dict = field(default_factory=dict)  # KubeVirt's numbers and the category; wording.py adds the words


def precheck(vmim: dict, settings: Settings, now: datetime) -> str | None:
    """Why this VMIM needs no closer look (no API call needed to say so), or None."""
    meta, phase = kv.meta(vmim), kv.phase(vmim)
    if not settings.in_scope(meta.get("namespace", "")):
        return f"namespace {meta.get('namespace')} is out of scope"
    if phase not in kv.FINAL_PHASES:
        return f"phase is {phase or 'unset'}, not final yet"
    ended = finished_at(vmim)
    if ended is not None and now - ended > settings.within:
        return (f"ended at {ended:%Y-%m-%dT%H:%M:%SZ}, more than MIGRATION_REPORT_WITHIN="
                f"{_span(settings.within)} ago (its report, if any, may have expired with its Event)")
    return None


def row_precheck(meta: Mapping[str, Any], phase: Any, settings: Settings, now: datetime) -> str | None:
    """precheck from a VMIM's Table row (its Phase cell and its metadata) before any full read, or None when
    the full object may be reportable. The same three rules; the row has no end time, so the third uses the
    newest managedFields[].time instead: every write stamps its writer's entry (second precision) and the
    final phase is a write, so a VMIM last written more than MIGRATION_REPORT_WITHIN (+1 s) ago ended before
    the window too. Without a readable time on every entry (a client may clear managedFields), it may not
    have: None, and the full object decides. Pure."""
    namespace = str(meta.get("namespace") or "default")
    if not settings.in_scope(namespace):
        return f"namespace {namespace} is out of scope"
    if not isinstance(phase, str) or phase not in kv.FINAL_PHASES:
        return f"phase is {phase or 'unset'}, not final yet"
    entries = meta.get("managedFields")
    times = [kv.parse_time(e.get("time")) if isinstance(e, dict) else None
             for e in (entries if isinstance(entries, list) else ())]
    known = [t for t in times if t is not None]
    if known and len(known) == len(times) and now - max(known) > settings.within + timedelta(seconds=1):
        return (f"last written at {max(known):%Y-%m-%dT%H:%M:%SZ}, so ended more than MIGRATION_REPORT_WITHIN="
                f"{_span(settings.within)} ago")
    return None


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """Report this migration or not, and in which category. Pure: every fact is an argument."""
    skip = precheck(facts.vmim, settings, now)
    if skip:
        return Verdict(Action.SKIP, skip)
    report = analyse(facts)
    if kv.phase(facts.vmim) == "Succeeded":
        used = report["budget"]["usedRatio"]
        if used is None:
            return Verdict(Action.SKIP, "succeeded; its completion budget is unknown (no memory size)", report=report)
        if used < settings.warn_ratio:
            return Verdict(Action.SKIP, f"succeeded in {report['timing']['tookSeconds']} s, {used:.0%} of its "
                                        f"{report['budget']['completionTimeoutSeconds']} s budget "
                                        f"(under MIGRATION_WARN_RATIO={settings.warn_ratio:g})", report=report)
        report["category"] = "near-timeout"
        notice = "near-timeout"
    else:
        notice = "failed"
    return Verdict(Action.REPORT, f"{notice}: {report['category']}", notice=notice, report=report)


def ended(reported: Mapping[str, Any], vmi: dict | None, migrations: Iterable[dict], opened: datetime | None,
          settings: Settings, now: datetime) -> str | None:
    """Why a reported migration's finding is over, or None while it stands. A failed (or nearly timed-out)
    migration is a fact in the past; what lasts is "this VMI could not migrate well", and that ends when
    a later migration of the same VMI has ended (its own report says how it went), when the VMI is gone
    or was restarted (a new VMI), or MIGRATION_RESOLVED_AFTER after it was reported. Pure."""
    uid, vmi_uid = reported.get("uid"), reported.get("vmiUid")
    namespace, _, name = str(reported.get("vmi") or "").partition("/")
    if vmi is None:
        return f"the VMI {namespace}/{name} is gone"
    if vmi_uid and kv.meta(vmi).get("uid") != vmi_uid:
        return f"the VMI {namespace}/{name} was restarted (a new VMI)"
    began = kv.parse_time(str(reported.get("createdAt") or ""))
    for other in migrations:
        meta = kv.meta(other)
        if meta.get("uid") == uid or meta.get("namespace") != namespace or kv.phase(other) not in kv.FINAL_PHASES:
            continue
        created = kv.parse_time(meta.get("creationTimestamp"))  # whole seconds: the same second counts as later
        if (other.get("spec") or {}).get("vmiName") == name and (began is None or (created and created >= began)):
            return f"a later migration of the VMI, {meta.get('name')}, has {kv.phase(other).lower()}"
    if opened is not None and now - opened >= settings.resolved_after:
        return f"reported {_span(now - opened)} ago (MIGRATION_RESOLVED_AFTER={_span(settings.resolved_after)})"
    return None


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


def analyse(facts: Facts) -> dict:
    """Every number KubeVirt used for this migration, with where it came from, and the failure's category."""
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
    if kv.phase(vmim) == "Failed":
        report["category"], report["detail"], report["kubevirtSeconds"] = classify(report, facts, state)
    return report


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
    if size is None:
        return None
    return {"memory": size.memory, "from": size.source, "bytes": size.bytes, "gigabytes": size.gigabytes,
            "blockMigration": size.block_migration,
            "note": ("BlockMigration: KubeVirt adds the ephemeral disks' size, which the API does not show; "
                     "the real budget is at least this") if size.block_migration else None}


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


def classify(report: dict, facts: Facts, state: dict) -> tuple[str, str, int | None]:
    """(category, detail, the seconds KubeVirt's own message names)."""
    text = report["failureReason"]
    took, budget = report["timing"]["tookSeconds"], report["budget"]["completionTimeoutSeconds"]
    if text:
        read = read_failure_reason(text)
        if read.category == "aborted-or-timeout":  # ≥ v1.9: one wording for both timeouts and an abort
            if _abort_requested(facts.vmim, state):
                return "aborted", "an abort was requested (VMIM deleted or AbortRequested)", None
            if took is not None and budget and took >= budget - 2:
                return "completion-timeout", f"ran {took} s, the budget is {budget} s", None
            return "progress-stall", "aborted before its completion budget ran out: the progress timeout", None
        # Older virt-controllers write "target pod is down", newer ones "Target pod is down" (its migration
        # controller's failureReason): compare without case.
        target_down = "target pod is down" in text.lower()
        if read.category == "aborted" or target_down:
            if target_down:
                return "target-pod-removed", text, None
            return "aborted", "the libvirt job was cancelled (an abort was requested)", None
        detail = text if read.category == "libvirt-error" else text.strip()
        return read.category, detail, read.seconds
    messages = [(e.get("reason") or "", e.get("message") or "") for e in facts.events
                if (e.get("involvedObject") or {}).get("kind") == VMIM_KIND]
    if any(reason == "migrationTargetPodUnschedulable" for reason, _ in messages):
        scheduler = _scheduler_message(facts.events)
        return "target-unschedulable", scheduler or "the target pod stayed unschedulable", None
    if any("vmi shutdown" in m or "vmi does not exist" in m for _, m in messages) or facts.vmi is None \
            or kv.phase(facts.vmi) in kv.FINAL_PHASES:
        return "vmi-shutdown", "the VMI stopped (or was deleted) while it was migrating", None
    if any("target pod" in m and ("removed" in m or "shutdown" in m) for _, m in messages):
        return "target-pod-removed", next(m for _, m in messages if "target pod" in m), None
    if _abort_requested(facts.vmim, state):
        return "aborted", "an abort was requested (VMIM deleted or AbortRequested)", None
    return "unknown", "KubeVirt recorded no failureReason and no Event that explains it", None


def _scheduler_message(events: tuple[dict, ...]) -> str | None:
    failed = [e for e in events if e.get("reason") == "FailedScheduling" and e.get("message")]
    failed.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return failed[-1]["message"] if failed else None


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"

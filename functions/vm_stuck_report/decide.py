"""vm-stuck-report's pure part: is this VM (or its migration) stuck, and since when — from facts read fresh.

`decide(facts, settings, now)` says whether a VM has stayed in a transitional or error state (KubeVirt's
`status.printableStatus`, or its VMIM's phase) longer than that state's threshold, and since when, from what KubeVirt
and CDI record (docs/facts.md §7); once the facts carry what explains it (`Facts.detail`, read only for a VM found
stuck: `Action.EXPLAIN` asks for it), it names the cause (causes.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from functions.vm_stuck_report.causes import DV_STATES, Action, Verdict, diagnose, say
from functions.vm_stuck_report.facts import DataVolumeFacts, Facts, StartFailures, Stuck
from functions.vm_stuck_report.settings import GROUPS, MIGRATION_PHASES, OPT_OUT, Settings
from shared import kubevirt as kv
from shared import objects as o


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """What to do about this VM now. Pure: every fact is an argument."""
    verdict = stuck(facts, settings, now)
    if verdict.action is not Action.REPORT or verdict.stuck is None:
        return verdict
    if facts.detail is None:
        return Verdict(Action.EXPLAIN, verdict.why, verdict.stuck)
    detail = replace(facts.detail, datavolumes=facts.datavolumes, start_failures=start_failures(facts.vm))
    return diagnose(verdict.stuck, detail)


def start_failures(vm: Mapping | None) -> StartFailures | None:
    """The VM's status.startFailure, when KubeVirt counts failed starts (docs/facts.md §7)."""
    found = o.mapping(vm, "status", "startFailure") if vm is not None else {}
    count = found.get("consecutiveFailCount")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    return StartFailures(count, kv.parse_time(o.text(found, "retryAfterTimestamp")),
                         o.string(found, "lastFailedVMIUID"))


# -- is it stuck? ---------------------------------------------------------------------------------
def stuck(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """Whether the VM (with its VMI and, for a migration, the VMIM) is stuck, and since when."""
    vm, vmi, vmim = facts.vm, facts.vmi, facts.vmim
    if vm is None:
        return Verdict(Action.SETTLED, say("vm-gone"))
    if facts.migration_gone:
        return Verdict(Action.SETTLED, say("migration-gone"))
    meta = kv.meta(vm)
    if not settings.in_scope(str(meta.get("namespace") or "default")):
        return Verdict(Action.SKIP, say("out-of-scope"))
    if kv.annotations_of(vm).get(OPT_OUT, "").lower() in ("skip", "false", "off"):
        return Verdict(Action.SKIP, say("opted-out", annotation=OPT_OUT))
    if vmim is not None:
        return _migration(vm, vmi, vmim, settings, now)
    state = o.string(vm, "status", "printableStatus")
    group = GROUPS.get(state)
    if group is None or state.startswith("Migration"):
        return Verdict(Action.SETTLED, say("not-stuck", state=state))
    if group == "starting" and vmi is not None and kv.phase(vmi) == "Running":
        # KubeVirt prints Running (or Paused, Migrating, Stopping, Terminating) before any starting word whenever the
        # VMI runs (setPrintableStatus, docs/facts.md §7): this status was written from an older VMI, as
        # virt-controller does from a lagging cache after a restart, and its next sync rewrites it.
        return Verdict(Action.SETTLED, say("status-behind", state=state))
    since, instance = _since(vm, vmi, group, state, facts.datavolumes)
    if since is None:
        return Verdict(Action.WAIT, say("untimed", state=state))
    found = Stuck(state, group, since, instance, settings.threshold(state), None, *_names(vm))
    if now - since < found.threshold:
        return Verdict(Action.WAIT, say("not-yet", stuck=found), found)
    return Verdict(Action.REPORT, say("past", stuck=found), found)


def _names(vm: Mapping) -> tuple[str, str]:
    meta = kv.meta(vm)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _migration(vm: Mapping, vmi: Mapping | None, vmim: Mapping, settings: Settings, now: datetime) -> Verdict:
    phase = o.string(vmim, "status", "phase") or "Pending"  # a VMIM without a phase yet is pending
    evacuated = kv.annotations_of(vmim).get(kv.EVACUATION_MIGRATION)
    if evacuated:  # KubeVirt's evacuation of a drained node (docs/facts.md §10): that node's finding lists it
        return Verdict(Action.DEFER, say("evacuation", node=evacuated))
    if phase not in MIGRATION_PHASES:
        # a migration that failed is migration-report's; one that runs or ended is not stuck starting
        return Verdict(Action.SETTLED if phase != "Failed" else Action.DEFER, say("migration-phase", phase=phase))
    if vmi is None or kv.phase(vmi) in kv.FINAL_PHASES:
        return Verdict(Action.SETTLED, say("migration-vmi-gone"))
    state = f"Migration{phase}"
    created = kv.parse_time(o.text(vmim, "metadata", "creationTimestamp"))
    if created is None:
        return Verdict(Action.WAIT, say("migration-untimed"))
    found = Stuck(state, "migrating", created, o.string(vmim, "metadata", "uid"), settings.threshold(state),
                  o.string(vmim, "metadata", "name"), *_names(vm))
    if now - created < found.threshold:
        return Verdict(Action.WAIT, say("not-yet", stuck=found), found)
    return Verdict(Action.REPORT, say("past", stuck=found), found)


def _since(vm: Mapping, vmi: Mapping | None, group: str, state: str,
           datavolumes: tuple[DataVolumeFacts, ...]) -> tuple[datetime | None, str]:
    """When the VM entered its state, from what KubeVirt or CDI records (docs/facts.md §7), and the instance."""
    vm_uid = o.string(vm, "metadata", "uid")
    live = vmi is not None and kv.phase(vmi) not in kv.FINAL_PHASES
    vmi_uid = o.string(vmi, "metadata", "uid") if vmi is not None else ""
    if group == "terminating":
        return kv.parse_time(o.text(vm, "metadata", "deletionTimestamp")), vm_uid
    if group == "stopping":  # a stop deletes the VMI (vm.go stopVMI): its deletionTimestamp is when
        return (kv.parse_time(o.text(vmi, "metadata", "deletionTimestamp")) if live else None), vmi_uid
    if group == "migrating":
        return (kv.parse_time(o.text(vmi, "status", "migrationState", "startTimestamp")) if live else None), vmi_uid
    if state in DV_STATES:  # no VMI until the DataVolumes are ready: the first not ready, from its creation
        troubled = next((dv for dv in datavolumes if dv.error or dv.provisioning), None)
        return (troubled.created, troubled.uid) if troubled is not None else (None, vm_uid)
    failures = start_failures(vm)
    if failures is not None and failures.since() is not None:
        # a crash loop spans VMIs (CrashLoopBackOff between them, a starting word during each try): one episode of
        # the VM's, timed from KubeVirt's back-off schedule
        return failures.since(), vm_uid
    if live:  # starting: every starting phase of this VMI (Pending, Scheduling, Scheduled) counts from its creation
        return kv.parse_time(o.text(vmi, "metadata", "creationTimestamp")), vmi_uid
    # No live VMI: nothing KubeVirt writes says when this began. The VM's Ready condition (VMINotExists) dates from
    # the last stop, often days before a start; and a status that needs a VMI (ErrorUnschedulable, ErrImagePull, …)
    # next to none is a moment stale. Not timed, never guessed: KubeVirt's VirtualMachineStuckInUnhealthyState
    # covers a VM stuck with no VMI (docs/facts.md §7).
    return None, vm_uid

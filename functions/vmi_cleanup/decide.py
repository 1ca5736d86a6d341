"""What to do with a VMI left in a final phase, decided from facts alone (pure: no API, no clock, no environment).

The verdict is never "delete the VMI" blindly: for a VM with run strategy Once, or RerunOnFailure on
KubeVirt < 1.2, deleting a Succeeded VMI makes KubeVirt boot the guest again (docs/facts.md §2,
KubeVirt pkg/virt-controller/watch/vm.go syncRunStrategy). Those VMs are halted instead and KubeVirt
removes the VMI itself.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from functions.vmi_cleanup.settings import Settings
from shared import kubevirt as kv
from shared.settings import MAX_DURATION, DurationTooLong, format_duration, parse_duration

SKIP_ANNOTATION = "vmevents.io/skip-cleanup"
AFTER_ANNOTATION = "vmevents.io/cleanup-after"
# KubeVirt ≥ 1.2 deletes a Succeeded VMI of a RerunOnFailure VM by itself; we step in only when it
# is still there this long after it was due, so a delay of 0s never races KubeVirt's own cleanup.
MIN_RERUN_GRACE = timedelta(minutes=1)
RERUN_SELF_CLEANING = (1, 2, 0)  # KubeVirt commit 0bb53947, docs/facts.md §2

Version = tuple[int, int, int]


class Action(enum.StrEnum):
    SKIP = "skip"              # not a candidate: phase, scope, opt-out, being deleted, ...
    WAIT = "wait"              # a candidate, not due yet
    LEAVE = "leave"            # KubeVirt takes care of it (or restarts it): hands off
    DELETE_VMI = "delete-vmi"
    HALT_VM = "halt-vm"


# The verdicts that change the cluster; any other one is only logged.
ACTING = (Action.DELETE_VMI, Action.HALT_VM)


@dataclass(frozen=True)
class Facts:
    """What the handler read fresh for one decision. The KubeVirt version and the in-flight migrations
    are read only when a first look finds the VMI due (they cost API calls); until then they are unknown."""

    vmi: dict[str, Any]
    vm: dict[str, Any] | None
    kubevirt_version: Version | None = None
    migrating: bool = False


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    run_strategy: str | None = None
    due_at: datetime | None = None
    warning: str | None = None  # an annotation we do not understand: a Warning Event says so
    why: str = ""               # the reason's class, a word from a fixed set (the metrics' `reason` label)


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """What to do with this VMI now. Pure: every fact is an argument."""
    vmi, vm = facts.vmi, facts.vm
    meta = kv.meta(vmi)
    phase = kv.phase(vmi)
    if not settings.in_scope(meta.get("namespace", "")):
        return Verdict(Action.SKIP, f"namespace {meta.get('namespace')} is out of scope", why="out-of-scope")
    if meta.get("deletionTimestamp"):
        return Verdict(Action.SKIP, "the VMI is already being deleted", why="being-deleted")
    if phase not in settings.phases:
        return Verdict(Action.SKIP, f"phase is {phase or 'unset'}, not {' or '.join(settings.phases)}",
                       why="not-final")

    opt_out = _opt_out(vm, vmi)
    if opt_out:
        return opt_out
    delay, warning = _delay(vm, vmi, settings)
    if warning:
        return Verdict(Action.SKIP, warning, warning=warning, why="annotation-invalid")
    finished = kv.phase_since(vmi, phase)
    if finished is None:
        return Verdict(Action.SKIP, f"the VMI has no {phase} phaseTransitionTimestamp", why="no-timestamp")
    due = finished + delay
    if now < due:
        return Verdict(Action.WAIT, f"{phase} since {finished:%H:%M:%SZ}, due at {due:%H:%M:%SZ}", due_at=due,
                       why="not-due")

    if facts.migrating or kv.migration_in_flight(vmi):
        return Verdict(Action.SKIP, "a migration of the VMI is in flight", why="migrating")
    owner = kv.controller_owner(vmi, "VirtualMachine")
    if owner is None:
        return Verdict(Action.DELETE_VMI, "standalone VMI (no VirtualMachine owns it)", why="standalone")
    if vm is None:
        return Verdict(Action.DELETE_VMI, f"its VirtualMachine {owner.get('name')} no longer exists", why="vm-gone")
    if owner.get("uid") and owner["uid"] != kv.meta(vm).get("uid"):
        return Verdict(Action.SKIP, "the VMI belongs to an earlier VirtualMachine of the same name", why="earlier-vm")
    if (vm.get("status") or {}).get("stateChangeRequests"):
        return Verdict(Action.SKIP, "the VM has pending state change requests", why="state-change-pending")
    return _by_run_strategy(kv.run_strategy(vm), phase, due, delay, now, facts.kubevirt_version)


def _by_run_strategy(strategy: str | None, phase: str, due: datetime, delay: timedelta, now: datetime,
                     version: Version | None) -> Verdict:
    """The table in README 'What it does', from docs/facts.md §2."""
    def verdict(action: Action, reason: str, due_at: datetime | None = None) -> Verdict:
        known = strategy in ("Manual", "Halted", "Always", "Once", "RerunOnFailure")
        return Verdict(action, reason, run_strategy=strategy, due_at=due_at,
                       why=f"run-strategy-{strategy.lower()}" if strategy and known else "run-strategy-unknown")

    if strategy in ("Manual", "Halted"):
        return verdict(Action.DELETE_VMI, f"runStrategy {strategy}: KubeVirt will not start it again")
    if strategy == "Always":
        return verdict(Action.LEAVE, "runStrategy Always: KubeVirt restarts the VM itself")
    if strategy == "Once":
        return verdict(Action.HALT_VM, "runStrategy Once: deleting the VMI would boot the VM again")
    if strategy != "RerunOnFailure":
        return verdict(Action.SKIP, f"unknown runStrategy {strategy!r}")
    if phase == "Failed":
        return verdict(Action.LEAVE, "runStrategy RerunOnFailure: KubeVirt reruns a failed VMI")
    if version is None:
        return verdict(Action.HALT_VM, "runStrategy RerunOnFailure on an unknown KubeVirt version: "
                                       "halting is safe on every version, deleting is not")
    if version < RERUN_SELF_CLEANING:
        return verdict(Action.HALT_VM, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)} (< 1.2): "
                                       f"deleting the VMI would boot the VM again")
    grace = due + max(delay, MIN_RERUN_GRACE)
    if now < grace:
        return verdict(Action.LEAVE, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)}: "
                                     f"KubeVirt removes the VMI itself", due_at=grace)
    return verdict(Action.HALT_VM, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)} should have "
                                   f"removed the VMI itself but it is still there; halting the VM")


def _opt_out(vm: dict[str, Any] | None, vmi: dict[str, Any]) -> Verdict | None:
    for owner, obj in (("VM", vm), ("VMI", vmi)):
        value = kv.annotations_of(obj).get(SKIP_ANNOTATION)
        if value is None or value == "false":
            continue
        if value == "true":
            return Verdict(Action.SKIP, f"the {owner} opts out ({SKIP_ANNOTATION}: \"true\")", why="opted-out")
        warning = (f"{SKIP_ANNOTATION}: {value!r} on the {owner} is not understood (use \"true\" or \"false\"); "
                   f"treating it as an opt-out, nothing will be cleaned up")
        return Verdict(Action.SKIP, warning, warning=warning, why="annotation-invalid")
    return None


def _delay(vm: dict[str, Any] | None, vmi: dict[str, Any], settings: Settings) -> tuple[timedelta, str | None]:
    for owner, obj in (("VM", vm), ("VMI", vmi)):
        value = kv.annotations_of(obj).get(AFTER_ANNOTATION)
        if value is None:
            continue
        shown = repr(value) if len(value) <= 80 else repr(value[:77]) + "..."
        try:
            return parse_duration(value), None
        except DurationTooLong:
            # shared.settings.MAX_DURATION: beyond it a due time could overflow; this VM alone opts out.
            return settings.cleanup_after, (f"{AFTER_ANNOTATION}: {shown} on the {owner} is longer than "
                                            f"{format_duration(MAX_DURATION)} (use a value like 90s, 10m or 2h); "
                                            f"nothing will be cleaned up")
        except ValueError:
            return settings.cleanup_after, (f"{AFTER_ANNOTATION}: {shown} on the {owner} is not a duration "
                                            f"(use a value like 90s, 10m or 2h); nothing will be cleaned up")
    return settings.cleanup_after, None


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))

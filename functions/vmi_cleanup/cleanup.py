"""vmi-cleanup: remove the VMI a guest left in phase Succeeded when it powered itself off.

Reads top to bottom: settings → parse (which VMI an event is about, with no API call) → fetch
(fresh VMI and VM) → decide (pure) → act (with preconditions) → report (Event and reply).

The action is never "delete the VMI" blindly: for a VM with run strategy Once, or RerunOnFailure on
KubeVirt < 1.2, deleting a Succeeded VMI makes KubeVirt boot the guest again (FACTS.md §2,
pkg/virt-controller/watch/vm.go syncRunStrategy). Those VMs are halted instead and KubeVirt removes
the VMI itself.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from shared import kubevirt as kv
from shared.errors import TemporaryError
from shared.intake import Incoming, about, may_concern
from shared.kube import KUBEVIRT, VM, VMI, VMIM, Conflict
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome
from shared.settings import Env, in_scope, parse_duration

FUNCTION = "vmi-cleanup"
SKIP_ANNOTATION = "vmevents.io/skip-cleanup"
AFTER_ANNOTATION = "vmevents.io/cleanup-after"
PREVIOUS_ANNOTATION = "vmevents.io/previous-run-strategy"
# KubeVirt ≥ 1.2 deletes a Succeeded VMI of a RerunOnFailure VM by itself; we step in only when it
# is still there this long after it was due, so a delay of 0s never races KubeVirt's own cleanup.
MIN_RERUN_GRACE = timedelta(minutes=1)
RERUN_SELF_CLEANING = (1, 2, 0)  # commit 0bb53947, FACTS.md §2
MAX_ATTEMPTS = 3

log = logging.getLogger("vmevents.vmi-cleanup")


# -- settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    cleanup_after: timedelta = timedelta(minutes=10)
    cleanup_failed: bool = False
    dry_run: bool = False
    namespaces: frozenset[str] = frozenset()
    exclude_namespaces: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        return cls(cleanup_after=env.duration("CLEANUP_AFTER", "10m"),
                   cleanup_failed=env.boolean("CLEANUP_FAILED", False),
                   dry_run=env.boolean("CLEANUP_DRY_RUN", False),
                   namespaces=env.names("CLEANUP_NAMESPACES"),
                   exclude_namespaces=env.names("CLEANUP_EXCLUDE_NAMESPACES"))

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)

    @property
    def phases(self) -> tuple[str, ...]:
        return kv.FINAL_PHASES if self.cleanup_failed else ("Succeeded",)

    @property
    def phase_tokens(self) -> tuple[bytes, ...]:
        """How the phases this function acts on appear in an object's JSON."""
        return _FAILED_TOKENS if self.cleanup_failed else _SUCCEEDED_TOKENS


_SUCCEEDED_TOKENS = (b'"Succeeded"',)
_FAILED_TOKENS = (b'"Succeeded"', b'"Failed"')


# -- decide (pure) --------------------------------------------------------------------------------
class Action(str, enum.Enum):
    SKIP = "skip"              # not a candidate: phase, scope, opt-out, being deleted, ...
    WAIT = "wait"              # a candidate, not due yet
    LEAVE = "leave"            # KubeVirt takes care of it (or restarts it): hands off
    DELETE_VMI = "delete-vmi"
    HALT_VM = "halt-vm"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    run_strategy: str | None = None
    due_at: datetime | None = None
    warning: str | None = None  # an annotation we do not understand: a Warning Event says so


UNKNOWN_VERSION = None


def decide(vmi: dict, vm: dict | None, settings: Settings, now: datetime, *,
           kubevirt_version: tuple[int, int, int] | None = UNKNOWN_VERSION, migrating: bool = False) -> Decision:
    """What to do with this VMI now. Pure: every fact is an argument."""
    meta = kv.meta(vmi)
    phase = kv.phase(vmi)
    if not settings.in_scope(meta.get("namespace", "")):
        return Decision(Action.SKIP, f"namespace {meta.get('namespace')} is out of scope")
    if meta.get("deletionTimestamp"):
        return Decision(Action.SKIP, "the VMI is already being deleted")
    if phase not in settings.phases:
        return Decision(Action.SKIP, f"phase is {phase or 'unset'}, not {' or '.join(settings.phases)}")

    opt_out = _opt_out(vm, vmi)
    if opt_out:
        return opt_out
    delay, warning = _delay(vm, vmi, settings)
    if warning:
        return Decision(Action.SKIP, warning, warning=warning)
    finished = kv.phase_since(vmi, phase)
    if finished is None:
        return Decision(Action.SKIP, f"the VMI has no {phase} phaseTransitionTimestamp")
    due = finished + delay
    if now < due:
        return Decision(Action.WAIT, f"{phase} since {finished:%H:%M:%SZ}, due at {due:%H:%M:%SZ}", due_at=due)

    if migrating or kv.migration_in_flight(vmi):
        return Decision(Action.SKIP, "a migration of the VMI is in flight")
    owner = kv.controller_owner(vmi, "VirtualMachine")
    if owner is None:
        return Decision(Action.DELETE_VMI, "standalone VMI (no VirtualMachine owns it)")
    if vm is None:
        return Decision(Action.DELETE_VMI, f"its VirtualMachine {owner.get('name')} no longer exists")
    if owner.get("uid") and owner["uid"] != kv.meta(vm).get("uid"):
        return Decision(Action.SKIP, "the VMI belongs to an earlier VirtualMachine of the same name")
    if (vm.get("status") or {}).get("stateChangeRequests"):
        return Decision(Action.SKIP, "the VM has pending state change requests")
    return _by_run_strategy(kv.run_strategy(vm), phase, due, delay, now, kubevirt_version)


def _by_run_strategy(strategy: str | None, phase: str, due: datetime, delay: timedelta, now: datetime,
                     version: tuple[int, int, int] | None) -> Decision:
    """The table in README 'What it does', from FACTS.md §2."""
    def decision(action: Action, reason: str, **extra) -> Decision:
        return Decision(action, reason, run_strategy=strategy, **extra)

    if strategy in ("Manual", "Halted"):
        return decision(Action.DELETE_VMI, f"runStrategy {strategy}: KubeVirt will not start it again")
    if strategy == "Always":
        return decision(Action.LEAVE, "runStrategy Always: KubeVirt restarts the VM itself")
    if strategy == "Once":
        return decision(Action.HALT_VM, "runStrategy Once: deleting the VMI would boot the VM again")
    if strategy != "RerunOnFailure":
        return decision(Action.SKIP, f"unknown runStrategy {strategy!r}")
    if phase == "Failed":
        return decision(Action.LEAVE, "runStrategy RerunOnFailure: KubeVirt reruns a failed VMI")
    if version is None:
        return decision(Action.HALT_VM, "runStrategy RerunOnFailure on an unknown KubeVirt version: "
                                        "halting is safe on every version, deleting is not")
    if version < RERUN_SELF_CLEANING:
        return decision(Action.HALT_VM, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)} (< 1.2): "
                                        f"deleting the VMI would boot the VM again")
    grace = due + max(delay, MIN_RERUN_GRACE)
    if now < grace:
        return decision(Action.LEAVE, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)}: "
                                      f"KubeVirt removes the VMI itself", due_at=grace)
    return decision(Action.HALT_VM, f"runStrategy RerunOnFailure on KubeVirt {_dotted(version)} should have "
                                    f"removed the VMI itself but it is still there; halting the VM")


def _opt_out(vm: dict | None, vmi: dict) -> Decision | None:
    for owner, obj in (("VM", vm), ("VMI", vmi)):
        value = kv.annotations_of(obj).get(SKIP_ANNOTATION)
        if value is None or value == "false":
            continue
        if value == "true":
            return Decision(Action.SKIP, f"the {owner} opts out ({SKIP_ANNOTATION}: \"true\")")
        warning = (f"{SKIP_ANNOTATION}: {value!r} on the {owner} is not understood (use \"true\" or \"false\"); "
                   f"treating it as an opt-out, nothing will be cleaned up")
        return Decision(Action.SKIP, warning, warning=warning)
    return None


def _delay(vm: dict | None, vmi: dict, settings: Settings) -> tuple[timedelta, str | None]:
    for owner, obj in (("VM", vm), ("VMI", vmi)):
        value = kv.annotations_of(obj).get(AFTER_ANNOTATION)
        if value is None:
            continue
        try:
            return parse_duration(value), None
        except ValueError:
            return settings.cleanup_after, (f"{AFTER_ANNOTATION}: {value!r} on the {owner} is not a duration "
                                            f"(use a value like 90s, 10m or 2h); nothing will be cleaned up")
    return settings.cleanup_after, None


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


# -- parse: which VMI is this event about? (no API calls) ------------------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str | None = None      # the VMI's name, when the event says it
    uid: str | None = None       # else its uid (a launcher pod's kubevirt.io/created-by label)


def target(event: Incoming, settings: Settings) -> Target | None:
    """The VMI worth a fresh look, or None when the event cannot concern a cleanup."""
    # A launcher pod only in Resource mode: reading pods would need a permission nothing else needs.
    found = about(event, ("VirtualMachineInstance", "Pod"), FUNCTION, ref_kinds=("VirtualMachineInstance",))
    ref, obj = found.ref, found.obj
    if found.deleted or not settings.in_scope(ref.namespace):
        return None
    if obj is None:  # Reference mode: the VMI is read in any case
        return Target(ref.namespace, ref.name)
    if ref.kind == "VirtualMachineInstance":
        return Target(ref.namespace, ref.name) if kv.phase(obj) in settings.phases else None
    return _launcher_target(obj, ref.namespace, settings)


def _launcher_target(pod: dict, namespace: str, settings: Settings) -> Target | None:
    labels = kv.meta(pod).get("labels") or {}
    if labels.get("kubevirt.io") != "virt-launcher" or (pod.get("status") or {}).get("phase") not in settings.phases:
        return None
    owner = kv.controller_owner(pod, "VirtualMachineInstance")
    if owner:
        return Target(namespace, owner["name"])
    uid = labels.get("kubevirt.io/created-by")
    return Target(namespace, uid=uid) if uid else None


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """The cheap pre-check on raw bytes: a Resource-mode VMI or launcher-pod event whose JSON names
    no final phase anywhere cannot concern a cleanup, so it is not decoded at all. It can only err
    towards decoding (a final phase mentioned elsewhere in the object); a missed event would still
    be caught by the next re-scan."""
    return may_concern(headers, body, ("VirtualMachineInstance", "Pod"), settings.phase_tokens)


# -- fetch, decide, act ---------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    vmi = _read_vmi(ctx, found)
    if vmi is None:
        return Outcome("gone", subject=event.subject, reason="the VMI no longer exists")
    return converge(vmi, ctx)


def _read_vmi(ctx: KubeContext, found: Target) -> dict | None:
    if found.name:
        return ctx.kube.get(VMI, found.namespace, found.name)
    return next((vmi for vmi in ctx.kube.list(VMI, found.namespace) if kv.meta(vmi).get("uid") == found.uid), None)


def converge(vmi: dict, ctx: KubeContext) -> Outcome:
    """Decide on fresh objects and act; on a conflict, read again and decide again."""
    for _ in range(MAX_ATTEMPTS):
        vm = _read_vm(ctx, vmi)
        decision = _decide_with_facts(vmi, vm, ctx)
        try:
            return _act(decision, vmi, vm, ctx)
        except Conflict:
            vmi_was, meta = vmi, kv.meta(vmi)
            vmi = ctx.kube.get(VMI, meta["namespace"], meta["name"])
            if vmi is None:
                return Outcome("gone", subject=kv.api_path(vmi_was), reason="the VMI no longer exists")
    raise TemporaryError(f"VMI {kv.meta(vmi)['namespace']}/{kv.meta(vmi)['name']} kept changing while "
                         f"being cleaned up; retry later")


def _read_vm(ctx: KubeContext, vmi: dict) -> dict | None:
    owner = kv.controller_owner(vmi, "VirtualMachine")
    return ctx.kube.get(VM, kv.meta(vmi)["namespace"], owner["name"]) if owner else None


def _decide_with_facts(vmi: dict, vm: dict | None, ctx: KubeContext) -> Decision:
    """Decide; read the KubeVirt version and in-flight migrations only when an action is possible."""
    now = ctx.clock()
    first = decide(vmi, vm, ctx.settings, now)
    if first.action in (Action.SKIP, Action.WAIT):
        return first
    return decide(vmi, vm, ctx.settings, now, kubevirt_version=_kubevirt_version(ctx),
                  migrating=_migrating(ctx, vmi))


def _kubevirt_version(ctx: KubeContext) -> tuple[int, int, int] | None:
    for cr in ctx.kube.list(KUBEVIRT):
        version = kv.parse_version((cr.get("status") or {}).get("observedKubeVirtVersion"))
        if version:
            return version
    return None


def _migrating(ctx: KubeContext, vmi: dict) -> bool:
    meta = kv.meta(vmi)
    selector = f"kubevirt.io/vmi-name={meta['name']}"
    return any((m.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
               for m in ctx.kube.list(VMIM, meta["namespace"], label_selector=selector))


def _act(decision: Decision, vmi: dict, vm: dict | None, ctx: KubeContext) -> Outcome:
    subject = kv.api_path(vmi)
    if decision.warning:
        ctx.recorder.record(vm or vmi, "Warning", "VMICleanupAnnotationInvalid", decision.warning, ctx.clock())
    if decision.action not in (Action.DELETE_VMI, Action.HALT_VM):
        return Outcome(decision.action.value, subject=subject, reason=decision.reason)
    if ctx.settings.dry_run:
        return _report(decision, vmi, vm, ctx, f"would-{decision.action.value}")
    meta = kv.meta(vmi)
    if decision.action is Action.DELETE_VMI:
        gone = not ctx.kube.delete(VMI, meta["namespace"], meta["name"], uid=meta["uid"],
                                   resource_version=meta["resourceVersion"])
        if gone:
            return Outcome("gone", subject=subject, reason="the VMI was already deleted")
        return _report(decision, vmi, vm, ctx, "deleted-vmi")
    ctx.kube.json_patch(VM, meta["namespace"], kv.meta(vm)["name"], halt_patch(vm, decision.run_strategy))
    return _report(decision, vmi, vm, ctx, "halted-vm")


def halt_patch(vm: dict, strategy: str) -> list[dict]:
    """runStrategy → Halted, only if it is still `strategy` on this very version of the VM."""
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": kv.meta(vm)["resourceVersion"]},
           {"op": "test", "path": "/spec/runStrategy", "value": strategy},
           {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"}]
    if kv.meta(vm).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "add", "path": "/metadata/annotations/" + PREVIOUS_ANNOTATION.replace("/", "~1"),
                "value": strategy})
    return ops


# -- report ---------------------------------------------------------------------------------------
def _report(decision: Decision, vmi: dict, vm: dict | None, ctx: KubeContext, action: str) -> Outcome:
    meta = kv.meta(vmi)
    dry_run = action.startswith("would-")
    ctx.recorder.record(vm or vmi, "Normal", "VMICleanupDryRun" if dry_run else "VMICleanedUp",
                        event_message(action, vmi, decision), ctx.clock())
    data = {"vmi": f"{meta['namespace']}/{meta['name']}",
            "vm": f"{meta['namespace']}/{kv.meta(vm)['name']}" if vm else None,
            "action": action, "reason": decision.reason,
            "previousRunStrategy": decision.run_strategy, "dryRun": dry_run}
    reply = Reply(reply_type(FUNCTION, "cleaned"), kv.api_path(vmi), data, key=f"{meta['uid']}/{action}")
    return Outcome(decision.action.value, effect=action, subject=kv.api_path(vmi), reason=decision.reason,
                   reply=reply)


def event_message(action: str, vmi: dict, decision: Decision) -> str:
    """One sentence per action; stable for the same action on the same VMI so Events deduplicate."""
    name = f"{kv.meta(vmi)['namespace']}/{kv.meta(vmi)['name']}"
    if decision.action is Action.DELETE_VMI:
        done = f"deleted VMI {name}"
    else:
        done = f"halted the VM (runStrategy {decision.run_strategy} → Halted) so KubeVirt removes VMI {name}"
    said = f"Dry run: would have {done}" if action.startswith("would-") else done[0].upper() + done[1:]
    return f"{said}, left in phase {kv.phase(vmi)}: {decision.reason}."


# -- the periodic re-scan -------------------------------------------------------------------------
def rescan(ctx: KubeContext) -> Outcome:
    """Look at every VMI, page by page: catches missed events and makes 'after a delay' work."""
    cleaned, failures, scanned = [], [], 0
    for namespace in sorted(ctx.settings.namespaces) or [None]:
        for vmi in ctx.kube.list(VMI, namespace):
            scanned += 1
            if kv.phase(vmi) not in ctx.settings.phases or not ctx.settings.in_scope(kv.meta(vmi).get("namespace", "")):
                continue
            try:
                outcome = converge(vmi, ctx)
            except TemporaryError as exc:
                failures.append(exc)
                continue
            if outcome.reply is not None:
                cleaned.append(outcome.reply.data)
    if failures:
        raise TemporaryError(f"re-scan could not finish {len(failures)} VMI(s): {failures[0].message}")
    reason = f"scanned {scanned} VMI(s), acted on {len(cleaned)}"
    if not cleaned:
        return Outcome("rescan", reason=reason)
    reply = Reply(reply_type(FUNCTION, "scanned"), "/vmevents/vmi-cleanup/rescan",
                  {"scanned": scanned, "cleaned": cleaned},
                  key="|".join(sorted(f"{c['vmi']}/{c['action']}" for c in cleaned)))
    return Outcome("rescan", effect=f"acted-on-{len(cleaned)}", reason=reason, reply=reply)

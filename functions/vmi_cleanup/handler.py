"""vmi-cleanup's I/O: remove the VMI a guest left in phase Succeeded when it powered itself off.

Reads top to bottom: the two entry points (an event, a re-scan tick), then converge: fetch (fresh
VMI and VM) → decide (functions/vmi_cleanup/decide.py, pure) → act (with preconditions) → report
(Event and reply); the helpers of each step follow in that order.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from functions.vmi_cleanup import intents, notices, wording
from functions.vmi_cleanup import memory as memories
from functions.vmi_cleanup.decide import ACTING, Action, Facts, Verdict, Version, decide
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared import metrics
from shared import objects as o
from shared import rescan as rescans
from shared.deadline import time_left, until
from shared.errors import TemporaryError
from shared.finding import report, summary
from shared.intake import Incoming, about, check_name, check_uid, may_concern
from shared.kinds import KUBEVIRT, NAMESPACE, VM, VMI, VMIM
from shared.kube import Conflict, JsonPatch, NotSent, Throttled, Unavailable
from shared.replies import Reply
from shared.runtime import KubeContext, Outcome

# Every request of a delivery ends this long after it began (shared/deadline.py): it answers before the broker gives
# up on it (the Trigger's 30 s), however long kube-apiserver holds each request. A DELETE whose answer was lost is
# waited for until REPORT_RESERVE before that, which is left for reporting it (the Event, the intent removed).
DELIVERY_BUDGET = rescans.DELIVERY_TIMEOUT.total_seconds() - 2.0
REPORT_RESERVE = 3.0
LOST_ANSWER_WAIT = 15.0  # the wait where no deadline is set (a handler called directly)

PREVIOUS_ANNOTATION = "vmevents.io/previous-run-strategy"
ACTED_ON, REPLY = wording.ACTED_ON, wording.REPLY
MAX_ATTEMPTS = 3


# -- the flow ------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    """One event: parse which VMI it points at (no API call), read that VMI fresh, converge. Every request it sends
    ends within DELIVERY_BUDGET (shared/deadline.py)."""
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    with until(time.monotonic() + DELIVERY_BUDGET):
        vmi = read_vmi(ctx, found)
        if vmi is None:
            return notices.gone(ctx, found.namespace, found.name, found.uid, event.id, event.subject,
                                "the VMI no longer exists")
        return converge(vmi, ctx, delivery=event.id)


def rescan(ctx: KubeContext[Settings]) -> Outcome:
    with until(rescans.begin() + DELIVERY_BUDGET):
        return _rescan(ctx)


def _rescan(ctx: KubeContext[Settings]) -> Outcome:
    """Every VMI's phase from the Table form of the list (cells only, from the watch cache, one namespace
    at a time), then each VMI in a final phase read in full and converged: catches missed events and makes
    'after a delay' work. Why the cheap read is safe: docs/api-cost.md; budget and isolation: shared/rescan.py."""
    began = rescans.begin()
    settled = [] if ctx.settings.dry_run else notices.settle_intents(ctx)  # DELETEs whose answer was lost, first
    listed = rescans.gather(_namespaces(ctx), lambda namespace: [
        (namespace, row) for row in ctx.kube.list_rows(VMI, namespace, cached=True, metadata=False)],
        ctx.settings.rescan)
    rows = [pair for pairs in listed for pair in pairs]
    scanned = len(rows)
    candidates = [Target(namespace, row["metadata"]["name"]) for namespace, row in rows
                  if row["cells"].get("phase") in ctx.settings.phases]
    # A dry run's candidates already reported on the same objects are spared a decision (functions/vmi_cleanup/
    # memory.py); an acting install decides every candidate in full.
    memory = memories.load(ctx.kube, [c.namespace for c in candidates], ctx.settings) \
        if ctx.settings.dry_run and candidates else None
    deadline = began + DELIVERY_BUDGET  # each visit runs in a worker thread: its requests end by the tick's deadline
    scan = rescans.run(candidates, lambda found: _visit(found, ctx, memory, deadline), ctx.settings.rescan,
                       started=began, rotation=rescans.tick_number(ctx.clock()))
    cleaned = sorted([*settled, *scan.results], key=lambda r: r.subject or "")
    reason = f"{wording.scanned_reason(scanned, len(cleaned))}; {scan.progress()}"
    if memory is not None:
        reason += f"; {wording.spared_reason(memory.spared)}"
    if not cleaned:
        return Outcome("rescan", reason=reason)
    reply = summary(FUNCTION, "scanned", "/vmevents/vmi-cleanup/rescan", cleaned, reason, {"vmis": scanned})
    return Outcome("rescan", effect=f"acted-on-{len(cleaned)}", reason=reason, reply=reply)


def _visit(found: Target, ctx: KubeContext[Settings], memory: memories.Memory | None = None,
           deadline: float | None = None) -> Reply | None:
    """One candidate of the re-scan: the VMI read in full (the listed row may be stale), then converge. In a dry
    run, first: was this verdict reported on these very objects already (memory.py)? Then nothing more."""
    if deadline is not None:
        with until(deadline):
            return _visit(found, ctx, memory)
    if memory is not None and memory.unchanged(ctx.kube, found.namespace, found.name or "", ctx.settings,
                                               ctx.clock(), lambda: _kubevirt_version(ctx)):
        return None
    vmi = ctx.kube.get(VMI, found.namespace, found.name or "")
    if vmi is None or kv.phase(vmi) not in ctx.settings.phases:
        return None
    return converge(vmi, ctx).reply


def converge(vmi: dict[str, Any], ctx: KubeContext[Settings], delivery: str | None = None) -> Outcome:
    """Decide on fresh objects and act; on a conflict, read again and decide again. `delivery`: the id of the
    CloudEvent being answered (None for a re-scan), kept on the Event of what it did (notices.cleaned)."""
    in_doubt = False  # a DELETE of ours lost its answer and may still be applied (_InDoubt)
    meta = kv.meta(vmi)
    if meta.get("deletionTimestamp") and not ctx.settings.dry_run:
        # Being deleted: by a DELETE of ours whose answer was lost (its intent says so), to be reported now?
        kept = intents.find(ctx.kube, ctx.settings.intents, meta["namespace"], meta["name"], meta.get("uid"))
        reported = notices.report_intent(ctx, kept, delivery)
        if reported is not None:
            return reported
    for _ in range(MAX_ATTEMPTS):
        vm = read_vm(ctx, vmi)
        verdict, version = decide_with_facts(vmi, vm, ctx)
        try:
            return _counted(verdict, _act(verdict, vmi, vm, ctx, version, delivery, in_doubt=in_doubt))
        except Conflict as conflict:
            in_doubt = in_doubt or isinstance(conflict, _InDoubt)
            meta = kv.meta(vmi)
            fresh = ctx.kube.get(VMI, meta["namespace"], meta["name"])
            if in_doubt and notices.ended(fresh, meta):  # the DELETE in doubt (or its re-sending) was applied
                return _counted(verdict, notices.cleaned(verdict, vmi, vm, ctx, "deleted-vmi", delivery=delivery))
            if fresh is None:
                return notices.gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery,
                                    kv.api_path(vmi), "the VMI no longer exists")
            vmi = fresh
    raise TemporaryError(f"VMI {kv.meta(vmi)['namespace']}/{kv.meta(vmi)['name']} kept changing while "
                         f"being cleaned up; retry later")


def _counted(verdict: Verdict, outcome: Outcome) -> Outcome:
    """The decision acted on, and what acting did, in the metrics (docs/metrics.md)."""
    trigger = metrics.trigger()
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value, verdict.why, trigger)
    if verdict.action in ACTING:
        result = "dry-run" if wording.is_dry_run(outcome.effect) else "done" if outcome.verdict != "gone" else "gone"
        metrics.ACTIONS.inc(FUNCTION, verdict.action.value, result, trigger)
    if outcome.reply is not None and outcome.verdict != "gone":
        metrics.REPORTED.inc(FUNCTION, "vmi-cleaned-up", "info", trigger)
    return outcome


# -- parse: which VMI is this event about? (no API calls) ------------------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str | None = None      # the VMI's name, when the event says it
    uid: str | None = None       # its uid, when the event says it (a launcher pod's owner or created-by label)


def target(event: Incoming, settings: Settings) -> Target | None:
    """The VMI worth a fresh look, or None when the event cannot concern a cleanup."""
    # A launcher pod only in Resource mode: reading pods would need a permission nothing else needs.
    found = about(event, ("VirtualMachineInstance", "Pod"), FUNCTION, ref_kinds=("VirtualMachineInstance",))
    ref, obj, namespace = found.ref, found.obj, found.namespace
    if found.deleted or not settings.in_scope(namespace):
        return None
    if obj is None:  # Reference mode: the VMI is read in any case
        return Target(namespace, ref.name)
    if ref.kind == "VirtualMachineInstance":
        return Target(namespace, ref.name, kv.meta(obj).get("uid")) if kv.phase(obj) in settings.phases else None
    return _launcher_target(obj, namespace, settings)


def _launcher_target(pod: dict[str, Any], namespace: str, settings: Settings) -> Target | None:
    labels = kv.labels_of(pod)
    if labels.get("kubevirt.io") != "virt-launcher" or kv.phase(pod) not in settings.phases:
        return None
    owner = kv.controller_owner(pod, "VirtualMachineInstance")
    if owner:
        return Target(namespace, check_name("VirtualMachineInstance", owner["name"], "the pod's owner"),
                      owner.get("uid"))
    uid = labels.get("kubevirt.io/created-by")
    return Target(namespace, uid=check_uid(uid)) if uid else None


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """The cheap pre-check on raw bytes: a Resource-mode VMI or launcher-pod event whose JSON names
    no final phase anywhere cannot concern a cleanup, so it is not decoded at all. It can only err
    towards decoding (a final phase mentioned elsewhere in the object); a missed event would still
    be caught by the next re-scan."""
    return may_concern(headers, body, ("VirtualMachineInstance", "Pod"), settings.phase_tokens)


# -- fetch ----------------------------------------------------------------------------------------
def _namespaces(ctx: KubeContext[Settings]) -> list[str]:
    """The namespaces in scope: the listed ones, else every namespace there is (names only, from the cache)."""
    names = sorted(ctx.settings.namespaces) or \
        sorted(ns["metadata"]["name"] for ns in ctx.kube.list_metadata(NAMESPACE, cached=True))
    return [name for name in names if ctx.settings.in_scope(name)]


def read_vmi(ctx: KubeContext[Settings], found: Target) -> dict[str, Any] | None:
    if found.name:
        return ctx.kube.get(VMI, found.namespace, found.name)
    return next((vmi for vmi in ctx.kube.list(VMI, found.namespace) if kv.meta(vmi).get("uid") == found.uid), None)


def read_vm(ctx: KubeContext[Settings], vmi: dict[str, Any]) -> dict[str, Any] | None:
    owner = kv.controller_owner(vmi, "VirtualMachine")
    return ctx.kube.get(VM, kv.meta(vmi)["namespace"], owner["name"]) if owner else None


def decide_with_facts(vmi: dict[str, Any], vm: dict[str, Any] | None,
                       ctx: KubeContext[Settings]) -> tuple[Verdict, Version | None]:
    """Decide; read the KubeVirt version and in-flight migrations only when an action is possible. With the
    verdict, the KubeVirt version it was decided on (None when not read)."""
    now = ctx.clock()
    facts = Facts(vmi, vm)
    first = decide(facts, ctx.settings, now)
    if first.action in (Action.SKIP, Action.WAIT):
        return first, None
    facts = replace(facts, kubevirt_version=_kubevirt_version(ctx), migrating=_migrating(ctx, vmi))
    return decide(facts, ctx.settings, now), facts.kubevirt_version


def _kubevirt_version(ctx: KubeContext[Settings]) -> tuple[int, int, int] | None:
    for cr in ctx.kube.list(KUBEVIRT):
        version = kv.parse_version(o.text(cr, "status", "observedKubeVirtVersion"))
        if version:
            return version
    return None


def _migrating(ctx: KubeContext[Settings], vmi: dict[str, Any]) -> bool:
    meta = kv.meta(vmi)
    selector = f"kubevirt.io/vmi-name={meta['name']}"
    return any(kv.phase(m) not in ("Succeeded", "Failed")
               for m in ctx.kube.list(VMIM, meta["namespace"], label_selector=selector))


# -- act ------------------------------------------------------------------------------------------
class _InDoubt(Conflict):
    """A DELETE lost its answer, and the VMI read again is still there, unchanged: the DELETE never arrived, or
    kube-apiserver applies it later (etcd was down: it waits up to its request timeout). A 503 here would leave the
    notice to whoever finds the VMI gone later (from the intent kept before the DELETE: intents.py); converge instead
    decides again on fresh reads and, if still due, sends the DELETE again with the preconditions of the VMI it read:
    exactly one of the two can apply, either is this delivery's, and it reports it itself."""


def _act(verdict: Verdict, vmi: dict[str, Any], vm: dict[str, Any] | None, ctx: KubeContext[Settings],
         version: Version | None = None, delivery: str | None = None, *, in_doubt: bool = False) -> Outcome:
    subject = kv.api_path(vmi)
    if verdict.warning:
        ctx.recorder.record(vm or vmi, "Warning", wording.ANNOTATION_INVALID, verdict.warning, ctx.clock())
    if verdict.action not in ACTING:
        return Outcome(verdict.action.value, subject=subject, reason=verdict.reason)
    if ctx.settings.dry_run:
        return notices.cleaned(verdict, vmi, vm, ctx, f"would-{verdict.action.value}",
                               memories.basis(vmi, vm, ctx.settings, version))
    meta = kv.meta(vmi)
    if verdict.action is Action.DELETE_VMI:
        # Kept before it is sent: if its answer is lost, whoever finds the VMI deleting or gone reports it (intents.py)
        kept = intents.intent(vmi, vm or vmi, delivery, ctx.clock(), wording.event_message("deleted-vmi", vmi, verdict),
                              asdict(report(wording.finding("deleted-vmi", vmi, vm, verdict), "cleaned")))
        intents.keep(ctx.kube, ctx.settings.intents, kept)
        try:
            gone = not ctx.kube.delete(VMI, meta["namespace"], meta["name"], uid=meta["uid"],
                                       resource_version=meta["resourceVersion"])
        except (Throttled, NotSent):
            intents.forget(ctx.kube, ctx.settings.intents, kept)
            raise  # turned away, or never sent: not applied (a 429's 503 carries its Retry-After back to the broker)
        except Unavailable as lost:
            if not _gone_since(ctx, meta):  # the intent stays: the DELETE may still be applied
                raise _InDoubt(f"{lost} (the DELETE's answer was lost and the VMI is still there)") from lost
            # A DELETE was applied and our answer lost (the API restarted): ours, or a concurrent delivery's that
            # lost its answer too. Either may report it: the Event, counted once per VMI, tells them apart.
            gone = False
        except Conflict:
            if not in_doubt:  # not applied (its preconditions failed); in doubt, an earlier DELETE may have been
                intents.forget(ctx.kube, ctx.settings.intents, kept)
            raise
        if gone and not in_doubt:  # in doubt, the 404 answers the DELETE sent again: the first one was applied
            intents.forget(ctx.kube, ctx.settings.intents, kept)
            return notices.gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery, subject,
                                "the VMI was already deleted")
        done = notices.cleaned(verdict, vmi, vm, ctx, "deleted-vmi", delivery=delivery)
        intents.forget(ctx.kube, ctx.settings.intents, kept)
        return done
    # decide() halts only a VM it read, and says which run strategy it saw.
    assert vm is not None and verdict.run_strategy is not None, verdict
    ctx.kube.json_patch(VM, meta["namespace"], kv.meta(vm)["name"], halt_patch(vm, verdict.run_strategy))
    return notices.cleaned(verdict, vmi, vm, ctx, "halted-vm", delivery=delivery)


def _gone_since(ctx: KubeContext[Settings], meta: dict[str, Any]) -> bool:
    """After a DELETE whose answer was lost: is this very VMI (uid) gone, or going (a deletionTimestamp, KubeVirt's
    finalizer still on it)? Then the DELETE was applied, and this answer reports it. The API that lost the answer
    may still be down (etcd stopped: kube-apiserver holds the DELETE and applies it when etcd is back), so the re-read
    is tried again until REPORT_RESERVE before the delivery's deadline, each try given at most what is left
    (shared/deadline.py), and then the answer is a 503: the broker has not given up yet, and the intent kept before
    the DELETE lets whoever comes next report it."""
    left = time_left()
    with until(time.monotonic() + (LOST_ANSWER_WAIT if left is None else left - REPORT_RESERVE)):
        while True:
            try:
                fresh = ctx.kube.get(VMI, meta["namespace"], meta["name"])
                break
            except Unavailable:
                remaining = time_left()
                if remaining is None or remaining < 1.5:
                    raise
                time.sleep(1.0)
    return notices.ended(fresh, meta)


def halt_patch(vm: dict[str, Any], strategy: str) -> JsonPatch:
    """runStrategy → Halted, only if it is still `strategy` on this very version of the VM."""
    ops: JsonPatch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": kv.meta(vm)["resourceVersion"]},
        {"op": "test", "path": "/spec/runStrategy", "value": strategy},
        {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"}]
    if kv.meta(vm).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "add", "path": "/metadata/annotations/" + PREVIOUS_ANNOTATION.replace("/", "~1"),
                "value": strategy})
    return ops

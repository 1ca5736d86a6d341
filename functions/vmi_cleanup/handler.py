"""vmi-cleanup's I/O: remove the VMI a guest left in phase Succeeded when it powered itself off.

Reads top to bottom: the two entry points (an event, a re-scan tick), then converge: fetch (fresh
VMI and VM) → decide (functions/vmi_cleanup/decide.py, pure) → act (with preconditions) → report
(Event and reply); the helpers of each step follow in that order.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from functions.vmi_cleanup import memory as memories
from functions.vmi_cleanup import wording
from functions.vmi_cleanup.decide import ACTING, Action, Facts, Verdict, Version, decide
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared import objects as o
from shared import rescan as rescans
from shared.errors import TemporaryError
from shared.finding import report, summary
from shared.intake import Incoming, about, check_name, check_uid, may_concern
from shared.kinds import KUBEVIRT, NAMESPACE, VM, VMI, VMIM
from shared.kube import Conflict, JsonPatch, Throttled, Unavailable
from shared.replies import Reply
from shared.runtime import KubeContext, Outcome

# How long a DELETE whose answer was lost waits for the API to answer a re-read: longer than an etcd restart, and
# with the DELETE's own 10 s read timeout (shared.kube) still below the Trigger's 30 s delivery timeout (deploy/).
LOST_ANSWER_WAIT = 15.0

PREVIOUS_ANNOTATION = "vmevents.io/previous-run-strategy"
# On an act's VMICleanedUp Event: the CloudEvent id of the delivery that acted, and the reply it answered with.
ACTED_ON = "vmevents.io/cleaned-on-delivery"
REPLY = "vmevents.io/cleaned-reply"
MAX_ATTEMPTS = 3


# -- the flow ------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    """One event: parse which VMI it points at (no API call), read that VMI fresh, converge."""
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    vmi = _read_vmi(ctx, found)
    if vmi is None:
        return _gone(ctx, found.namespace, found.name, found.uid, event.id, event.subject,
                     "the VMI no longer exists")
    return converge(vmi, ctx, delivery=event.id)


def rescan(ctx: KubeContext[Settings]) -> Outcome:
    """Every VMI's phase from the Table form of the list (cells only, from the watch cache, one namespace
    at a time), then each VMI in a final phase read in full and converged: catches missed events and makes
    'after a delay' work. Why the cheap read is safe: docs/api-cost.md; budget and isolation: shared/rescan.py."""
    began = rescans.begin()
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
    scan = rescans.run(candidates, lambda found: _visit(found, ctx, memory), ctx.settings.rescan, started=began,
                       rotation=rescans.tick_number(ctx.clock()))
    cleaned = sorted(scan.results, key=lambda r: r.subject or "")
    reason = f"{wording.scanned_reason(scanned, len(cleaned))}; {scan.progress()}"
    if memory is not None:
        reason += f"; {wording.spared_reason(memory.spared)}"
    if not cleaned:
        return Outcome("rescan", reason=reason)
    reply = summary(FUNCTION, "scanned", "/vmevents/vmi-cleanup/rescan", cleaned, reason, {"vmis": scanned})
    return Outcome("rescan", effect=f"acted-on-{len(cleaned)}", reason=reason, reply=reply)


def _visit(found: Target, ctx: KubeContext[Settings], memory: memories.Memory | None = None) -> Reply | None:
    """One candidate of the re-scan: the VMI read in full (the listed row may be stale), then converge. In a dry
    run, first: was this verdict reported on these very objects already (memory.py)? Then nothing more."""
    if memory is not None and memory.unchanged(ctx.kube, found.namespace, found.name or "", ctx.settings,
                                               ctx.clock(), lambda: _kubevirt_version(ctx)):
        return None
    vmi = ctx.kube.get(VMI, found.namespace, found.name or "")
    if vmi is None or kv.phase(vmi) not in ctx.settings.phases:
        return None
    return converge(vmi, ctx).reply


def converge(vmi: dict[str, Any], ctx: KubeContext[Settings], delivery: str | None = None) -> Outcome:
    """Decide on fresh objects and act; on a conflict, read again and decide again. `delivery`: the id of the
    CloudEvent being answered (None for a re-scan), kept on the Event of what it did (_report)."""
    in_doubt = False  # a DELETE of ours lost its answer and may still be applied (_InDoubt)
    for _ in range(MAX_ATTEMPTS):
        vm = _read_vm(ctx, vmi)
        verdict, version = _decide_with_facts(vmi, vm, ctx)
        try:
            return _act(verdict, vmi, vm, ctx, version, delivery, in_doubt=in_doubt)
        except Conflict as conflict:
            in_doubt = in_doubt or isinstance(conflict, _InDoubt)
            meta = kv.meta(vmi)
            fresh = ctx.kube.get(VMI, meta["namespace"], meta["name"])
            if in_doubt and _ended(fresh, meta):  # the DELETE in doubt (or its re-sending) was applied meanwhile
                return _report(verdict, vmi, vm, ctx, "deleted-vmi", delivery=delivery)
            if fresh is None:
                return _gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery, kv.api_path(vmi),
                             "the VMI no longer exists")
            vmi = fresh
    raise TemporaryError(f"VMI {kv.meta(vmi)['namespace']}/{kv.meta(vmi)['name']} kept changing while "
                         f"being cleaned up; retry later")


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


def _read_vmi(ctx: KubeContext[Settings], found: Target) -> dict[str, Any] | None:
    if found.name:
        return ctx.kube.get(VMI, found.namespace, found.name)
    return next((vmi for vmi in ctx.kube.list(VMI, found.namespace) if kv.meta(vmi).get("uid") == found.uid), None)


def _read_vm(ctx: KubeContext[Settings], vmi: dict[str, Any]) -> dict[str, Any] | None:
    owner = kv.controller_owner(vmi, "VirtualMachine")
    return ctx.kube.get(VM, kv.meta(vmi)["namespace"], owner["name"]) if owner else None


def _decide_with_facts(vmi: dict[str, Any], vm: dict[str, Any] | None,
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
    kube-apiserver applies it later (etcd was down: it retries until its own request timeout). Answering 503 here
    would lose the cleanup's notice if it is applied later: the redelivery finds the VMI gone, with nothing saying
    whose DELETE that was. So converge decides again on fresh reads and, if still due, sends the DELETE again with
    the preconditions of the VMI it read: exactly one of the two can apply, and either is this delivery's."""


def _ended(fresh: dict[str, Any] | None, meta: Mapping[str, Any]) -> bool:
    """The VMI of `meta` is gone, replaced, or being deleted (KubeVirt's finalizer still on it)."""
    return fresh is None or kv.meta(fresh).get("uid") != meta["uid"] or bool(kv.meta(fresh).get("deletionTimestamp"))


def _act(verdict: Verdict, vmi: dict[str, Any], vm: dict[str, Any] | None, ctx: KubeContext[Settings],
         version: Version | None = None, delivery: str | None = None, *, in_doubt: bool = False) -> Outcome:
    subject = kv.api_path(vmi)
    if verdict.warning:
        ctx.recorder.record(vm or vmi, "Warning", wording.ANNOTATION_INVALID, verdict.warning, ctx.clock())
    if verdict.action not in ACTING:
        return Outcome(verdict.action.value, subject=subject, reason=verdict.reason)
    if ctx.settings.dry_run:
        return _report(verdict, vmi, vm, ctx, f"would-{verdict.action.value}",
                       memories.basis(vmi, vm, ctx.settings, version))
    meta = kv.meta(vmi)
    if verdict.action is Action.DELETE_VMI:
        try:
            gone = not ctx.kube.delete(VMI, meta["namespace"], meta["name"], uid=meta["uid"],
                                       resource_version=meta["resourceVersion"])
        except Throttled:
            raise  # turned away, not applied: the 503 carries the server's Retry-After back to the broker
        except Unavailable as lost:
            if not _gone_since(ctx, meta):
                raise _InDoubt(f"{lost} (the DELETE's answer was lost and the VMI is still there)") from lost
            # A DELETE was applied and our answer lost (the API restarted): ours, or a concurrent delivery's that
            # lost its answer too. Either may report it: the Event, counted once per VMI, tells them apart.
            gone = False
        if gone and not in_doubt:  # in doubt, the 404 answers the DELETE sent again: the first one was applied
            return _gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery, subject,
                         "the VMI was already deleted")
        return _report(verdict, vmi, vm, ctx, "deleted-vmi", delivery=delivery)
    # decide() halts only a VM it read, and says which run strategy it saw.
    assert vm is not None and verdict.run_strategy is not None, verdict
    ctx.kube.json_patch(VM, meta["namespace"], kv.meta(vm)["name"], halt_patch(vm, verdict.run_strategy))
    return _report(verdict, vmi, vm, ctx, "halted-vm", delivery=delivery)


def _gone_since(ctx: KubeContext[Settings], meta: dict[str, Any]) -> bool:
    """After a DELETE whose answer was lost: is this very VMI (uid) gone, or going (a deletionTimestamp, KubeVirt's
    finalizer still on it)? Then the DELETE was applied, and a redelivery would find nothing to do and announce
    nothing, so this answer must report it. The API that lost the answer may still be down (etcd stopped: the
    DELETE is applied when it is back), so the re-read is tried for LOST_ANSWER_WAIT before the answer is a 503."""
    deadline = time.monotonic() + LOST_ANSWER_WAIT
    while True:
        try:
            fresh = ctx.kube.get(VMI, meta["namespace"], meta["name"])
            break
        except Unavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)
    return _ended(fresh, meta)


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


# -- report ---------------------------------------------------------------------------------------
def _report(verdict: Verdict, vmi: dict[str, Any], vm: dict[str, Any] | None, ctx: KubeContext[Settings],
            effect: str, basis: memories.Basis | None = None, delivery: str | None = None) -> Outcome:
    """The Event and the reply. An act's Event is counted once per VMI (a dry run's each time it is decided, with
    the basis of its verdict: memory.py): counted for this VMI already, another delivery acted and reported (two
    DELETEs that lost their answers cannot tell whose was applied), and nothing is announced. An act's Event keeps
    the delivery that acted and its reply, for a redelivery of that event (_gone)."""
    dry = wording.is_dry_run(effect)
    reason = wording.DRY_RUN if dry else wording.CLEANED_UP
    reply = report(wording.finding(effect, vmi, vm, verdict), "cleaned")
    kept = {ACTED_ON: delivery, REPLY: json.dumps(asdict(reply), sort_keys=True)} if delivery and not dry else None
    meta = kv.meta(vmi)
    if not ctx.recorder.record(vm or vmi, "Normal", reason, wording.event_message(effect, vmi, verdict), ctx.clock(),
                               once_for=None if dry else meta.get("uid"), annotations=kept,
                               refresh={memories.BASIS: basis.encode()} if basis else None):
        return _gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery, kv.api_path(vmi),
                     "the VMI was deleted; another delivery reported it")
    return Outcome(verdict.action.value, effect=effect, subject=kv.api_path(vmi), reason=verdict.reason, reply=reply)


def _gone(ctx: KubeContext[Settings], namespace: str, name: str | None, uid: str | None, delivery: str | None,
          subject: str | None, reason: str) -> Outcome:
    """Nothing (more) to do. When this is a redelivery of the event whose delivery cleaned the VMI up, that
    delivery's reply again, same id: the broker redelivers an event whose reply it could not take in (the
    channel's reply to the broker's ingress failed), and only this answer can still announce the cleanup."""
    if delivery and name and uid:
        event = ctx.recorder.recorded_once(namespace, name, "Normal", wording.CLEANED_UP, uid)
        annotations = ((event or {}).get("metadata") or {}).get("annotations") or {}
        if annotations.get(ACTED_ON) == delivery:
            try:
                reply = Reply(**json.loads(annotations[REPLY]))
            except (KeyError, TypeError, ValueError):
                reply = None
            if reply is not None:
                return Outcome("gone", subject=subject, reply=reply,
                               reason=f"{reason}; this event's earlier delivery cleaned it up: its notice again")
    return Outcome("gone", subject=subject, reason=reason)

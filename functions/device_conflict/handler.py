"""device-conflict's I/O: tell the operator when a VM's passthrough device was taken by another VM.

This function never changes a VM: it reports, with a Warning Event on each VM involved and a reply
CloudEvent. Reads top to bottom: an event → parse (is it worth a look, with no API call) → fetch
(the VMs that share a device with the event's VM, and their VMIs, one GET each, folded into the small
index of index.py) → decide (pure) → report (the finding's life, shared/ledger.py: a reply only when a
conflict opens or ends). A PingSource tick is a re-scan: every VM and VMI, and the conflicts still open,
so that a conflict that ended is said to have ended and one that lasts outlives its Event's TTL.
Both keep the parameter object current (which VM each device is assigned to, assignment.py), which
the ValidatingAdmissionPolicy of deploy/components/prevent reads, and which tells an event which few
VMs to read (reads.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.device_conflict import instancetypes, reads, wording
from functions.device_conflict.decide import DeviceConflict, Facts, decide, find_conflicts
from functions.device_conflict.index import (
    ALLOCATION_ANNOTATION,
    FINAL,
    Ref,
    Workload,
    allocated_devices,
    spec_devices,
    unschedulable,
    vm_devices,
)
from functions.device_conflict.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared import metrics
from shared.environ import environ_get
from shared.errors import VmeventsError
from shared.finding import one_or_summary, summary
from shared.intake import RESOURCE_PREFIX, Incoming, about, spelt_with_escapes
from shared.ledger import Ledger, Notice, Record
from shared.runtime import KubeContext, Outcome

REASON = "HostDeviceConflict"
RESOLVED_REASON = "HostDeviceConflictResolved"
CATEGORY = "vmevents.io/finding-category"  # on the plain Events: which category of conflict they are about


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event, ctx.settings, ctx.clock())
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    if found.edited and not reads.names(ctx.kube, ctx.settings.assignments, found.id):
        return Outcome("irrelevant", subject=event.subject, reason=f"the parameter object does not name {found.id}")
    return check(found, event.subject, ctx, event.id)


def rescan(ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """A PingSource tick. Usually light: the VMs the parameter object's contested entries and the open findings
    name, one GET each (reads.light), enough to open a conflict the events missed among VMs the object knows
    share a device, to end one, and to renew one. Every DEVICE_REPAIR_EVERY, or when the object is missing, a
    full repair: every VM and VMI, and the whole object rewritten. `delivery`: the tick's id (a redelivered tick
    answers as it did)."""
    base = reads.read(ctx.kube, ctx.settings.assignments)
    repaired = reads.repaired_at(base) if base is not None else None
    if (base is None or repaired is None or ctx.clock() - repaired >= ctx.settings.repair_every
            or reads.DEVICE_NAMES not in base.annotations):  # an object from before DEVICE_NAMES: repair it
        return repair(ctx, delivery, base)
    if not reads.names_devices(base):  # plain KubeVirt, as the last repair found: nothing to look at
        return Outcome("rescan", reason="light tick: device names are per-VM aliases on this cluster (no "
                                        "devices.harvesterhci.io API): no device conflicts to look for")
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None))  # the resolved ones too: a redelivered tick answers as it did
    named = {vm for r in on_record if r.open for vm in _people(r.finding.details)}
    devices = {str(r.finding.details.get("device")) for r in on_record if r.open}
    seen = reads.light(ctx.kube, ctx.settings.assignments, named, devices)
    if seen is None:  # the object went away since it was read
        return repair(ctx, delivery, None)
    # Only the devices whose every claimant was read: a conflict about another device is the repair's.
    current = tuple(c for c in find_conflicts(seen.workloads) if c.device in seen.devices)
    in_scope = [r for r in on_record if str(r.finding.details.get("device")) in seen.devices]
    return _report(ctx, ledger, delivery, in_scope, current, seen.workloads, "light tick: read",
                   {"vms": len(seen.workloads), "light": True})


def repair(ctx: KubeContext[Settings], delivery: str, base: reads.Stored | None) -> Outcome:
    """Every VM and VMI, page by page: catches missed events, and repairs the parameter object (`base` was
    read before the LISTs, so that what events wrote meanwhile is kept). It always writes the object once, to
    stamp reads.REPAIRED_AT, which is what makes the next ticks light. The findings on record are read before
    the LISTs (shared/ledger.py, Races): one an event opens while the pages are read is not among them, so this
    repair, whose view is older than it, cannot resolve it."""
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None))
    names, vgpus = reads.discover(ctx.kube)  # and which gpus[].name are vGPUs: one LIST of their names
    index = reads.scan(ctx.kube, vgpus, with_instancetypes=names == reads.HARVESTER)
    # Only where names are devices (docs/facts.md §3): on plain KubeVirt every VM is as if it named none, so
    # nothing is found, every open finding resolves, and the object holds no entry.
    workloads = index.workloads() if names == reads.HARVESTER else []
    reads.keep_all(ctx.kube, ctx.settings.assignments, base, workloads, stamp=ctx.clock().isoformat(), names=names,
                   vgpus=vgpus)
    return _report(ctx, ledger, delivery, on_record, find_conflicts(workloads), workloads,
                   f"scanned {index.vms_seen} VM(s) and", {"vms": index.vms_seen, "vmis": index.vmis_seen},
                   vmis=index.vmis_seen)


def _report(ctx: KubeContext[Settings], ledger: Ledger, delivery: str, on_record: list[Record],
            current: tuple[DeviceConflict, ...], workloads: list[Workload], said: str, data: dict,
            vmis: int | None = None) -> Outcome:
    """A tick's findings: open what is seen, resolve what is no longer seen, replay a redelivered tick. Each
    finding's writes are its own (shared/rescan.py's contract): one that fails is named in the reason and tried
    again by the next tick, and never costs the notices of the findings this tick already opened or ended (a
    failed tick would answer 5xx, and after the broker's retries its notices would be dead-lettered)."""
    still_open = [r for r in on_record if r.open]
    replayed = [n for r in on_record if not r.open and (n := ledger.replay(r, delivery))]
    failures: list[str] = []

    def each(what: str, act: Callable[..., Notice | None], *args: Any, **kwargs: Any) -> Notice | None:
        try:
            return act(*args, **kwargs)
        except VmeventsError as exc:
            failures.append(f"{what}: {exc.message}")
            return None
    # A conflict seen now is a sighting that raises no count: it opens a finding the events missed (or one
    # whose Event expired while nobody ran), and renews an open one whose last write is getting old.
    for conflict in current:
        metrics.DECISIONS.inc(FUNCTION, "conflict", conflict.category.value, metrics.trigger())
    notices = [n for c in current
               if (n := each(c.device, _sighted, c, ledger, ctx, delivery, count=False))]
    detected = len(notices)
    by_id = {w.ref.id: w for w in workloads}
    keys = {c.key for c in current}
    for record in (r for r in still_open if r.finding.key not in keys):
        device = str(record.finding.details.get("device"))
        if n := each(device, _resolve, record, current, by_id, ledger, ctx, delivery):
            notices.append(n)
    notices += replayed
    looked = f"{vmis} VMI(s)" if vmis is not None else f"{len(workloads)} VM(s)"
    reason = (f"{said} {looked}: {len(current)} conflict(s), {detected} new, {len(notices) - detected} resolved")
    if failures:
        reason += f"; {len(failures)} failed, retried next tick ({'; '.join(failures[:3])})"
    reply = summary(FUNCTION, "scanned", f"/vmevents/{FUNCTION}/rescan", [n.reply() for n in notices], reason,
                    data)
    return Outcome("rescan", effect="reported" if reply else "none", reason=reason, reply=reply)


def _people(details: Mapping) -> set[str]:
    """The VMs a finding names: the ones it keeps from starting, and the holder."""
    holder = details.get("holder")
    return {str(vm) for vm in details.get("blocked") or ()} | ({str(holder)} if holder else set())


def check(found: Target, subject: str | None, ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """One VM's conflicts, among the VMs the parameter object says share a device with it (read fresh, one
    GET each); the object's entries for its devices are written back when they changed."""
    seen = reads.around(ctx.kube, ctx.settings.assignments, found.id)
    if not seen.sharing:
        metrics.DECISIONS.inc(FUNCTION, "no-conflict", "no-sharing", metrics.trigger())
        return Outcome("no-conflict", subject=subject,
                       reason=f"no other VM names or holds a device of {found.id}")
    verdict = decide(Facts(found.id, tuple(seen.workloads)), ctx.settings, ctx.clock())
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value,
                          verdict.conflicts[0].category.value if verdict.conflicts else "", metrics.trigger())
    if not verdict.conflicts:
        return Outcome(verdict.action.value, subject=subject, reason=verdict.reason)
    ledger = _ledger(ctx)
    notices = [n for c in verdict.conflicts if (n := _sighted(c, ledger, ctx, delivery, count=True))]
    if not notices:  # seen again: its Event's count rose, and nothing is announced
        return Outcome(verdict.action.value, effect="seen-again", subject=subject, reason=verdict.reason)
    reply = one_or_summary(FUNCTION, subject or f"/vmevents/{FUNCTION}", [n.reply() for n in notices],
                           verdict.reason)
    return Outcome(verdict.action.value, effect="reported", subject=subject, reason=verdict.reason, reply=reply)


# -- parse: is this event worth a look? (no API calls) -------------------------------------------
# "instancetype": a VM whose devices come from its instancetype (spec.instancetype) shows none of the others.
_HOST_DEVICES, _GPUS, _INSTANCETYPE = b'"hostDevices"', b'"gpus"', b'"instancetype"'
_ALLOCATION = ALLOCATION_ANNOTATION.encode()
_DEVICE_TOKENS = (_HOST_DEVICES, _GPUS, _ALLOCATION, _INSTANCETYPE)
_KINDS = ("VirtualMachine", "VirtualMachineInstance")


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """The cheap pre-check on raw bytes: a Resource-mode VM or VMI event whose JSON has no hostDevices, gpus,
    instancetype or allocation annotation anywhere names no device. A VMI event like that cannot concern a conflict
    and is not decoded. A VM event like that may be the spec edit that dropped a device, which frees its entry at
    once (target), so it is decoded unless its bytes show one `"generation"` equal to one `"observedGeneration"`
    (KubeVirt has seen this spec: a status write, no edit). That costs little: a VM changes when someone edits it or
    KubeVirt writes its status, while its VMI's status (guest agent, interfaces, conditions) changes far more often,
    and those events stay undecoded. It can only err towards decoding.

    `intake.may_concern` spelt out (it is the first half), so that the kind is read once: every irrelevant VM event
    scans its body seven times (four tokens, a backslash a token could hide behind, and each generation key once, its
    first and last occurrence), and calls nothing else (docs/hot-path.md)."""
    get = environ_get(headers)
    event_type, kind = get("HTTP_CE_TYPE") or "", get("HTTP_CE_KIND")
    if not event_type.startswith(RESOURCE_PREFIX) or kind not in _KINDS:
        return True
    if _HOST_DEVICES in body or _GPUS in body or _ALLOCATION in body or _INSTANCETYPE in body \
            or spelt_with_escapes(body):  # a token behind a JSON escape ("hostD\u0065vices"): decoded
        return True
    return kind == "VirtualMachine" and not _observed(body)


_GENERATION, _OBSERVED = b'"generation"', b'"observedGeneration"'
_COMMA, _BRACE, _COLON = 44, 125, 58  # the bytes a number is read between
# What follows a key whose value is a whole number, JSON's way (whitespace around the colon allowed), up to the
# `,` or `}` that ends the value: a number followed by anything else (2.5, 2e1, 2x) is not read.
_NUMBER = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*([0-9]+)[ \t\n\r]*[,}]")


def _observed(body: bytes) -> bool:
    """One `"generation"` key and one `"observedGeneration"` key in the bytes, each with a whole number, the same.
    Each key is found once from each end (the first occurrence is the last: there is one), and the numbers are
    compared where they lie, digit by digit, when both are written as Go writes them (`"generation":2,`): a regex
    match is read only for any other spelling (spaces around the colon)."""
    generation = body.find(_GENERATION)
    if generation < 0 or body.rfind(_GENERATION) != generation:
        return False
    observed = body.rfind(_OBSERVED)  # status comes last in KubeVirt's JSON (Go writes keys sorted)
    if observed < 0 or body.find(_OBSERVED) != observed:
        return False
    at, other = generation + len(_GENERATION), observed + len(_OBSERVED)
    try:
        if body[at] == _COLON and body[other] == _COLON:
            at, other = at + 1, other + 1
            digit = body[at]
            if 48 <= digit <= 57:
                while digit == body[other] and 48 <= digit <= 57:
                    at, other = at + 1, other + 1
                    digit = body[at]
                # Both numbers ended, at the same place, where a value ends: the same number.
                if (digit == _COMMA or digit == _BRACE) and body[other] in (_COMMA, _BRACE):
                    return True
    except IndexError:  # the body ends within a number: not one to read
        return False
    first, second = _NUMBER.match(body, generation + len(_GENERATION)), _NUMBER.match(body, observed + len(_OBSERVED))
    return first is not None and second is not None and first[1] == second[1]


@dataclass(frozen=True)
class Target:
    namespace: str
    name: str                             # the VM's name (a VMI's VM has the same name)
    devices: frozenset[str] | None = None  # device names the payload mentions (a hint)
    edited: bool = False  # a VM spec edit that names no device: worth a look only if the object names the VM

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


def target(event: Incoming, settings: Settings, now: datetime) -> Target | None:
    """The VM worth a conflict check, or None when the event cannot concern one."""
    found = about(event, _KINDS, FUNCTION)
    if found.deleted:
        # A deleted VM frees the devices the parameter object still gives it (else the admission policy would
        # count them taken until the next repair): a look, if the object names it. What else a deletion ends
        # (an open conflict), the next tick reports. A deleted VMI changes nothing the object says.
        if found.ref.kind != "VirtualMachine":
            return None
        return Target(found.ref.namespace or "default", found.ref.name, frozenset(), edited=True)
    if found.obj is None:  # Reference mode: look at it in any case
        return Target(found.ref.namespace or "default", found.ref.name)
    obj, meta = found.obj, kv.meta(found.obj)
    if obj["kind"] == "VirtualMachine":
        devices = vm_devices(obj) | (allocated_devices(obj) or frozenset())
        if not devices and instancetypes.matcher(obj) is not None:
            # Its instancetype may give it devices the payload cannot show: a look (reads GETs the revision KubeVirt
            # recorded, else the instancetype) on a spec edit; on a status write (KubeVirt recording the revision,
            # v1.5+), only if the parameter object names it.
            return Target(meta.get("namespace") or "default", meta["name"], None if _spec_edit(obj) else frozenset(),
                          edited=not _spec_edit(obj))
        if not devices and _spec_edit(obj):
            return Target(meta.get("namespace") or "default", meta["name"], frozenset(), edited=True)
    else:
        devices = spec_devices(obj.get("spec")) if _vmi_worth_a_look(obj, settings, now) else frozenset()
    if not devices:
        return None
    return Target(meta.get("namespace") or "default", meta["name"], frozenset(d.name for d in devices))


def _spec_edit(vm: dict) -> bool:
    """KubeVirt's VM controller has not yet seen this spec (metadata.generation is not status.observedGeneration,
    an absent one counts as different): the event may be the edit that dropped a device."""
    generation = kv.meta(vm).get("generation")
    return generation is None or generation != (vm.get("status") or {}).get("observedGeneration")


def _vmi_worth_a_look(vmi: dict, settings: Settings, now: datetime) -> bool:
    """A VMI that may just have taken a device (starting, just bound or just running), or that
    cannot be scheduled for want of a device."""
    phase = kv.phase(vmi)
    if phase in FINAL:
        return False
    if "Insufficient " in (unschedulable(vmi) or ""):
        return True
    if phase in ("", "Pending", "Scheduling", "Scheduled"):
        return True
    since = kv.phase_since(vmi, phase)
    return since is None or now - since <= settings.recent_start


# -- report: the finding's life (shared/ledger.py), Events for people --------------------------------
def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASON, RESOLVED_REASON)


def _sighted(conflict: DeviceConflict, ledger: Ledger, ctx: KubeContext[Settings], delivery: str, *,
             count: bool) -> Notice | None:
    """The conflict is there: its finding lives on the first VM it keeps from starting; the other VMs
    involved get a plain Event when it opens or is seen again by an event."""
    now = ctx.clock()
    notice = ledger.sighted(wording.finding(conflict), conflict.blocked[0].involved(), delivery, now, count=count)
    if notice is not None or count:
        for ref in conflict.involved[1:] if conflict.holder is None else (conflict.holder,):
            ctx.recorder.record(ref.involved(), "Warning", REASON, wording.conflict_message(conflict), now,
                                annotations={CATEGORY: conflict.category.value})
    return notice


def _resolve(record: Record, current: tuple[DeviceConflict, ...], workloads: Mapping[str, Workload],
             ledger: Ledger, ctx: KubeContext[Settings], delivery: str) -> Notice | None:
    """Resolve a conflict that is no longer seen, and say why on every VM involved: the ledger on the VM its finding
    lives on, a plain Event on the others (which had one for its start)."""
    data = record.finding.details
    because = wording.why_resolved(data, current, workloads)
    message = wording.resolved_message(data, because)
    notice = ledger.resolve(record, delivery, ctx.clock(), summary=message, details={"because": because})
    if notice is not None:
        recipient = f"{record.involved.get('namespace') or record.namespace}/{record.involved.get('name')}"
        for vm in sorted(_people(data) - {recipient}):
            ctx.recorder.record(_ref(vm, workloads).involved(), "Normal", RESOLVED_REASON, message, ctx.clock())
    return notice


def _ref(vm: str, workloads: Mapping[str, Workload]) -> Ref:
    """The VM "namespace/name", with its uid when it still exists (a deleted one keeps an Event without one)."""
    known = workloads.get(vm)
    namespace, name = vm.split("/", 1)
    return Ref(namespace, name, uid=(known.ref.uid if known else None) or "")


"""vm-stuck-report's I/O: when a VM stays starting, stopping, terminating or migrating too long, say why and what
to do.

KubeVirt's own alerts say only *that* a VM is stuck (VirtualMachineStuckInUnhealthyState,
VirtualMachineStuckOnNode; docs/facts.md §7); the facts that say *why* are scattered over the cluster. The
flow: on_event and rescan → converge: read the VM, its VMI (and VMIM), decide whether it is stuck past its
threshold (decide.decide); only when it is (`Action.EXPLAIN`) read what explains it (reads.py) — the launcher
(or migration target) pod, its scheduling condition and Events, the PVCs, StorageClasses and Longhorn volumes,
the node, the ResourceQuotas, KubeVirt's Events — and decide again on those facts → report: one finding per
episode (shared/ledger.py), in one `VMStuck` Event on the VM, `.detected` once and `.resolved` once when the VM
settles. It changes nothing but Events; every sentence it writes is wording.py's.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from functions.vm_stuck_report import wording
from functions.vm_stuck_report.causes import DV_STATES, Action, Verdict, say
from functions.vm_stuck_report.decide import decide
from functions.vm_stuck_report.facts import Detail, Facts
from functions.vm_stuck_report.reads import read_datavolumes, read_detail, source_of
from functions.vm_stuck_report.settings import GROUPS, MIGRATION_PHASES, Settings
from functions.vm_stuck_report.wording import FUNCTION
from shared import metrics
from shared import objects as o
from shared import rescan as rescans
from shared.finding import one_or_summary, summary
from shared.intake import Incoming, about, may_concern
from shared.kinds import EVENT, NAMESPACE, VM, VMI, VMIM
from shared.ledger import Ledger, Record, record_of
from shared.replies import Reply
from shared.runtime import KubeContext, Outcome

REASON = "VMStuck"
RESOLVED_REASON = "VMStuckResolved"  # the Event that tells an episode's end (shared/ledger.py)


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return converge(found, ctx, event.id)


def rescan(ctx: KubeContext[Settings], delivery: str) -> Outcome:
    """Every VM whose Status cell is a stuck state and every VMIM whose Phase cell is Pending or Scheduling (Table
    rows, cells only, from the watch cache, one namespace at a time: docs/api-cost.md), and every VM with a finding
    on record; only these are read in full and converged, within the budget (shared/rescan.py). What stays open is
    renewed, so that its Event outlives the TTL."""
    began, scanned, candidates = rescans.begin(), {"vms": 0, "migrations": 0}, dict[tuple, Target]()
    namespaces = [n for n in sorted(ns["metadata"]["name"] for ns in ctx.kube.list_metadata(NAMESPACE, cached=True))
                  if ctx.settings.in_scope(n)]

    def rows(namespace: str) -> tuple[list[dict], list[dict]]:
        return (list(ctx.kube.list_rows(VM, namespace, cached=True, metadata=False)),
                list(ctx.kube.list_rows(VMIM, namespace, cached=True, metadata=False)))

    for namespace, (vms, vmims) in zip(namespaces, rescans.gather(namespaces, rows, ctx.settings.rescan),
                                       strict=True):
        scanned["vms"] += len(vms)
        scanned["migrations"] += len(vmims)
        for row in vms:
            if row["cells"].get("status") in GROUPS:
                found = Target(namespace, str(row["metadata"]["name"]))
                candidates.setdefault(found.key, found)
        for row in vmims:
            if (row["cells"].get("phase") or "Pending") in MIGRATION_PHASES and row["cells"].get("vmi"):
                found = Target(namespace, str(row["cells"]["vmi"]), str(row["metadata"]["name"]))
                candidates.setdefault(found.key, found)
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None, cached=True))  # resolved ones too: a redelivered tick answers
    for record in on_record:
        if record.open or Ledger.replay(record, delivery):
            found = _target_of_record(record)
            candidates.setdefault(found.key, found)
    scan = rescans.run([candidates[k] for k in sorted(candidates)],
                       lambda found: _converge(found, ctx, delivery, tick=True)[1], ctx.settings.rescan,
                       started=began, rotation=rescans.tick_number(ctx.clock()))
    replies = sorted((r for notices in scan.results for r in notices), key=lambda r: (r.subject or "", r.type))
    renewed = ledger.renew_stale([r for r in on_record if r.open], ctx.clock())
    reason = wording.scanned_reason(scanned, len(candidates), len(replies), renewed, scan.progress())
    reply = summary(FUNCTION, "scanned", f"/vmevents/{FUNCTION}/rescan", replies, reason, scanned)
    return Outcome("rescan", effect=f"reported-{len(replies)}" if reply else "none", reason=reason, reply=reply)


def converge(found: Target, ctx: KubeContext[Settings], delivery: str = "", *, tick: bool = False) -> Outcome:
    """Read fresh, decide, and only for a VM stuck past its threshold read what explains it; record."""
    return _converge(found, ctx, delivery, tick=tick)[0]


def _converge(found: Target, ctx: KubeContext[Settings], delivery: str = "", *,
              tick: bool = False) -> tuple[Outcome, list[Reply]]:
    """converge, with the notices it caused one by one (a re-scan's summary lists each).

    The records come before the state they are judged by (docs/findings.md, Races): the VM's findings are read,
    then the VM, its VMI and VMIM, so that a finding is never resolved on a view older than itself, and a sighting
    knows which version of its finding's record it read (Ledger.sighted `read`). An event first takes a cheap look
    at the state alone: the many events of a VM only beginning to start cost 2 reads, and change nothing."""
    subject = _subject(found)
    if not tick:
        first = _look(found, ctx)
        if first is None:
            return Outcome("gone", subject=subject, reason=wording.said(say("migration-gone"))), []
        found, facts = first
        verdict = decide(facts, ctx.settings, ctx.clock())
        if verdict.action is Action.WAIT:  # an event as a VM begins to start: nothing more to read yet
            metrics.DECISIONS.inc(FUNCTION, verdict.action.value, "", metrics.trigger())
            return Outcome(verdict.action.value, subject=subject, reason=wording.reason(verdict)), []
    events = list(ctx.kube.list(EVENT, found.namespace, field_selector=f"involvedObject.name={found.name}"))
    records = _records(events, found)
    # a redelivery of the event that opened or ended episodes answers as it did
    replayed = [n for n in (Ledger.replay(r, delivery) for r in records) if n is not None]
    if replayed:
        notices = [n.reply() for n in replayed]
        return Outcome("replay", effect="+".join(sorted({n.transition for n in replayed})), subject=subject,
                       reason=wording.REDELIVERED, reply=_one(subject, notices)), notices
    judged = judge(found, ctx, events)  # the state, read after the records
    if judged is None:
        return Outcome("gone", subject=subject, reason=wording.said(say("migration-gone"))), []
    found, facts, verdict = judged
    vm = facts.vm
    return act(verdict, found, dict(vm) if vm else None, facts.detail, records, ctx, delivery, tick)


def judge(found: Target, ctx: KubeContext[Settings], events: list[dict]) -> tuple[Target, Facts, Verdict] | None:
    """The state read fresh (_look) and decided; for a VM stuck past its threshold (`Action.EXPLAIN`), what explains
    it read (reads.read_detail, with the VM's `events`) and decided again. None as _look. Writes nothing: `vmevents
    explain` asks this too (functions/vm_stuck_report/explain.py)."""
    fresh = _look(found, ctx)
    if fresh is None:
        return None
    found, facts = fresh
    now = ctx.clock()
    verdict = decide(facts, ctx.settings, now)
    vm, vmi, vmim = facts.vm, facts.vmi, facts.vmim
    if verdict.action is Action.EXPLAIN and verdict.stuck is not None and vm is not None:
        facts = replace(facts, detail=read_detail(ctx, verdict.stuck, dict(vm), dict(vmi) if vmi else None,
                                                  dict(vmim) if vmim else None, events))
        verdict = decide(facts, ctx.settings, now)
    return found, facts, verdict


def _look(found: Target, ctx: KubeContext[Settings]) -> tuple[Target, Facts] | None:
    """The VM, its VMI and the VMIM (and, for a VM printing a DataVolume state, its DataVolumes), read fresh; None
    for a Reference-mode VMIM event whose VMIM is gone (its VMI unknown)."""
    vmim = ctx.kube.get(VMIM, found.namespace, found.migration) if found.migration else None
    if found.migration and not found.name:  # a Reference-mode VMIM event: the VMIM names its VMI
        if vmim is None or not o.text(vmim, "spec", "vmiName"):
            return None
        found = replace(found, name=o.string(vmim, "spec", "vmiName"))
    vm = ctx.kube.get(VM, found.namespace, found.name)
    vmi = ctx.kube.get(VMI, found.namespace, found.name) if vm is not None else None
    datavolumes = read_datavolumes(ctx, vm) if vm is not None and \
        o.string(vm, "status", "printableStatus") in DV_STATES else ()
    return found, Facts(vm, vmi, vmim, migration_gone=bool(found.migration) and vmim is None, datavolumes=datavolumes)


# -- parse: which VM is this event about? (no API calls) ------------------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str                     # the VM (its VMI has the same name)
    migration: str | None = None  # a VMIM that does not start

    @property
    def key(self) -> tuple[str, str, str]:
        return self.namespace, self.name, self.migration or ""


def target(event: Incoming, settings: Settings) -> Target | None:
    """The VM worth a fresh look, or None when the event cannot concern a stuck VM: a VM whose status is not a
    stuck state, a migration that is not pending, a deletion (the re-scan ends what it leaves)."""
    found = about(event, ("VirtualMachine", "VirtualMachineInstanceMigration"), FUNCTION)
    if found.deleted or not settings.in_scope(found.namespace):
        return None
    if found.ref.kind == "VirtualMachine":
        if found.obj is not None and o.string(found.obj, "status", "printableStatus") not in GROUPS:
            return None
        return Target(found.namespace, found.ref.name)
    obj = found.obj
    if obj is None:  # Reference mode: the VMIM names its VMI; read it in converge
        return Target(found.namespace, "", found.ref.name)
    if (o.string(obj, "status", "phase") or "Pending") not in MIGRATION_PHASES or not o.text(obj, "spec", "vmiName"):
        return None
    return Target(found.namespace, o.string(obj, "spec", "vmiName"), found.ref.name)


_VM_TOKENS = tuple(f'"{state}"'.encode() for state in GROUPS if not state.startswith("Migration"))
_VMIM_TOKENS = (b'"Pending"', b'"Scheduling"')


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode VM event whose JSON names no stuck state, or a VMIM event naming neither Pending nor
    Scheduling, cannot be about a stuck VM: answered without decoding and without an API call (a VM that
    settled is found by the re-scan, which ends its finding)."""
    if headers.get("ce-kind") == "VirtualMachineInstanceMigration":
        return may_concern(headers, body, ("VirtualMachineInstanceMigration",), _VMIM_TOKENS)
    return may_concern(headers, body, ("VirtualMachine",), _VM_TOKENS)


def _subject(found: Target) -> str:
    if found.migration:
        return VMIM.path(found.namespace, found.migration)
    return VM.path(found.namespace, found.name)


def _target_of_record(record: Record) -> Target:
    details = record.finding.details
    return Target(record.involved.get("namespace") or record.namespace, str(record.involved.get("name") or ""),
                  str(details["migration"]) if details.get("migration") else None)


# -- act: the finding's life ------------------------------------------------------------------------
def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASON, RESOLVED_REASON)


def _records(events: list[dict], found: Target) -> list[Record]:
    """This function's findings on this VM, for this target (a migration's, or the VM's own)."""
    out = []
    for event in events:
        record = record_of(event) if source_of(event) == FUNCTION else None
        if record is None or record.finding.function != FUNCTION:
            continue
        if (record.finding.details.get("migration") or None) != found.migration:
            continue
        out.append(record)
    return out


def act(verdict: Verdict, found: Target, vm: dict | None, detail: Detail | None, records: list[Record],
        ctx: KubeContext[Settings], delivery: str, tick: bool) -> tuple[Outcome, list[Reply]]:
    """The finding's life: an episode is one group's stuck spell of one instance (its identity: category
    `stuck-<group>` and the instance's uid). Every open finding of this target that is not the episode now
    reported (or waited on) ends, once: another instance, or the same one in another group (stuck starting, then
    stuck stopping: the starting finding is over, not a second alert beside the new one). Each transition is one
    notice; several go back in one `.batch` reply."""
    subject, now, ledger = _subject(found), ctx.clock(), _ledger(ctx)
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value, verdict.cause.value if verdict.cause else "",
                          metrics.trigger())
    s = verdict.stuck
    episode = (f"stuck-{s.group}", s.instance) if verdict.action is Action.REPORT and s is not None else None
    waiting = (f"stuck-{s.group}", s.instance) if verdict.action is Action.WAIT and s is not None else None
    notices: list[Reply] = []
    for record in (r for r in records if r.open and _identity(r) not in (episode, waiting)):
        moved = s is not None and record.finding.category != f"stuck-{s.group}" and (episode or waiting) is not None
        because = (wording.moved_on(s) if moved and s is not None else wording.new_episode() if episode is not None
                   else wording.replaced(verdict) if verdict.action is Action.WAIT else wording.reason(verdict))
        notice = ledger.resolve(record, delivery, now, summary=wording.resolved_message(record, because),
                                details={"because": because})
        if notice is not None:  # a VMStuckResolved Event tells the end, beside the finding's Warning
            notices.append(notice.reply())
    if episode is None or vm is None or s is None:
        return Outcome(verdict.action.value, effect="resolved" if notices else "none", subject=subject,
                       reason=wording.reason(verdict), reply=_one(subject, notices)), notices
    opened = wording.finding(verdict, vm, found.migration, detail)
    read = next((r for r in records if _identity(r) == episode), None)  # as read before the state
    current = read if read is not None and read.open else None
    changed = current is not None and current.finding.details.get("cause") != opened.details.get("cause")
    notice = ledger.sighted(opened, vm, delivery, now, message=opened.summary, count=not tick, update=changed,
                            read=read.resource_version if read is not None else "")
    effect = "seen-again" if notice is None else \
        f"detected-{verdict.cause.value if verdict.cause else 'unknown'}"
    if notice is not None:
        notices.append(notice.reply())
    if notices and effect == "seen-again":
        effect = "resolved"
    return Outcome(verdict.action.value, effect=effect, subject=subject, reason=wording.reason(verdict),
                   reply=_one(subject, notices)), notices


def _identity(record: Record) -> tuple[str, str]:
    return record.finding.category, record.finding.key


def _one(subject: str, notices: list[Reply]) -> Reply | None:
    return one_or_summary(FUNCTION, subject, notices, wording.batch(len(notices)))

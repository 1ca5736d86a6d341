"""io-pause-report's I/O: catch a VM flapping Running↔Paused on IO errors and tie it to its Longhorn volume.

Operators see only the flapping (docs/facts.md §5); this function says which volume, whether it is
rebuilding, and what to do. The flow: on_event and rescan → converge: read the VMI, its volumes → PVC →
PV → Longhorn Volume and Engine, and the Events about it → decide (decide.py) → act: record Events (it
changes nothing else) and reply (wording.py). The helpers follow in that order.

It is stateless: an *episode* (one spell of flapping) is a finding (shared/ledger.py), kept in one
`IOErrorPause` Event on the VM whose finding details hold the episode's facts. The first pause opens it;
each further pause is a sighting (its count rises); getting stuck paused updates its details; the end
resolves it (and records a Normal `IOErrorPauseResolved` for people). Two replies per episode:
`.detected` once and `.resolved` once. The re-scan renews what is open, so an episode outlives the
Event TTL.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from functions.io_pause_report.decide import (
    Action,
    Episode,
    Facts,
    KubeVirtErrors,
    Verdict,
    decide,
    io_paused,
)
from functions.io_pause_report.settings import Settings
from functions.io_pause_report.volumes import NO_SPACE, fetch_volumes, to_int
from functions.io_pause_report.wording import advice, event_message, finding, named, reply_data
from shared import kubevirt as kv
from shared import metrics
from shared import rescan as rescans
from shared.finding import summary
from shared.intake import Incoming, about, may_concern
from shared.kinds import EVENT, NAMESPACE, VMI
from shared.ledger import Ledger, Record, record_of
from shared.runtime import KubeContext, Outcome

FUNCTION = "io-pause-report"
REASON = "IOErrorPause"
RESOLVED_REASON = "IOErrorPauseResolved"
KUBEVIRT_REASON = "IOerror"                      # pkg/virt-launcher/virtwrap/cache... SendK8sEvent (docs/facts.md §5)

_KUBEVIRT_VOLUME = re.compile(r"(?:at the volume|on volume): (\S+)")


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return converge(found, ctx, delivery=event.id)


def rescan(ctx: KubeContext[Settings], delivery: str) -> Outcome:
    """VMIs still paused on an IO error (stuck? a missed event?), then every open episode (ended?); what
    stays open is renewed so that its Event outlives the TTL. Cheap first (docs/api-cost.md): each VMI's Paused
    cell (Table rows, cells only, from the watch cache) and KubeVirt's IOerror Events; only candidates are read
    in full and converged, within the budget (shared/rescan.py)."""
    began, scanned, candidates = rescans.begin(), 0, dict[tuple[str, str], Target]()
    # A pause is an IO-error pause only with KubeVirt's IOerror Event on the VMI (docs/facts.md §5): a VMI
    # paused by a user or the migration monitor is not even read.
    io_errors = {Target(str(i.get("namespace") or kv.meta(e).get("namespace") or "default"), str(i.get("name")))
                 for e in ctx.kube.list(EVENT, field_selector=f"reason={KUBEVIRT_REASON}", cached=True)
                 if isinstance(i := e.get("involvedObject"), dict) and i.get("kind") == "VirtualMachineInstance"}
    namespaces = sorted(ns["metadata"]["name"] for ns in ctx.kube.list_metadata(NAMESPACE, cached=True))
    for namespace, rows in zip(namespaces, rescans.gather(namespaces, lambda namespace: list(
            ctx.kube.list_rows(VMI, namespace, cached=True, metadata=False)), ctx.settings.rescan), strict=True):
        scanned += len(rows)
        for found in (Target(namespace, r["metadata"]["name"]) for r in rows if r["cells"].get("paused") == "True"):
            if found in io_errors:
                candidates.setdefault((found.namespace, found.name), found)
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None))  # resolved ones too: a redelivered tick answers as it did
    for record in on_record:
        if record.open or Ledger.replay(record, delivery):
            found = _target_of_record(record)
            candidates.setdefault((found.namespace, found.name), found)
    scan = rescans.run([candidates[k] for k in sorted(candidates)], lambda found: converge(found, ctx, delivery).reply,
                       ctx.settings.rescan, started=began, rotation=rescans.tick_number(ctx.clock()))
    replies = sorted(scan.results, key=lambda r: (r.subject or "", r.type))
    renewed = ledger.renew_stale(on_record, ctx.clock())
    reason = (f"scanned {scanned} VMI(s) and {len(candidates)} paused or in an episode; {len(replies)} finding(s), "
              f"{renewed} renewed; {scan.progress()}")
    reply = summary(FUNCTION, "scanned", f"/vmevents/{FUNCTION}/rescan", replies, reason, {"vmis": scanned})
    return Outcome("rescan", effect=f"reported-{len(replies)}" if reply else "none", reason=reason, reply=reply)


def converge(found: Target, ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """Read fresh, decide, record. Nothing but Events is ever written, so there is nothing to retry.
    `delivery`: the id of the event being handled (a redelivery of it answers as it did)."""
    seen = look(found, ctx)
    for record in seen.records:  # a redelivery of the event that opened or ended an episode answers as it did
        notice = Ledger.replay(record, delivery)
        if notice is not None:
            return Outcome("replay", effect=notice.transition, subject=seen.subject, reason="a redelivered event",
                           reply=notice.reply())
    verdict, facts, nothing = judge(seen, ctx)
    if verdict is None or facts is None:
        if seen.vmi is None:
            return Outcome("gone", subject=seen.subject, reason=nothing)
        metrics.DECISIONS.inc(FUNCTION, Action.SKIP.value, "not-paused", metrics.trigger())
        return Outcome(Action.SKIP.value, subject=seen.subject, reason=nothing)
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value, named(verdict.category) if verdict.category else "",
                          metrics.trigger())
    return act(verdict, facts, found, seen.vmi, seen.involved, _open(seen.records), ctx, delivery)


@dataclass(frozen=True)
class Look:
    """What one VMI's convergence reads first: its Events (the episode on record among them) before the VMI, so an
    episode is never judged over by a view of the VMI older than the episode (shared/ledger.py, Races)."""

    subject: str
    events: list[dict]
    vmi: dict | None
    involved: dict
    records: list[Record]


def look(found: Target, ctx: KubeContext[Settings]) -> Look:
    events = list(ctx.kube.list(EVENT, found.namespace, field_selector=f"involvedObject.name={found.name}"))
    vmi = ctx.kube.get(VMI, found.namespace, found.name)
    involved = involved_object(vmi, events, found)
    return Look(VMI.path(found.namespace, found.name), events, vmi, involved, _records(events, involved))


def judge(seen: Look, ctx: KubeContext[Settings]) -> tuple[Verdict | None, Facts | None, str]:
    """The rest of the reads (the volumes, down to Longhorn) and the decision: (verdict, facts, ""), or (None,
    None, why there is nothing to decide). `vmevents explain` asks this too (functions/io_pause_report/explain.py)."""
    episode = read_episode(seen.events, seen.involved)
    if seen.vmi is None and episode is None:
        return None, None, "the VMI no longer exists"
    if io_paused(seen.vmi) is None and episode is None:
        return None, None, "not paused by an IO error"
    errors = kubevirt_errors(seen.events, seen.vmi)
    volumes = fetch_volumes(ctx, seen.vmi, errors) if seen.vmi is not None else ()
    facts = Facts(volumes, errors, baseline_after_last_episode(seen.events, seen.involved, seen.vmi), vmi=seen.vmi,
                  episode=episode)
    return decide(facts, ctx.settings, ctx.clock()), facts, ""


# -- parse: which VMI is this event about? (no API calls) ------------------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str


def target(event: Incoming) -> Target | None:
    """The VMI worth a fresh look, or None when the event cannot concern an IO-error pause."""
    found = about(event, ("VirtualMachineInstance",), FUNCTION)
    if found.deleted or (found.obj is not None and io_paused(found.obj) is None):
        return None
    return Target(found.ref.namespace or "default", found.ref.name)  # about() already defaults it so


_TOKEN = b'"PausedIOError"'


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode VMI event whose JSON does not contain "PausedIOError" cannot be about an
    IO-error pause (a Running VMI, or one paused by a user or the migration monitor): it is answered
    without decoding and without an API call. An episode's end is found by the re-scan."""
    return may_concern(headers, body, ("VirtualMachineInstance",), (_TOKEN,))


def _target_of_record(record: Record) -> Target:
    """Our Events are on the VM (same name as its VMI) or on a standalone VMI."""
    return Target(record.involved.get("namespace") or record.namespace, record.involved.get("name") or "")


# -- read: the episode, KubeVirt's errors, the volumes down to Longhorn ----------------------------
def involved_object(vmi: dict | None, events: list[dict], found: Target) -> dict:
    """What the Events are recorded on: the VM (from the VMI's ownerReference, no read needed), else
    the standalone VMI; for a VMI that is gone, the object our earlier Events were recorded on."""
    if vmi is not None:
        owner = kv.controller_owner(vmi, "VirtualMachine")
        if owner:
            return {"apiVersion": owner.get("apiVersion", "kubevirt.io/v1"), "kind": "VirtualMachine",
                    "metadata": {"name": owner["name"], "namespace": found.namespace, "uid": owner.get("uid")}}
        return vmi
    for record in _records(events, None):
        obj = record.involved
        return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                "metadata": {"name": obj["name"], "namespace": found.namespace, "uid": obj.get("uid")}}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": found.name, "namespace": found.namespace}}


def _records(events: list[dict], involved: dict | None) -> list[Record]:
    """This function's finding Events among these (on the same kind of object as `involved`), newest first."""
    found = []
    for event in events:
        record = record_of(event) if (event.get("source") or {}).get("component") == FUNCTION else None
        if record is None or record.finding.function != FUNCTION:
            continue
        if involved is not None and record.involved.get("kind") != involved.get("kind"):
            continue
        found.append(record)
    return sorted(found, key=lambda r: r.opened_at.isoformat() if r.opened_at else "", reverse=True)


def _open(records: list[Record]) -> Record | None:
    return next((r for r in records if r.open), None)


def read_episode(events: list[dict], involved: dict) -> Episode | None:
    """The open episode: the finding Event of ours that is open, its facts in the finding's details."""
    record = _open(_records(events, involved))
    return None if record is None else _episode_of(record)


def baseline_after_last_episode(events: list[dict], involved: dict, vmi: dict | None) -> int:
    """KubeVirt's IOerror count for this VMI when its last episode ended (its Events keep counting)."""
    uid = kv.meta(vmi).get("uid") if vmi else None
    counts = [to_int(r.finding.details.get("kubevirtCount")) for r in _records(events, involved)
              if not r.open and uid and r.finding.details.get("vmiUid") == uid]
    return max(counts, default=0)


def kubevirt_errors(events: list[dict], vmi: dict | None) -> KubeVirtErrors:
    """KubeVirt's IOerror Events on this very VMI (a restarted VM's new VMI has a new uid). One pause sends one
    Event per failing volume (docs/facts.md §5), and each Event's count rises once per pause of its volume: the
    pauses are the most any one volume counted, never the sum (two failing disks are not two pauses)."""
    if vmi is None:
        return KubeVirtErrors()
    uid = kv.meta(vmi).get("uid")
    per_volume: dict[str, int] = {}
    volumes, no_space, last = [], None, None
    for event in events:
        obj = event.get("involvedObject") or {}
        if event.get("reason") != KUBEVIRT_REASON or obj.get("kind") != "VirtualMachineInstance" \
                or obj.get("uid") != uid:
            continue
        message = event.get("message") or ""
        match = _KUBEVIRT_VOLUME.search(message)
        volume = match.group(1) if match else ""
        per_volume[volume] = per_volume.get(volume, 0) + to_int(event.get("count") or 1)
        if match and volume not in volumes:
            volumes.append(volume)
        if NO_SPACE.search(message):
            no_space = message
        when = kv.parse_time(event.get("lastTimestamp") or event.get("eventTime"))
        if when and (last is None or when > last):
            last = when
    return KubeVirtErrors(max(per_volume.values(), default=0), tuple(volumes), no_space, last)


# -- act: the finding's life (shared/ledger.py), and reply ---------------------------------------
def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    # the episode's Event, IOErrorPause; its end, IOErrorPauseResolved (on the same object)
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASON, RESOLVED_REASON)


def act(verdict: Verdict, facts: Facts, found: Target, vmi: dict | None, involved: dict, record: Record | None,
        ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    subject = VMI.path(found.namespace, found.name)
    now = ctx.clock()
    ledger = _ledger(ctx)
    action = verdict.action
    if action is Action.COUNT and record is not None:  # another pause: a sighting, its count rises
        seen = replace(record.finding, details={**record.finding.details, "pauses": verdict.pauses})
        # Set to the pauses seen, not raised by one: deliveries that saw the same pause at once count it once.
        ledger.sighted(seen, involved, delivery, now, message=record.finding.summary, count_to=verdict.pauses)
        return Outcome(action.value, effect="counted", subject=subject, reason=verdict.reason)
    if action not in (Action.REPORT, Action.ESCALATE, Action.RESOLVE):
        return Outcome(action.value, subject=subject, reason=verdict.reason)
    vmi_name, advised = f"{found.namespace}/{found.name}", advice(verdict, facts, ctx.settings)
    message = event_message(verdict, vmi_name, advised if action is not Action.RESOLVE else ())
    if action is Action.RESOLVE and record is not None:
        data = reply_data(verdict, vmi_name, None, _episode_of(record), ())
        notice = ledger.resolve(record, delivery, now, summary=message, details={
            "reason": verdict.reason, "pauses": verdict.pauses, "kubevirtCount": verdict.kubevirt_total,
            "reportedCategories": data["reportedCategories"]})
        if notice is None:  # two deliveries raced to the end: the other one announces it
            return Outcome(action.value, effect="already-resolved", subject=subject,
                           reason="another delivery already announced the end of this episode")
        return Outcome(action.value, effect="resolved", subject=subject, reason=verdict.reason, reply=notice.reply())
    if action is Action.ESCALATE and record is not None:  # stuck paused: the same episode, told in its details
        categories = sorted(set(record.finding.details.get("reportedCategories") or ()) | {named(verdict.category)})
        stuck = replace(record.finding, advice=advised, details={
            **record.finding.details, "reportedCategories": categories, "stuck": True, "pauses": verdict.pauses,
            "pausedSince": reply_data(verdict, vmi_name, None, None, advised)["pausedSince"]})
        ledger.sighted(stuck, involved, delivery, now, message=record.finding.summary, count=False, update=True)
        ctx.recorder.record(involved, "Warning", REASON, message, now)  # for people: it is stuck now
        return Outcome(action.value, effect="escalated", subject=subject, reason=verdict.reason)
    vm = f"{found.namespace}/{kv.meta(involved)['name']}" if involved.get("kind") == "VirtualMachine" else None
    uid = kv.meta(vmi).get("uid") if vmi else ""
    opened = finding(verdict, vmi_name, vm, uid or "", advised, message)
    notice = ledger.sighted(opened, involved, delivery, now, message=message, count_to=verdict.pauses)
    if notice is None:  # another delivery opened it a moment ago: the same pause, counted once
        return Outcome(action.value, effect="seen-again", subject=subject, reason=verdict.reason)
    return Outcome(action.value, effect=f"detected-{named(verdict.category)}", subject=subject,
                   reason=verdict.reason, reply=notice.reply())


def _episode_of(record: Record) -> Episode:
    """The episode a finding Event holds (read_episode's reading of one record)."""
    d = record.finding.details
    return Episode(start=str(d.get("episodeStart") or ""), vmi_uid=str(d.get("vmiUid") or ""),
                   baseline=to_int(d.get("baseline")), count=record.count, last=record.last_counted,
                   categories=frozenset(d.get("reportedCategories") or (record.finding.category,)),
                   message=record.finding.summary, category=record.finding.category,
                   reported_volumes=d["volumes"] if isinstance(d.get("volumes"), list) else None,
                   annotations={}, involved=dict(record.involved))

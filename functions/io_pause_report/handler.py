"""io-pause-report's I/O: catch a VM flapping Running↔Paused on IO errors and tie it to its Longhorn volume.

Operators see only the flapping (docs/facts.md §5); this function says which volume, whether it is
rebuilding, and what to do. The flow: on_event and rescan → converge: read the VMI, its volumes → PVC →
PV → Longhorn Volume and Engine, and the Events about it → decide (decide.py) → act: record Events (it
changes nothing else) and reply (wording.py). The helpers follow in that order.

It is stateless: an *episode* (one spell of flapping) lives in the Events it records. The first
pause records a Warning `IOErrorPause` on the VM whose annotations name the episode; each further
pause records it again (its count rises); the end records a Normal `IOErrorPauseResolved` with the
same episode annotation. Two replies per episode: `.detected` once (and once more if it gets stuck
paused) and `.resolved` once.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from functions.io_pause_report.decide import (
    Action,
    Episode,
    Facts,
    KubeVirtErrors,
    Verdict,
    VolumeFacts,
    decide,
    io_paused,
)
from functions.io_pause_report.settings import Settings
from functions.io_pause_report.wording import advice, event_message, named, reply_data, volume_data
from shared import kubevirt as kv
from shared import rescan as rescans
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, LONGHORN_ENGINE, LONGHORN_VOLUME, NAMESPACE, PV, PVC, VMI, KubeError
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome

FUNCTION = "io-pause-report"
REASON = "IOErrorPause"
RESOLVED_REASON = "IOErrorPauseResolved"
KUBEVIRT_REASON = "IOerror"                      # pkg/virt-launcher/virtwrap/cache... SendK8sEvent (docs/facts.md §5)
LONGHORN_DRIVER = "driver.longhorn.io"
LONGHORN_VOLUME_LABEL = "longhornvolume"         # longhorn-manager types.GetVolumeLabels, on every Engine
# Annotations on the Events this function records: the episode's facts, read back on the next event.
# Their names are kept as first recorded, so that an upgrade in the middle of an episode reads it back.
EPISODE = "vmevents.io/io-pause-episode"         # when the episode's first pause began (RFC 3339)
CATEGORY = "vmevents.io/io-pause-class"          # the category reported by this Event
VMI_UID = "vmevents.io/io-pause-vmi-uid"         # the VMI instance the episode is about
BASELINE = "vmevents.io/io-pause-baseline"       # KubeVirt's IOerror count before the episode began
FINAL_COUNT = "vmevents.io/io-pause-kubevirt-count"  # on the resolved Event: KubeVirt's count at the end
VOLUMES = "vmevents.io/io-pause-volumes"         # the volumes reported (JSON): `.resolved` names the same ones
RESOLVED_BY = "vmevents.io/io-pause-resolved-by"  # on the resolved Event: the id of the event that recorded it

_NO_SPACE = re.compile(r"not enough space|no space|insufficient storage", re.IGNORECASE)
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
    """VMIs still paused on an IO error (stuck? a missed event?), then every open episode (ended?). Cheap
    first (docs/api-cost.md): each VMI's Paused cell (Table rows, cells only, from the watch cache) and the
    Events; only candidates are read in full and converged, within the budget (shared/rescan.py)."""
    began, scanned, candidates = rescans.begin(), 0, dict[tuple[str, str], Target]()
    # A pause is an IO-error pause only with KubeVirt's IOerror Event on the VMI (docs/facts.md §5): a VMI
    # paused by a user or the migration monitor is not even read.
    io_errors = {_target_of_event(e) for e in ctx.kube.list(EVENT, field_selector=f"reason={KUBEVIRT_REASON}",
                                                            cached=True)
                 if (e.get("involvedObject") or {}).get("kind") == "VirtualMachineInstance"}
    namespaces = sorted(ns["metadata"]["name"] for ns in ctx.kube.list_metadata(NAMESPACE, cached=True))
    for namespace, rows in zip(namespaces, rescans.gather(namespaces, lambda namespace: list(
            ctx.kube.list_rows(VMI, namespace, cached=True, metadata=False)), ctx.settings.rescan), strict=True):
        scanned += len(rows)
        for found in (Target(namespace, r["metadata"]["name"]) for r in rows if r["cells"].get("paused") == "True"):
            if found in io_errors:
                candidates.setdefault((found.namespace, found.name), found)
    for event in ctx.kube.list(EVENT, field_selector=f"reason={REASON}", cached=True):
        if (event.get("source") or {}).get("component") == FUNCTION:
            found = _target_of_event(event)
            candidates.setdefault((found.namespace, found.name), found)

    def visit(found: Target) -> dict | None:  # each finding keeps its own type and subject inside the summary
        reply = converge(found, ctx, delivery=delivery).reply
        return None if reply is None else {"type": reply.type, "subject": reply.subject, **reply.data}

    scan = rescans.run([candidates[k] for k in sorted(candidates)], visit, ctx.settings.rescan, started=began,
                       rotation=rescans.tick_number(ctx.clock()))
    findings = scan.results
    reason = (f"scanned {scanned} VMI(s) and {len(candidates)} paused or in an episode; {len(findings)} finding(s); "
              f"{scan.progress()}")
    if not findings:
        return Outcome("rescan", reason=reason)
    key = "|".join(sorted(f"{f['type']}:{f['vmi']}:{f['episodeStart']}:{f['category']}" for f in findings))
    reply = Reply(reply_type(FUNCTION, "scanned"), f"/vmevents/{FUNCTION}/rescan",
                  {"scanned": scanned, "findings": sorted(findings, key=lambda f: (f["vmi"], f["type"]))}, key=key)
    return Outcome("rescan", effect=f"reported-{len(findings)}", reason=reason, reply=reply)


def converge(found: Target, ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    """Read fresh, decide, record. Nothing but Events is ever written, so there is nothing to retry.
    `delivery`: the id of the event being handled (a redelivery of it answers as it did)."""
    vmi = ctx.kube.get(VMI, found.namespace, found.name)
    events = list(ctx.kube.list(EVENT, found.namespace, field_selector=f"involvedObject.name={found.name}"))
    subject = VMI.path(found.namespace, found.name)
    involved = involved_object(vmi, events, found)
    episode = read_episode(events, involved)
    if vmi is None and episode is None:
        return Outcome("gone", subject=subject, reason="the VMI no longer exists")
    if io_paused(vmi) is None and episode is None:
        return Outcome(Action.SKIP.value, subject=subject, reason="not paused by an IO error")
    errors = kubevirt_errors(events, vmi)
    volumes = fetch_volumes(ctx, vmi, errors) if vmi is not None else ()
    facts = Facts(volumes, errors, baseline_after_last_episode(events, involved, vmi))
    verdict = decide(vmi, facts, episode, ctx.settings, ctx.clock())
    return act(verdict, facts, found, vmi, involved, episode, ctx, delivery)


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


def _target_of_event(event: dict) -> Target:
    """Our Events are on the VM (same name as its VMI) or on a standalone VMI."""
    obj = event.get("involvedObject") or {}
    return Target(obj.get("namespace") or kv.meta(event).get("namespace") or "default", obj["name"])


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
    for event in _ours(events, REASON):
        obj = event["involvedObject"]
        return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                "metadata": {"name": obj["name"], "namespace": found.namespace, "uid": obj.get("uid")}}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": found.name, "namespace": found.namespace}}


def _ours(events: Iterable[dict], reason: str, involved: dict | None = None) -> list[dict]:
    found = []
    for event in events:
        if event.get("reason") != reason or (event.get("source") or {}).get("component") != FUNCTION:
            continue
        if involved is not None and (event.get("involvedObject") or {}).get("kind") != involved.get("kind"):
            continue
        found.append(event)
    return found


def read_episode(events: list[dict], involved: dict) -> Episode | None:
    """The open episode: our IOErrorPause Events whose episode has no IOErrorPauseResolved yet."""
    ended = {kv.annotations_of(e).get(EPISODE) for e in _ours(events, RESOLVED_REASON, involved)}
    open_ = [e for e in _ours(events, REASON, involved) if kv.annotations_of(e).get(EPISODE) not in ended | {None}]
    if not open_:
        return None
    start = max(kv.annotations_of(e)[EPISODE] for e in open_)
    mine = sorted((e for e in open_ if kv.annotations_of(e)[EPISODE] == start),
                  key=lambda e: (e.get("firstTimestamp") or "", kv.meta(e).get("creationTimestamp") or ""))
    first, notes = mine[0], kv.annotations_of(mine[0])
    lasts = [t for t in (kv.parse_time(e.get("lastTimestamp")) for e in mine) if t]
    return Episode(start=start, vmi_uid=notes.get(VMI_UID, ""), baseline=_int(notes.get(BASELINE)),
                   count=int(first.get("count") or 1), last=max(lasts) if lasts else None,
                   categories=frozenset(kv.annotations_of(e).get(CATEGORY, "") for e in mine),
                   message=first.get("message", ""), category=notes.get(CATEGORY),
                   reported_volumes=_reported_volumes(notes), annotations=dict(notes),
                   involved=dict(first.get("involvedObject") or {}))


def _reported_volumes(notes: Mapping[str, str]) -> list[dict] | None:
    """The volumes of the first report, so that `.resolved` names what `.detected` named."""
    try:
        volumes = json.loads(notes.get(VOLUMES) or "null")
    except ValueError:
        return None
    return volumes if isinstance(volumes, list) else None


def baseline_after_last_episode(events: list[dict], involved: dict, vmi: dict | None) -> int:
    """KubeVirt's IOerror count for this VMI when its last episode ended (its Events keep counting)."""
    uid = kv.meta(vmi).get("uid") if vmi else None
    counts = [_int(kv.annotations_of(e).get(FINAL_COUNT)) for e in _ours(events, RESOLVED_REASON, involved)
              if uid and kv.annotations_of(e).get(VMI_UID) == uid]
    return max(counts, default=0)


def kubevirt_errors(events: list[dict], vmi: dict | None) -> KubeVirtErrors:
    """KubeVirt's IOerror Events on this very VMI (a restarted VM's new VMI has a new uid)."""
    if vmi is None:
        return KubeVirtErrors()
    uid = kv.meta(vmi).get("uid")
    total, volumes, no_space, last = 0, [], None, None
    for event in events:
        obj = event.get("involvedObject") or {}
        if event.get("reason") != KUBEVIRT_REASON or obj.get("kind") != "VirtualMachineInstance" \
                or obj.get("uid") != uid:
            continue
        total += int(event.get("count") or 1)
        message = event.get("message") or ""
        match = _KUBEVIRT_VOLUME.search(message)
        if match and match.group(1) not in volumes:
            volumes.append(match.group(1))
        if _NO_SPACE.search(message):
            no_space = message
        when = kv.parse_time(event.get("lastTimestamp") or event.get("eventTime"))
        if when and (last is None or when > last):
            last = when
    return KubeVirtErrors(total, tuple(volumes), no_space, last)


def fetch_volumes(ctx: KubeContext[Settings], vmi: dict, errors: KubeVirtErrors) -> tuple[VolumeFacts, ...]:
    """The volumes KubeVirt named (else every PVC-backed volume), each followed to Longhorn."""
    specs = ((vmi.get("spec") or {}).get("volumes") or [])
    by_name = {v.get("name"): v for v in specs}
    names = list(errors.volumes) or [v.get("name") for v in specs
                                     if v.get("persistentVolumeClaim") or v.get("dataVolume")]
    return tuple(_follow(ctx, kv.meta(vmi)["namespace"], name, by_name.get(name)) for name in names)


def _follow(ctx: KubeContext[Settings], namespace: str, name: str, spec: dict | None) -> VolumeFacts:
    claim = ((spec or {}).get("persistentVolumeClaim") or {}).get("claimName") or \
        ((spec or {}).get("dataVolume") or {}).get("name")
    if not claim:
        source = next((k for k in (spec or {}) if k != "name"), None)
        return VolumeFacts(name, unknown=f"not backed by a PVC ({source or 'not in the VMI spec'})")
    facts = VolumeFacts(name, pvc=claim)
    try:
        pvc = ctx.kube.get(PVC, namespace, claim)
        if pvc is None:
            return replace(facts, unknown=f"PVC {namespace}/{claim} not found")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        pv = ctx.kube.get(PV, None, pv_name) if pv_name else None
        if pv is None:
            return replace(facts, unknown=f"PVC {claim} is not bound to a PersistentVolume")
        facts = replace(facts, pv=pv_name)
        csi = (pv.get("spec") or {}).get("csi") or {}
        if csi.get("driver") != LONGHORN_DRIVER or not csi.get("volumeHandle"):
            return replace(facts, unknown=f"not a Longhorn volume (CSI driver {csi.get('driver') or 'none'})")
        return _longhorn(ctx, replace(facts, longhorn_volume=csi["volumeHandle"]), csi["volumeHandle"])
    except KubeError as exc:  # unreadable: still report the pause, and say why the storage is unknown
        return replace(facts, unknown=f"could not be read ({exc})")


def _longhorn(ctx: KubeContext[Settings], facts: VolumeFacts, name: str) -> VolumeFacts:
    namespace = ctx.settings.longhorn_namespace
    volume = ctx.kube.get(LONGHORN_VOLUME, namespace, name)
    if volume is None:
        return replace(facts, unknown=f"Longhorn volume {namespace}/{name} not found")
    engines = [e for e in ctx.kube.list(LONGHORN_ENGINE, namespace, label_selector=f"{LONGHORN_VOLUME_LABEL}={name}")
               if (e.get("spec") or {}).get("volumeName") in (None, name)]
    return longhorn_facts(facts, volume, engines)


def longhorn_facts(facts: VolumeFacts, volume: dict, engines: list[dict]) -> VolumeFacts:
    """Robustness and state from the Volume; rebuild progress from its Engines' rebuildStatus."""
    status, spec = volume.get("status") or {}, volume.get("spec") or {}
    rebuilds = [r for e in engines for r in ((e.get("status") or {}).get("rebuildStatus") or {}).values()
                if isinstance(r, dict) and r.get("isRebuilding")]
    progress = min((int(r.get("progress") or 0) for r in rebuilds), default=None)
    full = next((f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or ()
                 if _NO_SPACE.search(f"{c.get('reason')} {c.get('message')}")), None)
    full = full or next((r.get("error") for e in engines
                         for r in ((e.get("status") or {}).get("rebuildStatus") or {}).values()
                         if isinstance(r, dict) and _NO_SPACE.search(r.get("error") or "")), None)
    return replace(facts, robustness=status.get("robustness"), state=status.get("state"), rebuilding=bool(rebuilds),
                   progress=progress, size=_int(spec.get("size")) or None,
                   actual_size=_int(status.get("actualSize")) or None,
                   last_degraded_at=kv.parse_time(status.get("lastDegradedAt")), out_of_space=full)


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# -- act: record the Event, and reply --------------------------------------------------------------
def act(verdict: Verdict, facts: Facts, found: Target, vmi: dict | None, involved: dict, episode: Episode | None,
        ctx: KubeContext[Settings], delivery: str = "") -> Outcome:
    subject = VMI.path(found.namespace, found.name)
    now = ctx.clock()
    if verdict.action is Action.COUNT and episode is not None:
        ctx.recorder.record(involved, "Warning", REASON, episode.message, now, annotations=dict(episode.annotations))
        return Outcome(verdict.action.value, effect="counted", subject=subject, reason=verdict.reason)
    if verdict.action not in (Action.REPORT, Action.ESCALATE, Action.RESOLVE):
        return Outcome(verdict.action.value, subject=subject, reason=verdict.reason)
    vmi_name = f"{found.namespace}/{found.name}"
    advised = advice(verdict, facts, ctx.settings) if verdict.action is not Action.RESOLVE else ()
    message = event_message(verdict, vmi_name, advised)
    if verdict.action is Action.RESOLVE:
        notes = {EPISODE: verdict.episode_start or "", VMI_UID: episode.vmi_uid if episode else "",
                 FINAL_COUNT: str(verdict.kubevirt_total), RESOLVED_BY: delivery}
        # The end is announced once: two deliveries racing to it record one Event, and only the one that
        # recorded it (or a redelivery of that event) replies.
        earlier = ctx.recorder.record_once(involved, "Normal", RESOLVED_REASON, message, now, annotations=notes)
        if earlier is not None and kv.annotations_of(earlier).get(RESOLVED_BY) != delivery:
            return Outcome(verdict.action.value, effect="already-resolved", subject=subject,
                           reason="another delivery already announced the end of this episode")
    else:
        uid = kv.meta(vmi).get("uid") if vmi else (episode.vmi_uid if episode else "")
        notes = {EPISODE: verdict.episode_start or "", CATEGORY: named(verdict.category), VMI_UID: uid or "",
                 BASELINE: str(verdict.baseline),
                 VOLUMES: json.dumps([volume_data(v) for v in verdict.volumes], sort_keys=True, separators=(",", ":"))}
        ctx.recorder.record(involved, "Warning", REASON, message, now, annotations=notes)
    what = "resolved" if verdict.action is Action.RESOLVE else "detected"
    vm = f"{found.namespace}/{kv.meta(involved)['name']}" if involved.get("kind") == "VirtualMachine" else None
    data = reply_data(verdict, vmi_name, vm, episode, advised)
    category = named(verdict.category)
    key = f"{vmi_name}/{verdict.episode_start}/{what}" + (f"/{category}" if what == "detected" else "")
    reply = Reply(reply_type(FUNCTION, what), subject, data, key=key)
    return Outcome(verdict.action.value, effect=f"{what}-{category}" if what == "detected" else what,
                   subject=subject, reason=verdict.reason, reply=reply)

"""io-pause-report: catch a VM flapping Running↔Paused on IO errors and tie it to its Longhorn volume.

When the guest's disk returns an IO error, libvirt pauses the guest, KubeVirt sets the VMI condition
Paused/PausedIOError, records a Warning `IOerror` Event and resumes the guest with a backoff (10 s
doubling to 3 min); while the cause lasts the VM flaps (FACTS.md §5). The usual cause on Harvester is
filesystem trim during a Longhorn replica rebuild (the seed KB). Operators see only the flapping;
this function says which volume, whether it is rebuilding, and what to do.

Reads top to bottom: settings → parse (which VMI an event is about, no API call) → fetch (the VMI,
its volumes → PVC → PV → Longhorn Volume and Engine, and the Events about it) → decide (pure) →
act (record Events: it changes nothing else) → report (reply).

It is stateless: an *episode* (one spell of flapping) lives in the Events it records. The first
pause records a Warning `IOErrorPause` on the VM whose annotations name the episode; each further
pause records it again (its count rises); the end records a Normal `IOErrorPauseResolved` with the
same episode annotation. Two replies per episode: `.detected` once (and once more if it gets stuck
paused) and `.resolved` once.
"""
from __future__ import annotations

import enum
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from shared import kubevirt as kv
from shared.errors import TemporaryError
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, LONGHORN_ENGINE, LONGHORN_VOLUME, PV, PVC, VMI, KubeError
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome
from shared.settings import Env, SettingsError, format_duration

FUNCTION = "io-pause-report"
REASON = "IOErrorPause"
RESOLVED_REASON = "IOErrorPauseResolved"
KUBEVIRT_REASON = "IOerror"                      # pkg/virt-launcher/virtwrap/cache... SendK8sEvent (FACTS §5)
PAUSED_IO_ERROR = "PausedIOError"
LONGHORN_DRIVER = "driver.longhorn.io"
LONGHORN_VOLUME_LABEL = "longhornvolume"         # longhorn-manager types.GetVolumeLabels, on every Engine
# Annotations on the Events this function records: the episode's facts, read back on the next event.
EPISODE = "vmevents.io/io-pause-episode"         # when the episode's first pause began (RFC 3339)
CLASS = "vmevents.io/io-pause-class"             # the class reported by this Event
VMI_UID = "vmevents.io/io-pause-vmi-uid"         # the VMI instance the episode is about
BASELINE = "vmevents.io/io-pause-baseline"       # KubeVirt's IOerror count before the episode began
FINAL_COUNT = "vmevents.io/io-pause-kubevirt-count"  # on the resolved Event: KubeVirt's count at the end
VOLUMES = "vmevents.io/io-pause-volumes"         # the volumes reported (JSON): `.resolved` names the same ones

_NO_SPACE = re.compile(r"not enough space|no space|insufficient storage", re.IGNORECASE)
_KUBEVIRT_VOLUME = re.compile(r"(?:at the volume|on volume): (\S+)")

log = logging.getLogger("vmevents.io-pause-report")


class Class(str, enum.Enum):
    REBUILD = "rebuild-related"
    OUT_OF_SPACE = "out-of-space"
    STUCK = "stuck-paused"
    UNKNOWN_STORAGE = "unknown-storage"
    STORAGE_ERROR = "storage-error"    # Longhorn read fine: faulted, or neither degraded nor rebuilding


_CLASSES = {c.value for c in Class}


# -- settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    stuck_after: timedelta = timedelta(minutes=10)
    resolved_after: timedelta = timedelta(minutes=10)
    longhorn_namespace: str = "longhorn-system"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        namespace = env.raw("LONGHORN_NAMESPACE", "longhorn-system")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
            raise SettingsError(f"LONGHORN_NAMESPACE={namespace!r} is not a namespace name; "
                                f"use a value like longhorn-system.")
        return cls(stuck_after=env.duration("IO_PAUSE_STUCK_AFTER", "10m"),
                   resolved_after=env.duration("IO_PAUSE_RESOLVED_AFTER", "10m"),
                   longhorn_namespace=namespace)


# -- facts (what fetch gathers; plain values, so decide stays pure) ----------------------------------
@dataclass(frozen=True)
class VolumeFacts:
    """One VMI volume followed down to Longhorn, or why it could not be."""

    name: str                           # the VMI volume name (KubeVirt's IOerror message names it)
    pvc: str | None = None
    pv: str | None = None
    longhorn_volume: str | None = None
    robustness: str | None = None       # healthy, degraded, faulted, unknown
    state: str | None = None
    rebuilding: bool = False
    progress: int | None = None         # the lowest progress of the replicas being rebuilt
    size: int | None = None             # bytes (Longhorn spec.size)
    actual_size: int | None = None
    last_degraded_at: datetime | None = None
    out_of_space: str | None = None     # Longhorn's own words, when it says so
    unknown: str | None = None          # why this is not a Longhorn volume we could read

    @property
    def is_longhorn(self) -> bool:
        return self.unknown is None and self.longhorn_volume is not None

    def data(self) -> dict:
        return {"name": self.name, "pvc": self.pvc, "pv": self.pv, "longhornVolume": self.longhorn_volume,
                "robustness": self.robustness, "rebuilding": self.rebuilding, "progress": self.progress,
                **({"unknown": self.unknown} if self.unknown else {})}


@dataclass(frozen=True)
class KubeVirtErrors:
    """KubeVirt's IOerror Events about this VMI instance: one per affected volume, counted per pause."""

    total: int = 0
    volumes: tuple[str, ...] = ()
    no_space: str | None = None         # KubeVirt's message when it says "not enough space"
    last: datetime | None = None


@dataclass(frozen=True)
class Episode:
    """The open episode, read back from the Events this function recorded."""

    start: str                          # the EPISODE annotation
    vmi_uid: str
    baseline: int                       # KubeVirt's IOerror count before the episode
    count: int                          # pauses counted so far (the first Event's count)
    last: datetime | None               # when a pause was last counted
    classes: frozenset[str]
    message: str                        # the first Event's message: recording it again raises its count
    annotations: Mapping[str, str] = field(default_factory=dict)
    involved: Mapping = field(default_factory=dict)

    @property
    def reported_volumes(self) -> list[dict] | None:
        """The volumes of the first report, so that `.resolved` names what `.detected` named."""
        try:
            volumes = json.loads(self.annotations.get(VOLUMES) or "null")
        except ValueError:
            return None
        return volumes if isinstance(volumes, list) else None


@dataclass(frozen=True)
class Facts:
    volumes: tuple[VolumeFacts, ...] = ()
    kubevirt: KubeVirtErrors = KubeVirtErrors()
    baseline: int = 0                   # for a new episode: KubeVirt's count when the last one ended


# -- decide (pure) --------------------------------------------------------------------------------
class Action(str, enum.Enum):
    SKIP = "skip"            # not paused by an IO error, and no open episode
    REPORT = "report"        # a new episode: Warning Event + .detected
    ESCALATE = "escalate"    # the episode got stuck paused: another Warning Event + .detected
    COUNT = "count"          # another pause of the episode: the Event's count rises, no reply
    HOLD = "hold"            # nothing new (a duplicate, or another update during the same pause)
    WAIT = "wait"            # running again; the episode ends after a quiet period
    RESOLVE = "resolve"      # the episode ended: Normal Event + .resolved


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    cls: Class | None = None
    cause: Class | None = None          # the class without "stuck-paused": what the storage says
    pauses: int = 0
    paused_since: datetime | None = None
    episode_start: str | None = None
    baseline: int = 0
    volumes: tuple[VolumeFacts, ...] = ()
    advice: tuple[str, ...] = ()
    kubevirt_total: int = 0             # KubeVirt's IOerror count for this VMI, kept when an episode ends


def io_paused(vmi: dict | None) -> dict | None:
    """The VMI's Paused condition when its reason is PausedIOError (never PausedByUser or
    PausedByMigrationMonitor), else None."""
    for cond in ((vmi or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Paused" and cond.get("status") == "True" and cond.get("reason") == PAUSED_IO_ERROR:
            return cond
    return None


def decide(vmi: dict | None, facts: Facts, episode: Episode | None, settings: Settings, now: datetime) -> Decision:
    """What to report now. Pure: every fact is an argument."""
    paused = io_paused(vmi)
    since = None if paused is None else kv.parse_time(paused.get("lastTransitionTime")) or now
    same_vmi = vmi is not None and episode is not None and kv.meta(vmi).get("uid") == episode.vmi_uid
    if episode is None:
        if since is None:
            return Decision(Action.SKIP, "not paused by an IO error (no Paused condition with reason PausedIOError)")
        pauses = max(1, facts.kubevirt.total - facts.baseline)
        return _classified(Action.REPORT, "a new episode of IO-error pauses", facts, since, now, settings,
                           pauses=pauses, start=stamp(since), baseline=facts.baseline)
    pauses = max(episode.count, facts.kubevirt.total - episode.baseline)
    if since is not None and episode.last is not None and since > episode.last:
        pauses = max(pauses, episode.count + 1)  # a pause that began after the last one we counted
    if since is None or not same_vmi:
        ended = _ended(vmi, facts, episode, settings, now, same_vmi)
        if ended:
            first = episode.annotations.get(CLASS)
            return Decision(Action.RESOLVE, ended, cls=Class(first) if first in _CLASSES else None,
                            cause=classify(facts, episode.start) if vmi is not None else None, pauses=pauses,
                            episode_start=episode.start, baseline=episode.baseline, volumes=facts.volumes,
                            kubevirt_total=facts.kubevirt.total)
        if pauses > episode.count:
            return Decision(Action.COUNT, f"pause {pauses} of the episode (it has resumed since)", pauses=pauses,
                            episode_start=episode.start)
        last = _last_pause(facts, episode)
        return Decision(Action.WAIT, f"running again since the pause at {_hms(last)}; the episode ends after "
                                     f"{format_duration(settings.resolved_after)} without a pause",
                        pauses=pauses, episode_start=episode.start)
    decision = _classified(Action.HOLD, "the same pause, already counted", facts, since, now, settings,
                           pauses=pauses, start=episode.start, baseline=episode.baseline)
    if decision.cls is Class.STUCK and Class.STUCK.value not in episode.classes:
        return replace(decision, action=Action.ESCALATE,
                       reason=f"paused since {_hms(since)}, longer than {format_duration(settings.stuck_after)}")
    if pauses > episode.count:
        return replace(decision, action=Action.COUNT, reason=f"pause {pauses} of the episode")
    return decision


def _classified(action: Action, reason: str, facts: Facts, since: datetime | None, now: datetime,
                settings: Settings, *, pauses: int, start: str, baseline: int) -> Decision:
    cause = classify(facts, start)
    stuck = since is not None and now - since >= settings.stuck_after
    cls = Class.STUCK if stuck else cause
    return Decision(action, reason, cls=cls, cause=cause, pauses=pauses, paused_since=since, episode_start=start,
                    baseline=baseline, volumes=facts.volumes, advice=advice(cls, cause, facts, since, settings),
                    kubevirt_total=facts.kubevirt.total)


def classify(facts: Facts, episode_start: str | None = None) -> Class:
    """What the storage says caused the pauses (FACTS.md §5; the seed KB)."""
    if facts.kubevirt.no_space or any(v.out_of_space for v in facts.volumes):
        return Class.OUT_OF_SPACE
    began = kv.parse_time(episode_start)
    for volume in facts.volumes:
        if not volume.is_longhorn:
            continue
        recently_degraded = (volume.last_degraded_at is not None and began is not None
                             and volume.last_degraded_at >= began - timedelta(hours=1))
        if volume.rebuilding or volume.robustness == "degraded" or recently_degraded:
            return Class.REBUILD
    if not facts.volumes or any(not v.is_longhorn for v in facts.volumes):
        return Class.UNKNOWN_STORAGE
    return Class.STORAGE_ERROR


def _ended(vmi: dict | None, facts: Facts, episode: Episode, settings: Settings, now: datetime,
           same_vmi: bool) -> str | None:
    """Why the episode is over, or None while it may still go on."""
    if vmi is None:
        return "the VMI is gone (the VM was stopped or deleted)"
    if not same_vmi:
        return "the VM was restarted: a new VMI runs"
    if kv.phase(vmi) in kv.FINAL_PHASES:
        return f"the VMI ended (phase {kv.phase(vmi)})"
    last = _last_pause(facts, episode)
    if last is not None and now - last >= settings.resolved_after:
        return f"no pause for {format_duration(settings.resolved_after)} (the last at {_hms(last)})"
    longhorn = [v for v in facts.volumes if v.is_longhorn]
    if Class.REBUILD.value in episode.classes and longhorn and len(longhorn) == len(facts.volumes) and \
            all(v.robustness == "healthy" and not v.rebuilding for v in longhorn):
        return "the rebuild completed: every Longhorn volume is healthy again and the VMI runs"
    return None


def _last_pause(facts: Facts, episode: Episode) -> datetime | None:
    times = [t for t in (facts.kubevirt.last, episode.last) if t is not None]
    return max(times) if times else None


# -- advice (one place for every sentence) ---------------------------------------------------------
TRIM_ADVICE = (
    "In Linux guests stop filesystem trim from running during rebuilds: `systemctl disable --now fstrim.timer`, "
    "or edit fstrim.timer so VMs do not trim at the same time (e.g. a RandomizedDelaySec).",
    "Drop the `discard` mount option from /etc/fstab, then `mount -o remount /` (or reboot the VM).",
    "In Windows guests: `fsutil behavior set DisableDeleteNotify 1` (query it with "
    "`fsutil behavior query DisableDeleteNotify`).",
    "Upgrade Longhorn (Harvester) to a release with the fix for trim during a replica rebuild "
    "(filesystem trim exists since Longhorn 1.4.0).",
)


def advice(cls: Class, cause: Class, facts: Facts, since: datetime | None, settings: Settings) -> tuple[str, ...]:
    out: list[str] = []
    if cls is Class.STUCK:
        out.append(f"The VMI has been paused since {_hms(since)}, longer than {format_duration(settings.stuck_after)}: "
                   f"KubeVirt is not resuming it (harvester#11585). Stop and start the VM "
                   f"(`virtctl stop` then `virtctl start`, or Stop/Start in the Harvester UI).")
    if cause is Class.REBUILD:
        rebuilding = [v for v in facts.volumes if v.rebuilding or v.robustness == "degraded"]
        for v in rebuilding or [v for v in facts.volumes if v.is_longhorn]:
            out.append(f"Longhorn volume {v.longhorn_volume} (PVC {v.pvc}) is {v.robustness or 'in an unknown state'}"
                       + (f", rebuilding a replica ({v.progress}%)" if v.rebuilding and v.progress is not None
                          else ", rebuilding a replica" if v.rebuilding else "")
                       + ": filesystem trim during a replica rebuild causes the IO errors, and the pauses end "
                         "when the rebuild completes.")
        out.extend(TRIM_ADVICE)
    elif cause is Class.OUT_OF_SPACE:
        for v in facts.volumes:
            if v.out_of_space or (facts.kubevirt.no_space and v.name in facts.kubevirt.volumes) or len(facts.volumes) == 1:
                out.append(f"Volume {v.name} (PVC {v.pvc}, Longhorn volume {v.longhorn_volume}) of size "
                           f"{_size(v.size)} (actual size {_size(v.actual_size)}) has no space left"
                           + (f": Longhorn says {v.out_of_space!r}" if v.out_of_space else "")
                           + ". Free space on the Longhorn disks that hold its replicas, or expand the volume.")
        if facts.kubevirt.no_space:
            out.append(f"KubeVirt says: {facts.kubevirt.no_space}")
    elif cause is Class.UNKNOWN_STORAGE:
        for v in facts.volumes:
            if not v.is_longhorn:
                out.append(f"Volume {v.name}" + (f" (PVC {v.pvc})" if v.pvc else "") + f": {v.unknown}; "
                           "check its storage backend for IO errors.")
        if not facts.volumes:
            out.append("KubeVirt named no volume and the VMI has no PVC-backed volume: check the VM's storage.")
    elif cause is Class.STORAGE_ERROR:
        for v in facts.volumes:
            out.append(f"Longhorn volume {v.longhorn_volume} (PVC {v.pvc}) is {v.robustness or 'unknown'} and not "
                       f"rebuilding: the IO errors have another cause; check its replicas and the nodes' disks "
                       f"in the Longhorn UI.")
    return tuple(out)


def _size(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"


def _hms(when: datetime | None) -> str:
    return "an unknown time" if when is None else stamp(when)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    return Target(found.ref.namespace, found.ref.name)


_TOKEN = b'"PausedIOError"'


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode VMI event whose JSON does not contain "PausedIOError" cannot be about an
    IO-error pause (a Running VMI, or one paused by a user or the migration monitor): it is answered
    without decoding and without an API call. An episode's end is found by the re-scan."""
    return may_concern(headers, body, ("VirtualMachineInstance",), (_TOKEN,))


# -- fetch -----------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return converge(found, ctx)


def converge(found: Target, ctx: KubeContext, vmi: dict | None = ..., events: list[dict] | None = None) -> Outcome:
    """Read fresh, decide, record. Nothing but Events is ever written, so there is nothing to retry."""
    if vmi is ...:
        vmi = ctx.kube.get(VMI, found.namespace, found.name)
    if events is None:
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
    decision = decide(vmi, facts, episode, ctx.settings, ctx.clock())
    return act(decision, found, vmi, involved, episode, ctx)


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
                   classes=frozenset(kv.annotations_of(e).get(CLASS, "") for e in mine), message=first.get("message", ""),
                   annotations=dict(notes), involved=dict(first.get("involvedObject") or {}))


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
        if event.get("reason") != KUBEVIRT_REASON or obj.get("kind") != "VirtualMachineInstance" or obj.get("uid") != uid:
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


def fetch_volumes(ctx: KubeContext, vmi: dict, errors: KubeVirtErrors) -> tuple[VolumeFacts, ...]:
    """The volumes KubeVirt named (else every PVC-backed volume), each followed to Longhorn."""
    specs = ((vmi.get("spec") or {}).get("volumes") or [])
    by_name = {v.get("name"): v for v in specs}
    names = list(errors.volumes) or [v.get("name") for v in specs
                                     if v.get("persistentVolumeClaim") or v.get("dataVolume")]
    return tuple(_follow(ctx, kv.meta(vmi)["namespace"], name, by_name.get(name)) for name in names)


def _follow(ctx: KubeContext, namespace: str, name: str, spec: dict | None) -> VolumeFacts:
    claim = ((spec or {}).get("persistentVolumeClaim") or {}).get("claimName") or \
        ((spec or {}).get("dataVolume") or {}).get("name")
    if not claim:
        kind = next((k for k in (spec or {}) if k != "name"), None)
        return VolumeFacts(name, unknown=f"not backed by a PVC ({kind or 'not in the VMI spec'})")
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
        return _longhorn(ctx, replace(facts, longhorn_volume=csi["volumeHandle"]))
    except KubeError as exc:  # unreadable: still report the pause, and say why the storage is unknown
        return replace(facts, unknown=f"could not be read ({exc.message})")


def _longhorn(ctx: KubeContext, facts: VolumeFacts) -> VolumeFacts:
    namespace, name = ctx.settings.longhorn_namespace, facts.longhorn_volume
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
                   progress=progress, size=_int(spec.get("size")) or None, actual_size=_int(status.get("actualSize")) or None,
                   last_degraded_at=kv.parse_time(status.get("lastDegradedAt")), out_of_space=full)


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# -- act and report --------------------------------------------------------------------------------
def act(decision: Decision, found: Target, vmi: dict | None, involved: dict, episode: Episode | None,
        ctx: KubeContext) -> Outcome:
    subject = VMI.path(found.namespace, found.name)
    now = ctx.clock()
    if decision.action is Action.COUNT and episode is not None:
        ctx.recorder.record(involved, "Warning", REASON, episode.message, now, annotations=dict(episode.annotations))
        return Outcome(decision.action.value, effect="counted", subject=subject, reason=decision.reason)
    if decision.action not in (Action.REPORT, Action.ESCALATE, Action.RESOLVE):
        return Outcome(decision.action.value, subject=subject, reason=decision.reason)
    uid = kv.meta(vmi).get("uid") if vmi else (episode.vmi_uid if episode else "")
    notes = {EPISODE: decision.episode_start, CLASS: decision.cls.value, VMI_UID: uid or "",
             BASELINE: str(decision.baseline),
             VOLUMES: json.dumps([v.data() for v in decision.volumes], sort_keys=True, separators=(",", ":"))}
    if decision.action is Action.RESOLVE:
        notes = {EPISODE: decision.episode_start, VMI_UID: episode.vmi_uid if episode else "",
                 FINAL_COUNT: str(decision.kubevirt_total)}
        ctx.recorder.record(involved, "Normal", RESOLVED_REASON, event_message(decision, found, episode), now,
                            annotations=notes)
    else:
        ctx.recorder.record(involved, "Warning", REASON, event_message(decision, found, episode), now, annotations=notes)
    what = "resolved" if decision.action is Action.RESOLVE else "detected"
    data = reply_data(decision, found, involved, episode)
    cls = decision.cls.value if decision.cls else "unknown"
    key = f"{found.namespace}/{found.name}/{decision.episode_start}/{what}" + (f"/{cls}" if what == "detected" else "")
    reply = Reply(reply_type(FUNCTION, what), subject, data, key=key)
    return Outcome(decision.action.value, effect=f"{what}-{cls}" if what == "detected" else what,
                   subject=subject, reason=decision.reason, reply=reply)


def reply_data(decision: Decision, found: Target, involved: dict, episode: Episode | None) -> dict:
    vm = f"{found.namespace}/{kv.meta(involved)['name']}" if involved.get("kind") == "VirtualMachine" else None
    data = {"vmi": f"{found.namespace}/{found.name}", "vm": vm,
            "volumes": [v.data() for v in decision.volumes], "class": decision.cls.value if decision.cls else None,
            "cause": decision.cause.value if decision.cause else None, "pauses": decision.pauses,
            "episodeStart": decision.episode_start,
            "pausedSince": stamp(decision.paused_since) if decision.paused_since else None,
            "advice": list(decision.advice)}
    if decision.action is Action.RESOLVE:
        reported = sorted(episode.classes) if episode else []
        data.update({"reason": decision.reason, "reportedClasses": reported, "advice": []})
        if episode is not None and episode.reported_volumes is not None:
            data["volumes"] = episode.reported_volumes  # the alert's identity: the volumes first reported
    return data


def event_message(decision: Decision, found: Target, episode: Episode | None) -> str:
    """One sentence per report. Stable for one episode: recording it again raises the Event's count."""
    vmi = f"VMI {found.namespace}/{found.name}"
    if decision.action is Action.RESOLVE:
        return (f"{vmi} no longer pauses on IO errors: {decision.reason}. The episode that began at "
                f"{decision.episode_start} had {decision.pauses} pause(s).")
    volumes = ", ".join(_volume_words(v) for v in decision.volumes) or "no PVC-backed volume"
    if decision.action is Action.ESCALATE:
        return (f"{vmi} is stuck paused on an IO error since {_hms(decision.paused_since)} (episode began at "
                f"{decision.episode_start}): KubeVirt is not resuming it; stop and start the VM. Storage: "
                f"{decision.cause.value}: {volumes}.")
    head = (f"{vmi} pauses on IO errors (KubeVirt resumes it, then it pauses again), episode began at "
            f"{decision.episode_start}: {decision.cls.value}: {volumes}.")
    return f"{head} {decision.advice[0]}" if decision.advice else head


def _volume_words(v: VolumeFacts) -> str:
    if not v.is_longhorn:
        return f"{v.name} ({v.unknown})"
    rebuild = f", rebuilding {v.progress}%" if v.rebuilding and v.progress is not None else \
        ", rebuilding" if v.rebuilding else ""
    return f"{v.name} → PVC {v.pvc} → Longhorn volume {v.longhorn_volume} ({v.robustness or 'unknown'}{rebuild})"


# -- the periodic re-scan -------------------------------------------------------------------------
def rescan(ctx: KubeContext) -> Outcome:
    """VMIs still paused on an IO error (stuck? a missed event?), then every open episode (ended?)."""
    findings: list[dict] = []
    failures: list[TemporaryError] = []
    seen: set[tuple[str, str]] = set()
    scanned = 0

    def visit(found: Target, vmi=...) -> None:
        if (found.namespace, found.name) in seen:
            return
        seen.add((found.namespace, found.name))
        try:
            outcome = converge(found, ctx, vmi)
        except TemporaryError as exc:
            failures.append(exc)
            return
        if outcome.reply is not None:  # each finding keeps its own type and subject inside the summary
            findings.append({"type": outcome.reply.type, "subject": outcome.reply.subject, **outcome.reply.data})

    for vmi in ctx.kube.list(VMI):
        scanned += 1
        if io_paused(vmi) is not None:
            visit(Target(kv.meta(vmi)["namespace"], kv.meta(vmi)["name"]), vmi)
    for event in ctx.kube.list(EVENT, field_selector=f"reason={REASON}"):
        if (event.get("source") or {}).get("component") == FUNCTION:
            visit(_target_of_event(event))
    if failures:
        raise TemporaryError(f"re-scan could not finish {len(failures)} VMI(s): {failures[0].message}")
    reason = f"scanned {scanned} VMI(s) and {len(seen)} paused or in an episode; {len(findings)} finding(s)"
    if not findings:
        return Outcome("rescan", reason=reason)
    key = "|".join(sorted(f"{f['type']}:{f['vmi']}:{f['episodeStart']}:{f['class']}" for f in findings))
    reply = Reply(reply_type(FUNCTION, "scanned"), f"/vmevents/{FUNCTION}/rescan",
                  {"scanned": scanned, "findings": findings}, key=key)
    return Outcome("rescan", effect=f"reported-{len(findings)}", reason=reason, reply=reply)


def _target_of_event(event: dict) -> Target:
    """Our Events are on the VM (same name as its VMI) or on a standalone VMI."""
    obj = event.get("involvedObject") or {}
    return Target(obj.get("namespace") or kv.meta(event).get("namespace") or "default", obj["name"])

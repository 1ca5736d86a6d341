"""io-pause-report's pure part: what a VMI's IO-error pauses mean now, and in which category.

When the guest's disk returns an IO error, libvirt pauses the guest, KubeVirt sets the VMI condition
Paused/PausedIOError and resumes it with a backoff; while the cause lasts the VM flaps (docs/facts.md §5).
The usual cause on Harvester is filesystem trim during a Longhorn replica rebuild (Harvester knowledge
base: filesystem trim). decide() says whether this is a new episode, another pause of one, a VM stuck
paused, or the episode's end, from plain values the handler gathered: no API, no clock, no environment.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from functions.io_pause_report.settings import Settings
from shared import kubevirt as kv
from shared.settings import format_duration

PAUSED_IO_ERROR = "PausedIOError"


class Category(enum.StrEnum):
    REBUILD = "rebuild-related"
    OUT_OF_SPACE = "out-of-space"
    STUCK = "stuck-paused"
    UNKNOWN_STORAGE = "unknown-storage"
    STORAGE_ERROR = "storage-error"    # Longhorn read fine: faulted, or neither degraded nor rebuilding


_CATEGORIES = {c.value for c in Category}


class Action(enum.StrEnum):
    SKIP = "skip"            # not paused by an IO error, and no open episode
    REPORT = "report"        # a new episode: Warning Event + .detected
    ESCALATE = "escalate"    # the episode got stuck paused: another Warning Event + .detected
    COUNT = "count"          # another pause of the episode: the Event's count rises, no reply
    HOLD = "hold"            # nothing new (a duplicate, or another update during the same pause)
    WAIT = "wait"            # running again; the episode ends after a quiet period
    RESOLVE = "resolve"      # the episode ended: Normal Event + .resolved


# -- facts (what the handler gathers; plain values, so decide stays pure) -----------------------------
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

    start: str                          # when its first pause began (RFC 3339): the episode's name
    vmi_uid: str
    baseline: int                       # KubeVirt's IOerror count before the episode
    count: int                          # pauses counted so far (the first Event's count)
    last: datetime | None               # when a pause was last counted
    categories: frozenset[str]          # every category its Events reported
    message: str                        # the first Event's message: recording it again raises its count
    category: str | None = None         # the category its first Event reported (`.resolved` names it)
    reported_volumes: list[dict] | None = None  # the volumes of the first report (`.resolved` names them)
    annotations: Mapping[str, str] = field(default_factory=dict)
    involved: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    """What the handler read fresh for one VMI: its volumes down to Longhorn, KubeVirt's IOerror Events, the
    VMI itself (None when gone) and the episode on record (None when none is open)."""

    volumes: tuple[VolumeFacts, ...] = ()
    kubevirt: KubeVirtErrors = KubeVirtErrors()
    baseline: int = 0                   # for a new episode: KubeVirt's count when the last one ended
    vmi: dict | None = None
    episode: Episode | None = None


# -- the verdict ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    category: Category | None = None
    cause: Category | None = None       # the category without "stuck-paused": what the storage says
    pauses: int = 0
    paused_since: datetime | None = None
    episode_start: str | None = None
    baseline: int = 0
    volumes: tuple[VolumeFacts, ...] = ()
    kubevirt_total: int = 0             # KubeVirt's IOerror count for this VMI, kept when an episode ends


def io_paused(vmi: dict | None) -> dict | None:
    """The VMI's Paused condition when its reason is PausedIOError (never PausedByUser or
    PausedByMigrationMonitor), else None."""
    for cond in kv.conditions_of(vmi):
        if cond.get("type") == "Paused" and cond.get("status") == "True" and cond.get("reason") == PAUSED_IO_ERROR:
            return cond
    return None


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """What to report now. Pure: every fact is an argument."""
    vmi, episode = facts.vmi, facts.episode
    paused = io_paused(vmi)
    since = None if paused is None else kv.parse_time(paused.get("lastTransitionTime")) or now
    same_vmi = vmi is not None and episode is not None and kv.meta(vmi).get("uid") == episode.vmi_uid
    if episode is None:
        if since is None:
            return Verdict(Action.SKIP, "not paused by an IO error (no Paused condition with reason PausedIOError)")
        pauses = max(1, facts.kubevirt.total - facts.baseline)
        return _classified(Action.REPORT, "a new episode of IO-error pauses", facts, since, now, settings,
                            pauses=pauses, start=stamp(since), baseline=facts.baseline)
    pauses = max(episode.count, facts.kubevirt.total - episode.baseline)
    if since is not None and episode.last is not None and since > episode.last:
        pauses = max(pauses, episode.count + 1)  # a pause that began after the last one we counted
    if since is None or not same_vmi:
        ended = _ended(vmi, facts, episode, settings, now, same_vmi)
        if ended:
            first = episode.category
            return Verdict(Action.RESOLVE, ended, category=Category(first) if first in _CATEGORIES else None,
                           cause=classify(facts, episode.start) if vmi is not None else None, pauses=pauses,
                           episode_start=episode.start, baseline=episode.baseline, volumes=facts.volumes,
                           kubevirt_total=facts.kubevirt.total)
        if pauses > episode.count:
            return Verdict(Action.COUNT, f"pause {pauses} of the episode (it has resumed since)", pauses=pauses,
                           episode_start=episode.start)
        last = _last_pause(facts, episode)
        return Verdict(Action.WAIT, f"running again since the pause at {hms(last)}; the episode ends after "
                                    f"{format_duration(settings.resolved_after)} without a pause",
                       pauses=pauses, episode_start=episode.start)
    verdict = _classified(Action.HOLD, "the same pause, already counted", facts, since, now, settings,
                           pauses=pauses, start=episode.start, baseline=episode.baseline)
    if verdict.category is Category.STUCK and Category.STUCK.value not in episode.categories:
        return replace(verdict, action=Action.ESCALATE,
                       reason=f"paused since {hms(since)}, longer than {format_duration(settings.stuck_after)}")
    if pauses > episode.count:
        return replace(verdict, action=Action.COUNT, reason=f"pause {pauses} of the episode")
    return verdict


def _classified(action: Action, reason: str, facts: Facts, since: datetime | None, now: datetime,
                 settings: Settings, *, pauses: int, start: str, baseline: int) -> Verdict:
    cause = classify(facts, start)
    stuck = since is not None and now - since >= settings.stuck_after
    return Verdict(action, reason, category=Category.STUCK if stuck else cause, cause=cause, pauses=pauses,
                   paused_since=since, episode_start=start, baseline=baseline, volumes=facts.volumes,
                   kubevirt_total=facts.kubevirt.total)


def classify(facts: Facts, episode_start: str | None = None) -> Category:
    """What the storage says caused the pauses (docs/facts.md §5; Harvester knowledge base: filesystem trim)."""
    if facts.kubevirt.no_space or any(v.out_of_space for v in facts.volumes):
        return Category.OUT_OF_SPACE
    began = kv.parse_time(episode_start)
    for volume in facts.volumes:
        if not volume.is_longhorn:
            continue
        recently_degraded = (volume.last_degraded_at is not None and began is not None
                             and volume.last_degraded_at >= began - timedelta(hours=1))
        if volume.rebuilding or volume.robustness == "degraded" or recently_degraded:
            return Category.REBUILD
    if not facts.volumes or any(not v.is_longhorn for v in facts.volumes):
        return Category.UNKNOWN_STORAGE
    return Category.STORAGE_ERROR


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
        return f"no pause for {format_duration(settings.resolved_after)} (the last at {hms(last)})"
    longhorn = [v for v in facts.volumes if v.is_longhorn]
    if Category.REBUILD.value in episode.categories and longhorn and len(longhorn) == len(facts.volumes) and \
            all(v.robustness == "healthy" and not v.rebuilding for v in longhorn):
        return "the rebuild completed: every Longhorn volume is healthy again and the VMI runs"
    return None


def _last_pause(facts: Facts, episode: Episode) -> datetime | None:
    times = [t for t in (facts.kubevirt.last, episode.last) if t is not None]
    return max(times) if times else None


def hms(when: datetime | None) -> str:
    return "an unknown time" if when is None else stamp(when)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")

"""A finding's life in the cluster — open → seen again → resolved → reopened — so that a reply announces a
transition (a notice) and never a mere sighting. The schema and the reasons are in docs/findings.md.

The memory is one Kubernetes Event per finding identity (function, category, subject, key), named from that
identity and recorded on the finding's recipient. Its annotations carry the state, the episode number and the
id of the CloudEvent that opened (and resolved) the episode; its labels let a re-scan list what is still open.
Events expire `--event-ttl` after their *last write* (kube-apiserver sets a fresh etcd lease on every update of
an Event: pkg/registry/core/event/storage), so the open ones are renewed — rewritten — by every re-scan once
their last write is older than `renew_after`, well under the TTL. Each sighting is a write too (count + 1).

The finding's Event keeps saying what was found (type, reason, message: the problem's); an episode's end is an
Event of its own on the same object (Normal, HostDeviceConflictResolved): one row a transition (docs/findings.md).

Races: the first open is a create (AlreadyExists: someone else opened it, read it back); every other change
is a merge patch with the read resourceVersion as precondition (a Conflict re-reads and decides again), as
shared.recorder.record_once does. So two deliveries at once still produce one notice, and a redelivery of
the event that opened or resolved an episode finds its own id on the Event and answers with the same reply.
A re-scan reads the records it will settle *before* the state it settles them against: a finding an event
(or an overlapping tick) opens during the re-scan's reads is not among them, so it is not resolved by a view
older than itself; and `resolve` gives up on a record sighted or reopened after it was read.
"""
from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from shared import metrics
from shared.finding import DETECTED, RESOLVED, Finding, digest, stamp
from shared.kinds import EVENT
from shared.kube import Conflict, Kube
from shared.recorder import Recorder
from shared.replies import Reply, reply_type

OPEN = "open"                                # a state on record (RESOLVED is one too, and a notice)
DEFAULT_RENEW_AFTER = timedelta(minutes=15)  # kube-apiserver's default --event-ttl is 1 h

LABEL = "vmevents.io/finding"                # label: the producing function (a re-scan lists by it)
STATE_LABEL = "vmevents.io/finding-state"    # label: open | resolved
DATA = "vmevents.io/finding"                 # annotation: the finding as last written (JSON, the schema)
EPISODE = "vmevents.io/finding-episode"
OPENED_BY = "vmevents.io/finding-opened-by"  # the CloudEvent id that opened the episode
OPENED_AT = "vmevents.io/finding-opened-at"
SEEN_AT = "vmevents.io/finding-seen-at"      # the last sighting (a renewal is not one)
RESOLVED_BY = "vmevents.io/finding-resolved-by"
RESOLVED_AT = "vmevents.io/finding-resolved-at"
WRITTEN_AT = "vmevents.io/finding-written-at"  # the last write of any kind: what --event-ttl counts from
ATTEMPTS = 8


@dataclass(frozen=True)
class Record:
    """A finding's Event, read back."""

    finding: Finding
    state: str
    episode: int
    count: int
    opened_by: str
    opened_at: datetime | None
    seen_at: datetime | None
    last_counted: datetime | None   # the Event's lastTimestamp: the last sighting that raised its count
    resolved_by: str | None
    resolved_at: datetime | None
    written_at: datetime | None
    namespace: str
    name: str
    resource_version: str
    involved: Mapping[str, Any]

    @property
    def open(self) -> bool:
        return self.state == OPEN

    def life(self) -> dict[str, Any]:
        return {"episode": self.episode, "count": self.count, "record": f"{self.namespace}/{self.name}",
                "openedAt": stamp(self.opened_at) if self.opened_at else None,
                "resolvedAt": stamp(self.resolved_at) if self.resolved_at else None}


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def record_of(event: Mapping[str, Any]) -> Record | None:
    """The finding an Event carries; None for an Event that is not a finding's or is unreadable."""
    meta = event.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        finding = Finding.from_data(json.loads(notes[DATA]))
        episode = int(notes.get(EPISODE) or 1)
    except (KeyError, ValueError, TypeError):
        return None
    return Record(finding, (meta.get("labels") or {}).get(STATE_LABEL, OPEN), episode, int(event.get("count") or 1),
                  notes.get(OPENED_BY, ""), _parse(notes.get(OPENED_AT)), _parse(notes.get(SEEN_AT)),
                  _parse(event.get("lastTimestamp")), notes.get(RESOLVED_BY), _parse(notes.get(RESOLVED_AT)),
                  _parse(notes.get(WRITTEN_AT)),
                  meta.get("namespace") or "default", meta["name"], meta.get("resourceVersion") or "",
                  event.get("involvedObject") or {})


def every_record(kube: Kube, *, cached: bool = False) -> Iterator[Record]:
    """Every function's findings on record, open and resolved, page by page (from etcd: the watch cache answers a
    LIST whole up to 1.33, docs/facts.md §8): what alert-forwarder keeps Alertmanager in step with."""
    for event in kube.list(EVENT, None, label_selector=LABEL, cached=cached):
        found = record_of(event)
        if found is not None:
            yield found


@dataclass(frozen=True)
class Notice:
    """A transition of an episode, to be replied: `detected` (opened or reopened) or `resolved`."""

    transition: str
    record: Record

    @property
    def finding(self) -> Finding:
        return self.record.finding

    def data(self) -> dict[str, Any]:
        return self.finding.data(DETECTED if self.transition == DETECTED else RESOLVED, **self.record.life())

    def reply(self) -> Reply:
        """Its reply. The id comes from the identity and the CloudEvent that opened the episode: a redelivery
        answers with the same id, and every episode (even after its Event expired) has ids of its own."""
        return Reply(reply_type(self.finding.function, self.transition), self.finding.subject, self.data(),
                     key=f"{self.finding.ident}\x00{self.record.opened_by}")


def event_name(recipient: Mapping[str, Any], finding: Finding) -> str:
    name = (recipient.get("metadata") or {})["name"]
    return f"{name}.f{digest(finding.function, finding.category, finding.subject, finding.key)}"


class Ledger:
    """The findings of one function, kept as Events (see the module docstring)."""

    def __init__(self, kube: Kube, function: str, renew_after: timedelta = DEFAULT_RENEW_AFTER,
                 reason: str = "Finding", resolved_reason: str | None = None):
        """`reason`: the problem's (HostDeviceConflict); `resolved_reason`: its end's (HostDeviceConflictResolved)."""
        self.kube, self.function, self.renew_after, self.reason = kube, function, renew_after, reason
        self.resolved_reason = resolved_reason or f"{reason}Resolved"

    # -- reading ------------------------------------------------------------------------------
    def get(self, recipient: Mapping[str, Any], finding: Finding) -> Record | None:
        namespace = (recipient.get("metadata") or {}).get("namespace") or "default"
        event = self.kube.get(EVENT, namespace, event_name(recipient, finding))
        return record_of(event) if event else None

    def records(self, namespace: str | None = None, *, state: str | None = OPEN,
                field_selector: str | None = None, cached: bool = False) -> Iterator[Record]:
        """This function's findings on record (by default the open ones), page by page. `cached`: from the API
        server's watch cache, slightly stale; every transition patches at the version read, so a stale record
        costs at worst a Conflict."""
        selector = f"{LABEL}={self.function}" + (f",{STATE_LABEL}={state}" if state else "")
        events = self.kube.list(EVENT, namespace, label_selector=selector, field_selector=field_selector, cached=cached)
        found = (r for e in events if (r := record_of(e)) is not None and r.finding.function == self.function)
        whole = namespace is None and state is None and not field_selector  # every one: the findings' gauges read it
        yield from metrics.listing(self.function, found) if whole else found

    @staticmethod
    def replay(record: Record, delivery: str) -> Notice | None:
        """The notice `delivery` caused before, if it opened or ended this episode: a redelivery answers
        as the first delivery did."""
        if record.open and record.opened_by == delivery:
            return Notice(DETECTED, record)
        if not record.open and record.resolved_by == delivery:
            return Notice(RESOLVED, record)
        return None

    # -- transitions ---------------------------------------------------------------------------
    def sighted(self, finding: Finding, recipient: Mapping[str, Any], delivery: str, now: datetime, *,
                message: str | None = None, count: bool = True, update: bool = False,
                count_to: int | None = None, read: str | None = None) -> Notice | None:
        """The finding is there now. A `detected` notice when this delivery opened its episode (or reopened
        it), or is a redelivery of the one that did; None when it was already open: seen again, its count
        rises (`count=False`, a re-scan's sighting: only renewed when its last write is old, or when
        `update` asks to store the finding's new details). `count_to`: the count is this many sightings (set,
        not raised, and only upwards): deliveries that saw the same sightings at once count them once.

        `read`: the finding's Event as this delivery read it *before* the state it judged the finding there by: its
        resourceVersion, or "" when there was none. An episode resolved since (the Event is not that version any
        more) may have been resolved on a later look than this one, so it is not reopened: None, and the next
        re-scan decides again (docs/findings.md, Races). Without it, a delivery slowed between its reads and its
        write (an API server waiting for etcd) reopened what a later tick had just resolved. The versions are the
        API server's: no clock, no stamp of whole seconds, is compared."""
        namespace = (recipient.get("metadata") or {}).get("namespace") or "default"
        name = event_name(recipient, finding)
        text = message or finding.summary
        for attempt in range(ATTEMPTS):
            _pause(attempt)
            event = self.kube.get(EVENT, namespace, name)
            current = record_of(event) if event else None
            try:
                if event is None or current is None:
                    created = self._create(recipient, finding, name, namespace, delivery, now, text, event)
                    return metrics.counted(Notice(DETECTED, created))
                if current.open:
                    if current.opened_by == delivery:
                        return Notice(DETECTED, current)  # a redelivery of the event that opened it
                    if count_to is not None:
                        count = current.count < count_to
                    if count or update or self._stale(current, now):
                        self._patch(current, finding, now, text, count=count, notes={SEEN_AT: stamp(now)},
                                    total=count_to)
                    return None
                if current.resolved_by == delivery:
                    return None  # the event that ended the episode is not a sighting of a new one
                if read is not None and current.resource_version != read:
                    return None  # resolved since this delivery read it: perhaps on a later look than its own
                # a new episode counts its sightings from one again
                reopened = self._patch(current, finding, now, text, count=True, first=True, state=OPEN, notes={
                    EPISODE: str(current.episode + 1), OPENED_BY: delivery, OPENED_AT: stamp(now),
                    SEEN_AT: stamp(now), RESOLVED_BY: "", RESOLVED_AT: ""})
                return metrics.counted(Notice(DETECTED, reopened))
            except Conflict:
                continue  # someone else wrote it first: read again and decide again
        raise Conflict(f"finding Event {namespace}/{name} kept changing")

    def resolve(self, record: Record, delivery: str, now: datetime, *, summary: str | None = None,
                details: Mapping[str, Any] | None = None, message: str | None = None) -> Notice | None:
        """The finding of `record` is over. A `resolved` notice when this delivery ended its episode (or is
        a redelivery of the one that did); None when someone else did, or it was not open. The identity,
        severity and advice stay as opened, so the resolved alert ends the firing one.

        The finding's Event keeps what it says; the end is an Event of its own on the same object, Normal, reason
        `resolved_reason`, `message` (else the summary): docs/findings.md, "What kubectl describe shows".

        `record` must have been read before the state the caller judged it over by (docs/findings.md, Races):
        a finding sighted or reopened since it was read was seen by someone who looked later, so it is not
        resolved here (None; the next re-scan decides again). A renewal or an update of its details alone is
        no sighting: the resolution goes ahead at the version read again."""
        read = record
        for attempt in range(ATTEMPTS):
            _pause(attempt)
            if attempt:
                event = self.kube.get(EVENT, record.namespace, record.name)
                found = record_of(event) if event else None
                if found is None:
                    return None
                if found.open and (found.episode, found.opened_by, found.seen_at) != (
                        read.episode, read.opened_by, read.seen_at):
                    return None  # seen (or reopened) after the state this resolution was judged on
                record = found
            if not record.open:
                return Notice(RESOLVED, record) if record.resolved_by == delivery else None
            finding = replace(record.finding, summary=summary or record.finding.summary,
                              details={**record.finding.details, **(details or {})})
            try:
                done = self._patch(record, finding, now, None, count=False, state=RESOLVED,
                                   notes={RESOLVED_BY: delivery, RESOLVED_AT: stamp(now)})
            except Conflict:
                continue
            involved = {k: v for k, v in done.involved.items() if k in ("apiVersion", "kind")}
            Recorder(self.kube, self.function).record({**involved, "metadata": dict(done.involved)}, "Normal",
                                                      self.resolved_reason, message or finding.summary, now)
            return metrics.counted(Notice(RESOLVED, done))
        raise Conflict(f"finding Event {record.namespace}/{record.name} kept changing")

    def renew_stale(self, records: Iterable[Record], now: datetime) -> int:
        """Rewrite every open finding's Event whose last write is older than renew_after, so that it outlives
        --event-ttl for as long as the finding lasts. A lost race means someone else just wrote it."""
        renewed = 0
        for record in records:
            if record.open and self._stale(record, now):
                try:
                    self._patch(record, record.finding, now, None, count=False)
                except Conflict:
                    continue
                renewed += 1
        return renewed

    # -- writing -------------------------------------------------------------------------------
    def _stale(self, record: Record, now: datetime) -> bool:
        return record.written_at is None or now - record.written_at >= self.renew_after

    def _create(self, recipient: Mapping[str, Any], finding: Finding, name: str, namespace: str, delivery: str,
                now: datetime, message: str, unreadable: Mapping[str, Any] | None) -> Record:
        meta = recipient.get("metadata") or {}
        when = stamp(now)
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {LABEL: self.function, STATE_LABEL: OPEN},
                         "annotations": {DATA: _dump(finding.data(OPEN)), EPISODE: "1", OPENED_BY: delivery,
                                         OPENED_AT: when, SEEN_AT: when, WRITTEN_AT: when}},
            "involvedObject": {"apiVersion": recipient.get("apiVersion"), "kind": recipient.get("kind"),
                               "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": "Warning" if finding.severity != "info" else "Normal", "reason": self.reason,
            "message": message, "source": {"component": self.function},
            "reportingComponent": f"vmevents.io/{self.function}",
            "firstTimestamp": when, "lastTimestamp": when, "count": 1,
        }
        if unreadable is not None:  # an Event of that name we cannot read as a finding: take it over
            body["metadata"]["resourceVersion"] = (unreadable.get("metadata") or {}).get("resourceVersion")
            written = self.kube.merge_patch(EVENT, namespace, name, body)
        else:
            written = self.kube.create(EVENT, namespace, body)  # AlreadyExists is a Conflict: read it back
        found = record_of(written)
        assert found is not None
        return found

    def _patch(self, record: Record, finding: Finding, now: datetime, message: str | None, *, count: bool,
               first: bool = False, state: str | None = None,
               notes: Mapping[str, str] | None = None, total: int | None = None) -> Record:
        stored = finding.data(state or record.state)
        annotations = {DATA: _dump(stored), WRITTEN_AT: stamp(now), **(notes or {})}
        patch: dict[str, Any] = {"metadata": {"resourceVersion": record.resource_version,
                                              "annotations": {k: (v or None) for k, v in annotations.items()}}}
        if state:
            patch["metadata"]["labels"] = {STATE_LABEL: state}
            patch["type"] = "Warning" if finding.severity != "info" else "Normal"  # the problem's, as opened
        if count:
            patch["count"] = 1 if first else (total if total is not None else record.count + 1)
            patch["lastTimestamp"] = stamp(now)
        if message:
            patch["message"] = message
        found = record_of(self.kube.merge_patch(EVENT, record.namespace, record.name, patch))
        assert found is not None
        return found


def _dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def _pause(attempt: int) -> None:
    """Racers that lost spread out before they read again."""
    if attempt:
        time.sleep(random.uniform(0, 0.01 * attempt))

"""A tick: re-post the findings on record to Alertmanager, in memory that does not grow with them.

The records are read page by page (shared/ledger.py `every_record`: `limit` at a time, from etcd), each page is
decided (decide.py: which alert each finding is now), and its alerts are encoded into a body of at most
`CHUNK_ALERTS` alerts and `CHUNK_BYTES` bytes, posted to each Alertmanager replica as soon as it is full, with
SEND_TIMEOUT per post. Three things happen at once, each a bounded step ahead of the next: a thread reads the next
page while this one is decided, and another posts the last full body while the next is built. So at any moment the
tick holds three pages of records and two bodies, whatever the number of findings: 50,000 open findings cost the
memory 500 do, and their time is the slowest of the three, not their sum (docs/alert-forwarder.md, "How it
scales"). No new page is decided once the tick has used its budget (shared/rescan.py's: below the Trigger's delivery
timeout, so the tick answers before the broker gives up on it and sends another); the next tick starts from the
beginning of the list again (docs/alert-forwarder.md, "How it scales", says when that leaves some alerts to lapse).

The pages are one snapshot, taken when the tick begins: a finding resolved while it runs may be posted firing after
its `.resolved` notice reached Alertmanager, which holds the later post. So the tick ends by watching, from where it
began, the findings that came to be resolved, and posts those it posted firing resolved again (`_correct`).

Firing wins over resolved under one label set across the whole tick, as `one_per_labels` has it within a body
(Alertmanager takes the later post of two: docs/facts.md §11): a resolved alert whose labels a firing one of this
tick may have had is not posted. "May": the firing alerts posted so far are remembered in a Bloom filter of fixed
size, so a resolved one is at worst left out by mistake (about 1 in 400 at 50,000 firing findings), and then ends
at its last post's end. A resolved one posted before a firing one with its labels is overtaken by it.
"""
from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from functions.alert_forwarder import wording
from functions.alert_forwarder.decide import DROP, NO_ALERTMANAGER, Alert, Facts, Verdict, decide
from functions.alert_forwarder.delivery import post_alertmanager
from functions.alert_forwarder.received import Received, of_record
from functions.alert_forwarder.settings import ALERTMANAGER, Settings, Target
from shared import rescan
from shared.errors import TemporaryError, VmeventsError, longest_retry_after
from shared.finding import RESOLVED
from shared.kinds import EVENT
from shared.kube import Expired, Kube
from shared.ledger import LABEL, STATE_LABEL, Record, every_record, record_of
from shared.runtime import KubeContext, Outcome

PING = "dev.knative.sources.ping"
CHUNK_ALERTS = 500
CHUNK_BYTES = 1 << 20
PAGE = 250  # records decided at once (the LIST's own page size: shared/kube.py PAGE_SIZE)
BUDGET = rescan.DEFAULT_BUDGET  # no page is decided after it (below the Trigger's delivery timeout)
T = TypeVar("T")


def refresh(ctx: KubeContext[Settings]) -> Outcome:
    settings = ctx.settings
    if not settings.alertmanager:
        return Outcome("drop", reason=wording.dropped(Verdict(DROP, NO_ALERTMANAGER), settings))
    deadline = time.monotonic() + BUDGET.total_seconds()
    poster = Poster(settings, [t for t in settings.targets if t.kind == ALERTMANAGER])
    body = Body(settings, poster)
    seen, fired = Seen(), Seen()
    counted = Counted()
    since = version_now(ctx.kube)  # before the LIST's snapshot: what is resolved after it is found below
    pages = Ahead(every_record(ctx.kube), PAGE)
    try:
        for page in pages:
            _post_page([_received(record) for record in page], body, seen, fired, counted, ctx)
            if time.monotonic() > deadline:
                counted.stopped = True
                break
        pages.close()
        _correct(since, body, fired, counted, ctx)
        body.flush()
    finally:
        pages.close()
        poster.close()
    reason = wording.refreshed(counted.firing, counted.resolved, counted.on_record, poster.posts, counted.stopped,
                               counted.corrected, counted.uncorrected)
    poster.raise_errors(reason)
    return Outcome("refresh", effect="alertmanager" if poster.posts else "none", reason=reason)


def _received(record: Record) -> Received:
    return of_record(record.finding, "detected" if record.open else RESOLVED, record.opened_at, record.resolved_at,
                     record.episode, (record.namespace, record.name))


def _post_page(page: list[Received], body: Body, seen: Seen, fired: Seen, counted: Counted,
               ctx: KubeContext[Settings]) -> None:
    counted.on_record += len(page)
    verdict = decide(Facts(PING, page, tick=True), ctx.settings, ctx.clock())
    for alert in verdict.alerts:
        if alert.resolved:
            if seen.maybe(alert.fingerprint):
                continue
            counted.resolved += 1
        else:
            seen.add(alert.fingerprint)
            fired.add(_where(alert.finding))
            counted.firing += 1
        body.add(alert)


def _correct(since: str, body: Body, fired: Seen, counted: Counted, ctx: KubeContext[Settings]) -> None:
    """The findings resolved while this tick ran, which it may have posted firing from its snapshot after their
    .resolved notice was posted (Alertmanager holds the later post: docs/facts.md §11): posted resolved again, after.
    Only those this tick posted firing (`fired`, by their Event): a resolved twin of a firing finding stays
    unposted, as in the pass."""
    try:
        ended = [_received(r) for r in resolved_since(ctx.kube, since)]
    except Expired:
        counted.uncorrected = True
        return
    verdict = decide(Facts(PING, [f for f in ended if fired.maybe(_where(f))], tick=True), ctx.settings, ctx.clock())
    for alert in verdict.alerts:
        body.add(alert)
        counted.corrected += 1


def _where(finding: Received) -> str:
    """Its Event, as a fingerprint for `Seen`."""
    return hashlib.sha256("/".join(finding.record or ("", "")).encode()).hexdigest()[:16]


def version_now(kube: Kube) -> str:
    """The finding Events' resourceVersion now (a LIST of one, from etcd): where `resolved_since` starts."""
    page = kube.request("GET", EVENT.path(), query={"labelSelector": LABEL, "limit": 1})
    return str((page.get("metadata") or {}).get("resourceVersion") or "")


def resolved_since(kube: Kube, version: str) -> Iterator[Record]:
    """The findings resolved since `version` (by anyone), as their Events are now: a WATCH from there that selects
    the resolved ones, so an Event that came to be resolved arrives as ADDED (kube-apiserver's watch filter,
    k8s.io/apiserver v0.33.13 storage/cacher/cache_watcher.go convertToWatchEvent). Expired (410) once the watch
    cache no longer keeps `version` (it keeps at least 75 s: cacher.go DefaultEventFreshDuration). What it holds
    is what was resolved during the tick, not the findings on record."""
    changes = kube.changes(EVENT, None, version, seconds=1, labels=f"{LABEL},{STATE_LABEL}={RESOLVED}")
    for kind, event in changes.events:
        found = record_of(event) if kind != "DELETED" else None
        if found is not None and not found.open:
            yield found


@dataclass
class Counted:
    on_record: int = 0
    firing: int = 0
    resolved: int = 0
    stopped: bool = False
    corrected: int = 0         # resolved during the tick: posted resolved again, after its firing post
    uncorrected: bool = False  # the watch for those had expired: none was looked for


class Body:
    """The alerts of one POST, encoded as they come; handed to the poster when full."""

    def __init__(self, settings: Settings, poster: Poster):
        self.settings, self.poster = settings, poster
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, alert: Alert) -> None:
        part = orjson.dumps(wording.postable(alert, self.settings))
        if self.parts and (len(self.parts) >= CHUNK_ALERTS or self.size + len(part) > CHUNK_BYTES):
            self.flush()
        self.parts.append(part)
        self.size += len(part) + 1

    def flush(self) -> None:
        if self.parts:
            self.poster.put(b"[" + b",".join(self.parts) + b"]")
            self.parts, self.size = [], 0


class Poster:
    """Posts each body to every Alertmanager replica, in a thread of its own, while the next body is built: at
    most one body waits. A replica that failed is not posted to again in this tick (the next tick tries it
    again): a blackholed one would otherwise cost SEND_TIMEOUT for every body."""

    def __init__(self, settings: Settings, targets: list[Target]):
        self.settings, self.targets = settings, targets
        self.posts = 0
        self.failed: dict[str, VmeventsError] = {}
        self._bodies: queue.Queue[bytes | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="tick-poster", daemon=True)
        self._thread.start()

    def put(self, encoded: bytes) -> None:
        self._bodies.put(encoded)

    def _run(self) -> None:
        while (encoded := self._bodies.get()) is not None:
            for target in self.targets:
                if target.id not in self.failed:
                    try:
                        errors = post_alertmanager(encoded, target, self.settings)
                    except Exception as exc:  # noqa: BLE001 - a fault of ours: the tick answers it, no thread dies
                        errors = [VmeventsError(wording.post_failed(exc))]
                    if errors:
                        self.failed[target.id] = errors[0]
            self.posts += 1

    def close(self) -> None:
        self._bodies.put(None)
        self._thread.join()

    def raise_errors(self, reason: str) -> None:
        if self.failed:
            errors = list(self.failed.values())
            raise TemporaryError("; ".join(e.message for e in errors) + f" ({reason})",
                                 retry_after=longest_retry_after(errors))


class Ahead(Generic[T]):
    """The items of an iterator in lists of `size`, read one list ahead in a thread of its own (the next page of
    the LIST arrives while this one is decided and posted). An error of the iterator is raised to the reader.
    `close` stops the reading after the list in progress."""

    _DONE = object()

    def __init__(self, items: Iterator[T], size: int):
        self._lists: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._items, self._size = items, size
        threading.Thread(target=self._run, name="tick-reader", daemon=True).start()

    def _run(self) -> None:
        batch: list[T] = []
        try:
            for item in self._items:
                batch.append(item)
                if len(batch) >= self._size:
                    if not self._offer(batch):
                        return
                    batch = []
            if batch:
                self._offer(batch)
            self._offer(self._DONE)
        except Exception as exc:  # noqa: BLE001 - the reader's to raise
            self._offer(exc)

    def _offer(self, value: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._lists.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[list[T]]:
        while (value := self._lists.get()) is not self._DONE:
            if isinstance(value, Exception):
                raise value
            yield value

    def close(self) -> None:
        self._stop.set()


class Seen:
    """A Bloom filter of the fingerprints of the firing alerts posted in this tick: 2^20 bits (128 KiB), three
    probes from the fingerprint's 64 bits. With n fingerprints the chance that one never added is "maybe" in it
    is (1 - e^(-3n/2^20))^3: 0.00002 at 10,000, 0.0024 at 50,000."""

    BITS = 1 << 20

    def __init__(self) -> None:
        self.bits = bytearray(self.BITS // 8)

    def _probes(self, fingerprint: str) -> tuple[int, int, int]:
        value = int(fingerprint, 16)
        mask = self.BITS - 1
        return value & mask, (value >> 20) & mask, (value >> 40) & mask

    def add(self, fingerprint: str) -> None:
        for bit in self._probes(fingerprint):
            self.bits[bit >> 3] |= 1 << (bit & 7)

    def maybe(self, fingerprint: str) -> bool:
        return all(self.bits[bit >> 3] & (1 << (bit & 7)) for bit in self._probes(fingerprint))

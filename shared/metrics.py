"""vmevents' Prometheus metrics (docs/metrics.md: names, types, labels, and why), served on `GET /metrics`.

Counters are per process and scraped: Prometheus' `increase()` and `rate()` take a pod's restart as a counter
reset, and summed over pods they count what every pod did. The state of the findings is not a count of what one
pod did but what the cluster holds: a gauge read from the ledger's Events by each re-scan (`Findings`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from shared.exposition import CONTENT_TYPE, Collected, Counter, Histogram, Labels, Registry, process_metrics
from shared.kinds import api_verb

__all__ = ["CONTENT_TYPE", "REGISTRY"]

# What set off the work a metric counts: an event the broker delivered, or a re-scan (the PingSource's tick).
# The runtime sets it per request; shared/rescan.py carries it into its visits' threads.
TRIGGER: ContextVar[str] = ContextVar("vmevents_trigger", default="event")
EVENT, RESCAN = "event", "rescan"
# Whose work it is, for what cannot be told otherwise (shared/rescan.py): the runtime sets it per request.
FUNCTION: ContextVar[str] = ContextVar("vmevents_function", default="")


# -- the findings' state, read from the ledger by the re-scans -----------------------------------------------
# A pod that has not read its function's ledger for this long withholds what it read last: it is not the one
# getting the ticks (several replicas), so another pod speaks for the cluster (docs/metrics.md).
STALE_AFTER = 180.0
# A resolved finding is exported as 0 this long after it was resolved, so that an alert on it ends on a value,
# not on a series that went missing (the lifetime alert-forwarder keeps resolved alerts for, ALERT_RESOLVED_FOR).
RESOLVED_FOR = 15 * 60.0
FINDING_LABELS = ("function", "category", "severity", "namespace", "vm", "finding", "node")  # node: a Node's finding


@dataclass(frozen=True)
class Seen:
    """One finding on record as the gauges need it: its labels, and since when it is resolved (None: open)."""

    category: str
    severity: str
    namespace: str
    vm: str
    finding: str
    resolved_at: float | None = None
    node: str = ""   # a finding about a Node (evacuation-report's) names it; a VM's has namespace and vm


class Findings:
    """Each function's findings on record, as its last full reading of the ledger found them, with what this pod
    opened or resolved since. Exported as `vmevents_findings_open` (a count per category and severity) and
    `vmevents_finding_open` (1 per open finding, 0 for one resolved within RESOLVED_FOR)."""

    def __init__(self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self.clock, self.monotonic = clock, monotonic
        self._lock = threading.Lock()
        self._by_function: dict[str, tuple[float, float, dict[str, Seen]]] = {}  # read at (monotonic, wall)

    def listed(self, function: str, seen: Iterable[Seen]) -> None:
        """Every finding of `function` on record, just read (open and resolved)."""
        found = {s.finding: s for s in seen}
        with self._lock:
            self._by_function[function] = (self.monotonic(), self.clock(), found)

    def changed(self, function: str, seen: Seen) -> None:
        """This pod opened or resolved one (counted until the next reading replaces the lot)."""
        with self._lock:
            entry = self._by_function.get(function)
            if entry is not None:
                entry[2][seen.finding] = seen

    def collect(self) -> Iterable[Collected]:
        now, wall = self.monotonic(), self.clock()
        counts: dict[Labels, float] = {}
        each: list[tuple[Labels, float]] = []
        read: list[tuple[Labels, float]] = []
        with self._lock:
            entries = sorted(self._by_function.items())
        for function, (at, at_wall, found) in entries:
            if now - at > STALE_AFTER:
                continue
            read.append(((function,), at_wall))
            for seen in found.values():
                key = (function, seen.category, seen.severity)
                counts[key] = counts.get(key, 0.0) + (seen.resolved_at is None)
                if seen.resolved_at is None or wall - seen.resolved_at <= RESOLVED_FOR:
                    labels = (function, seen.category, seen.severity, seen.namespace, seen.vm, seen.finding, seen.node)
                    each.append((labels, 1.0 if seen.resolved_at is None else 0.0))
        return (
            Collected("vmevents_findings_open", "Open findings on record, by category and severity (read from the "
                      "findings' Events by the last re-scan, with what this pod changed since).", "gauge",
                      ("function", "category", "severity"), tuple(sorted(counts.items()))),
            Collected("vmevents_finding_open", "1 for each open finding on record; 0 for one resolved in the last "
                      "15 minutes.", "gauge", FINDING_LABELS, tuple(sorted(each))),
            Collected("vmevents_findings_read_timestamp_seconds", "When this pod last read its function's findings "
                      "on record (seconds since the epoch); withheld after 3 minutes.", "gauge", ("function",),
                      tuple(read)),
        )


# -- the metrics ---------------------------------------------------------------------------------------------
REGISTRY = Registry()
EVENTS = REGISTRY.add(Counter(
    "vmevents_events_total", "Events answered, by verdict (what was decided: irrelevant, rescan, an action, error) "
    "and HTTP status.", ("function", "verdict", "code")))
DECISIONS = REGISTRY.add(Counter(
    "vmevents_decisions_total", "Decisions on one object, by verdict and reason class, and whether an event or a "
    "re-scan asked for it.", ("function", "verdict", "reason", "trigger")))
ACTIONS = REGISTRY.add(Counter(
    "vmevents_actions_total", "Changes made to the cluster (or that a dry run would have made), by action and "
    "result.", ("function", "action", "result", "trigger")))
OPENED = REGISTRY.add(Counter(
    "vmevents_findings_opened_total", "Finding episodes opened (or reopened): each is one .detected notice.",
    ("function", "category", "severity", "trigger")))
RESOLVED = REGISTRY.add(Counter(
    "vmevents_findings_resolved_total", "Finding episodes resolved: each is one .resolved notice.",
    ("function", "category", "severity", "trigger")))
REPORTED = REGISTRY.add(Counter(
    "vmevents_findings_reported_total", "Findings reported once, with no episode (something done).",
    ("function", "category", "severity", "trigger")))
RESCANS = REGISTRY.add(Counter(
    "vmevents_rescans_total", "Re-scans (ticks) answered, by result: complete (2xx), failed (any other status).",
    ("function", "result")))
RESCAN_STOPS = REGISTRY.add(Counter(
    "vmevents_rescan_budget_stops_total", "Re-scan passes stopped at RESCAN_BUDGET before visiting every "
    "candidate (the next tick visits the rest).", ("function",)))
API_REQUESTS = REGISTRY.add(Counter(
    "vmevents_api_requests_total", "Requests to the Kubernetes API, by verb, resource and HTTP status (code "
    "\"error\": no answer).", ("function", "verb", "resource", "code")))
API_SECONDS = REGISTRY.add(Histogram(
    "vmevents_api_request_duration_seconds", "How long requests to the Kubernetes API took, by verb.",
    ("function", "verb"), (0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0)))
DELIVERIES = REGISTRY.add(Counter(
    "vmevents_deliveries_total", "Posts to a receiver (alertmanager, webhook), by result: delivered, retried "
    "(a temporary failure: the broker redelivers), refused.", ("function", "receiver", "result")))
DEAD_LETTERS = REGISTRY.add(Counter(
    "vmevents_dead_letters_total", "Events the broker could not deliver, by the function it was for and the status "
    "it last got.", ("function", "destination", "code")))
# The `destination` names DEAD_LETTERS has counted, beside it: dead-letter bounds them (functions/dead_letter/main.py
# MAX_SERVICES), and the bound holds for the counter however often the function's module is loaded in the process
DEAD_LETTER_DESTINATIONS: set[str] = set()
FINDINGS = Findings()
PROCESS = {"function": ""}  # the function this process serves (shared.runtime.start): the process_* metrics' label
REGISTRY.collectors += [FINDINGS.collect, lambda: process_metrics(("function",), (PROCESS["function"],))]


def trigger() -> str:
    return TRIGGER.get()


def transition(function: str, opened: bool, finding: Seen) -> None:
    """An episode this pod opened (or reopened) or resolved: its notice counted, and the findings' gauges told."""
    counter = OPENED if opened else RESOLVED
    counter.inc(function, finding.category, finding.severity, TRIGGER.get())
    FINDINGS.changed(function, finding)


def api_request(function: str, verb: str, resource: str, code: str, seconds: float) -> None:
    API_REQUESTS.inc(function, verb, resource, code)
    API_SECONDS.observe(function, verb, value=seconds)


def measured(client: Any) -> Any:
    """The kubernetes ApiClient (shared.kubeconfig.connect makes it) with every request counted: by the function
    whose request it is (the one being served, else the process'), its verb, resource and HTTP status ("error": no
    answer), and timed (vmevents_api_requests_total, vmevents_api_request_duration_seconds)."""
    call = client.call_api

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        began, code = time.monotonic(), "error"
        try:
            response = call(method, url, *args, **kwargs)
            code = str(response.status)
            return response
        finally:
            parts = urlsplit(url)
            api_request(FUNCTION.get() or PROCESS["function"], *api_verb(method, parts.path, dict(parse_qsl(
                parts.query))), code, time.monotonic() - began)
    client.call_api = call_api
    return client


R = TypeVar("R")


def listing(function: str, records: Iterable[R]) -> Iterator[R]:
    """Every shared.ledger.Record of `function` on record, passed through; once all are read, the findings' gauges
    hold them (a listing stopped part-way changes nothing)."""
    found = []
    for record in records:
        found.append(of_record(record))
        yield record
    FINDINGS.listed(function, found)


def counted(notice: R) -> R:
    """A transition this delivery made (a shared.ledger.Notice, not a redelivery's replay): counted, and the findings'
    gauges told."""
    said: Any = notice
    transition(said.finding.function, said.transition == "detected", of_record(said.record))
    return notice


def of_record(record: Any) -> Seen:
    """A shared.ledger.Record as the findings' gauges keep it."""
    ended = None if record.open else (record.resolved_at or record.written_at)
    return seen(record.finding.labels, record.finding.category, record.finding.severity,
                None if record.open else ended.timestamp() if ended else 0.0)


def seen(labels: Mapping[str, str], category: str, severity: str, resolved_at: float | None) -> Seen:
    """A finding as `Findings` keeps it, from its identity labels (shared.finding.Finding.labels)."""
    return Seen(category, severity, labels.get("namespace", ""), labels.get("vm", ""), labels.get("finding", ""),
                resolved_at, labels.get("node", ""))

"""A re-scan's visits to its candidates: bounded in time, a few at once, each object's failure its own.

The contract (vmi-cleanup, io-pause-report and migration-report use it; device-conflict may):
- The caller finds its *candidates* cheaply (a Table or metadata LIST, see shared/kube.py) and gives them
  in a stable order (namespace/name); `visit(candidate)` reads the full objects, decides and acts.
- `run` visits up to `Settings.workers` candidates at once. It starts no new visit once the re-scan has
  used its budget (`RESCAN_BUDGET`, below the Trigger's delivery timeout, so a re-scan answers before
  the broker gives up on it and retries while it is still running), nor one it expects to end past the
  budget (the longest visit so far is the estimate). Visits already started are finished, never cut off.
  `Scan.stopped` and `Scan.progress()` say how far it got; the next tick starts over and does the rest.
- A visit that raises is a failure of that object only: recorded with its subject in `Scan.failures`
  (the re-scan still answers; the next tick visits it again), never a reason to skip the others. Except
  RBAC's refusal (`Forbidden`): that is the configuration's failure, not the object's, and no tick can get
  past it, so once every visit is done `run` raises it and the tick answers 500: after the broker's retries
  it reaches the dead letter, where an operator sees which grant is missing.
- Nothing is skipped forever: when the budget runs out, the next tick starts `rotation` places further
  along the same order (the caller passes the tick's number: minutes since the epoch), so a candidate that
  stays a candidate is visited within as many ticks as there are candidates, and in practice within
  (candidates ÷ visits per tick) ticks. Candidates whose work is done stop being candidates (a deleted
  VMI, a reported migration answers from one cheap read), so the backlog shrinks tick by tick. In the
  common case the budget is not reached and every candidate is visited every tick.
"""
from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from shared import metrics
from shared.declaration import RESCAN_BUDGET, RESCAN_WORKERS
from shared.kube import Forbidden
from shared.settings import SettingsError, format_duration

C = TypeVar("C")
T = TypeVar("T")

# The Trigger's delivery timeout (deploy/base/<function>.yaml `delivery.timeout: PT30S`;
# tests/deploy check that they agree). The budget (shared/declaration.py RESCAN_BUDGET: 20s) leaves a third of it
# for visits already started and for the answer to travel back.
DELIVERY_TIMEOUT = timedelta(seconds=30)
DEFAULT_BUDGET: timedelta = RESCAN_BUDGET.value
DEFAULT_WORKERS = int(RESCAN_WORKERS.value)


@dataclass(frozen=True)
class Settings:
    budget: timedelta = DEFAULT_BUDGET
    workers: int = DEFAULT_WORKERS


def load(environ: Mapping[str, str]) -> Settings:
    """RESCAN_BUDGET (a duration, at most the delivery timeout) and RESCAN_WORKERS (1-32)."""
    budget = RESCAN_BUDGET.read(environ)
    if not timedelta(seconds=1) <= budget <= DELIVERY_TIMEOUT:
        raise SettingsError(f"RESCAN_BUDGET={format_duration(budget)} must be from 1s to the Trigger's delivery "
                            f"timeout ({format_duration(DELIVERY_TIMEOUT)}); use a value like "
                            f"{format_duration(DEFAULT_BUDGET)}.")
    workers = RESCAN_WORKERS.read(environ)
    if workers != int(workers):
        raise SettingsError(f"RESCAN_WORKERS={workers:g} is not a whole number; use a value like {DEFAULT_WORKERS}.")
    return Settings(budget=budget, workers=int(workers))


@dataclass(frozen=True)
class Failure:
    subject: str
    message: str


@dataclass
class Scan(Generic[T]):
    """What one re-scan's visits came to."""

    candidates: int
    results: list[T] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    visited: int = 0
    stopped: bool = False      # the budget ran out before every candidate was visited
    seconds: float = 0.0

    def progress(self) -> str:
        """One sentence for the outcome's reason: how far the visits got."""
        text = f"visited {self.visited} of {self.candidates} candidate(s) in {self.seconds:.1f} s"
        if self.failures:
            shown = "; ".join(f"{f.subject}: {f.message}" for f in self.failures[:3])
            more = f" and {len(self.failures) - 3} more" if len(self.failures) > 3 else ""
            text += f"; {len(self.failures)} failed, retried next tick ({shown}{more})"
        if self.stopped:
            text += f"; stopped at the re-scan budget, the next tick visits the other {self.candidates - self.visited}"
        return text


def begin() -> float:
    """When a re-scan began, for `run(started=...)`: its budget counts the listing of candidates too."""
    return time.monotonic()


def gather(items: Sequence[C], read: Callable[[C], T], settings: Settings) -> list[T]:
    """`read` of each item, up to `settings.workers` at once, in the items' order (e.g. one Table LIST per
    namespace: against a slow API their latencies overlap). The first error is raised: listing candidates
    is not one object's business, and a re-scan that cannot list answers 503 as before."""
    if len(items) <= 1 or settings.workers <= 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(settings.workers, len(items)), thread_name_prefix="rescan") as pool:
        return list(pool.map(read, items))


def run(candidates: Sequence[C], visit: Callable[[C], T | None], settings: Settings, *,
        subject: Callable[[C], str] | None = None, rotation: int = 0, started: float | None = None,
        timer: Callable[[], float] = time.monotonic) -> Scan[T]:
    """Visit the candidates (see the module docstring); `visit` returning None adds no result. `started`:
    when the re-scan began (`begin()`), so that finding the candidates counts against the budget. `subject`
    names a candidate in `Scan.failures` (default: "namespace/name" of a candidate that has both, else str)."""
    name = subject or _subject
    ordered = list(candidates)
    if ordered:
        start = rotation % len(ordered)
        ordered = ordered[start:] + ordered[:start]
    scan: Scan[T] = Scan(len(ordered))
    began = timer() if started is None else started
    deadline = began + settings.budget.total_seconds()
    longest = [0.0]
    lock = threading.Lock()
    denied: list[Forbidden] = []

    def one(candidate: C) -> None:
        started = timer()
        try:
            result = visit(candidate)
        except Exception as exc:  # noqa: BLE001 - one object's failure, whatever it is, is that object's only
            with lock:
                scan.failures.append(Failure(name(candidate), _message(exc)))
                if isinstance(exc, Forbidden):
                    denied.append(exc)
        else:
            if result is not None:
                with lock:
                    scan.results.append(result)
        finally:
            with lock:
                scan.visited += 1
                longest[0] = max(longest[0], timer() - started)

    pending: set[Future] = set()
    with ThreadPoolExecutor(max_workers=max(1, settings.workers), thread_name_prefix="rescan") as pool:
        for index, candidate in enumerate(ordered):
            while len(pending) >= settings.workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
            # The first visit always starts: every tick makes progress, whatever the API's speed.
            if index and timer() + longest[0] > deadline:
                scan.stopped = True
                break
            # Each visit in a copy of this context: what set the re-scan off (shared/metrics.py) goes with it.
            pending.add(pool.submit(contextvars.copy_context().run, one, candidate))
        wait(pending)
    scan.seconds = timer() - began
    if scan.stopped:
        metrics.RESCAN_STOPS.inc(metrics.FUNCTION.get())
    if denied:
        raise Forbidden(f"{denied[0].message} ({len(denied)} of {scan.visited} visit(s) refused; "
                        f"{scan.progress()})")
    return scan


def _subject(candidate: object) -> str:
    namespace, name = getattr(candidate, "namespace", None), getattr(candidate, "name", None)
    return f"{namespace}/{name}" if namespace is not None and name is not None else str(candidate)


def _message(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc) or exc.__class__.__name__
    return text if len(text) <= 300 else text[:297] + "..."


def tick_number(now: datetime) -> int:
    """The `rotation` for a re-scan at `now`: minutes since the epoch (the Trigger's PingSource ticks each minute)."""
    return int(now.timestamp() // 60)

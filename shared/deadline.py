"""A delivery's deadline, for every request it sends (issue 34).

The broker gives up on a delivery after the Trigger's timeout (30 s, shared/rescan.py DELIVERY_TIMEOUT) and sends it
again; whatever the first one still does is then done for nobody. A request to the API server can last its whole
timeout (shared.kube.REQUEST_TIMEOUT: 3 s to connect, 10 s to read) while kube-apiserver holds it (a quorum read
waits for etcd), so a handler that makes a few of them in a row, as vmi-cleanup's wait after a DELETE whose answer
was lost did, can overrun the broker without any one of them overrunning its own timeout. Within `until(at)`, every
request the thread sends is given timeouts that end it by `at` at the latest (its connection tried three times, then
its read), and none is sent once less than MIN_CALL is left: the handler answers (a 503, or what it has) before the
broker gives up, however long each call would have lasted.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MIN_CALL = 0.5  # seconds: with less left, a request is not sent
CONNECT_TRIES = 3  # urllib3 Retry(connect=2) in shared/kubeconfig.py: a connection is tried three times
_local = threading.local()


@contextmanager
def until(at: float) -> Iterator[None]:
    """Requests sent by this thread within end by `at` (a time.monotonic() value). Nested, the earlier one holds."""
    before: float | None = getattr(_local, "at", None)
    _local.at = at if before is None else min(before, at)
    try:
        yield
    finally:
        _local.at = before


def time_left() -> float | None:
    """Seconds left until this thread's deadline; None without one."""
    at: float | None = getattr(_local, "at", None)
    return None if at is None else at - time.monotonic()


def request_timeout(usual: tuple[float, float]) -> tuple[float, float] | None:
    """The (connect, read) timeout of a request sent now: `usual` when even its worst case fits before the deadline,
    else a share of what is left such that it does; None when less than MIN_CALL is left (not to be sent). The
    worst case counts the connection tried CONNECT_TRIES times (shared/kubeconfig.py retries a failed connection
    twice, at once; a read is never retried), then the read."""
    left = time_left()
    connect, read = usual
    if left is None or left >= CONNECT_TRIES * connect + read:
        return usual
    if left < MIN_CALL:
        return None
    connect = min(connect, left / (2 * CONNECT_TRIES))
    return connect, left - CONNECT_TRIES * connect

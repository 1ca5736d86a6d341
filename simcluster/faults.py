"""Faults injected into HTTP requests on demand: error statuses, latency, dropped and cut connections.

A real API server throttles (429 with Retry-After, API Priority and Fairness), restarts (503, reset
connections, watches ended mid-stream) and slows down; the functions must turn each into a retry, not a
lost event. Tests switch these on per method, path and caller. Direct `SimCluster` access never sees them.
The same `Faults` drives the simulated API server (simcluster/apiserver.py) and the proxy in front of a
real kube-apiserver (controlplane/faultproxy.py), so a fault-injection test runs on both backends.

Kinds: `status` answers `status` (with Retry-After when `retry_after` is set) instead of the server;
`latency` waits `delay` seconds, then the request goes on; `drop` closes the connection without an answer
(the request never reaches the server); `cut` lets the answer start, then closes the connection: a plain
answer after half its body, a watch after `delay` seconds of streaming, without the stream's end. `call`,
on any kind, is called (with no arguments) when the fault is taken, before its effect: a test kills a
process on a request seen, for instance.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("status", "latency", "drop", "cut")

# Reason and message of each code as the apiserver's own filters write them (APF's 429 "Too many requests,
# please try again later."; errors.NewServiceUnavailable; errors.NewInternalError; errors.NewTimeoutError).
_STATUS_WORDS = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: ("Conflict", "the server reported a conflict"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted, but may still be "
                     "processing the request"),
}


@dataclass
class Fault:
    method: str | None = None
    path: str | None = None             # a regular expression searched in the URL path
    service_account: str | None = None  # "ns/name", or "admin"
    kind: str = "status"
    status: int = 503
    retry_after: float | None = None
    delay: float = 0.0
    times: int | None = 1               # None: until cleared
    call: Callable[[], object] | None = None
    hits: int = 0
    _pattern: re.Pattern | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, got {self.kind!r}")
        self._pattern = re.compile(self.path) if self.path else None

    def matches(self, method: str, path: str, identity: str | None) -> bool:
        return ((self.method is None or self.method.upper() == method)
                and (self._pattern is None or self._pattern.search(path) is not None)
                and (self.service_account is None or self.service_account == identity)
                and (self.times is None or self.hits < self.times))

    def status_body(self) -> dict:
        reason, message = _STATUS_WORDS.get(self.status, ("InternalError" if self.status >= 500 else "BadRequest",
                                                          f"injected fault {self.status}"))
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "code": self.status}
        if self.retry_after is not None:
            body["details"] = {"retryAfterSeconds": int(self.retry_after)}
        return body


class Faults:
    """The active faults, consulted once per HTTP request; each use counts against `times`."""

    def __init__(self):
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, method=None, path=None, service_account=None, kind="status", status=503, retry_after=None,
            delay=0.0, times=1, call=None) -> Fault:
        fault = Fault(method, path, service_account, kind, status, retry_after, delay, times, call)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self):
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str, identity: str | None) -> list[Fault]:
        """The faults that apply to this request (latency first), each counted as used."""
        with self._lock:
            hit = [f for f in self._faults if f.matches(method, path, identity)]
            for fault in hit:
                fault.hits += 1
        for fault in hit:
            if fault.call is not None:
                fault.call()
        return sorted(hit, key=lambda f: f.kind != "latency")

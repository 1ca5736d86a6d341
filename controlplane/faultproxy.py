"""A fault injector in front of the real kube-apiserver, so that what the simulator's faults prove is proven
against the real server too.

It is a stand-in for one layer only: the network between a client and kube-apiserver (a load balancer, an
API server that restarts, throttles or stalls). It terminates TLS with a serving certificate of the run's own
CA (controlplane/pki.py) and re-originates it to kube-apiserver, verifying the server against that CA, and
passes every request and answer through unchanged (streams too: watches are relayed as they come) unless a
fault of `simcluster.faults.Faults` matches it. The functions' and the ApiServerSource adapter's kubeconfigs
point here (controlplane/cluster.py), the admin's point at kube-apiserver directly, as the simulator's direct
access never sees faults.

What it decides, and nothing else: which request a fault applies to, by method, path and caller. The caller is
the `sub` claim of the bearer token (`system:serviceaccount:<ns>:<name>`), read without verifying the token:
kube-apiserver verifies it when the request is passed on; a request with no token is "admin" (the admin uses a
client certificate, which a TLS-terminating proxy cannot pass on, so it does not come through here).

While kube-apiserver is down the proxy accepts a connection and closes it without an answer: a client sees the
connection end (as through a load balancer), not "connection refused".

It also measures what the API server is asked, as a load balancer's metrics would: every request with its
caller, status, start and end (`records`), requests in flight per caller and at most (`peak`), so a test can
bound the API concurrency of a burst.
"""
from __future__ import annotations

import base64
import binascii
import http.client
import json
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from simcluster.faults import Fault, Faults

# Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own on each side, never passed on.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
SA_PREFIX = "system:serviceaccount:"
ADMIN = "admin"
CHUNK = 64 * 1024
IDLE_REUSE = 2.0  # seconds an upstream connection may sit idle and still carry a write


@dataclass
class ProxyRecord:
    """One request as the proxy saw it."""

    identity: str
    method: str
    path: str
    query: str
    started: float            # time.monotonic()
    ended: float = 0.0
    status: int = 0           # 0: no answer (dropped, or kube-apiserver unreachable)
    injected: str = ""        # the fault's kind, when one applied
    retry_after: str = ""     # the Retry-After header of the answer

    @property
    def watch(self) -> bool:
        return "watch=1" in self.query or "watch=true" in self.query


def identity_of(authorization: str | None) -> str:
    """`ns/name` of a ServiceAccount token's `sub` claim; "admin" without a token; the raw `sub` otherwise."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or token.count(".") != 2:
        return ADMIN
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return "unknown"
    subject = str(claims.get("sub") or "") if isinstance(claims, dict) else ""
    return subject[len(SA_PREFIX):].replace(":", "/", 1) if subject.startswith(SA_PREFIX) else subject or "unknown"


class FaultProxy:
    """`FaultProxy(upstream_url, ca_cert, serving_cert, serving_key).start()`; `url`, `faults`, `records`."""

    def __init__(self, upstream: str, ca_cert: Path, serving_cert: Path, serving_key: Path):
        self.upstream = urlsplit(upstream)
        self.faults = Faults()
        self.records: list[ProxyRecord] = []
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()
        self._client_tls = ssl.create_default_context(cafile=str(ca_cert))
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(str(serving_cert), str(serving_key))
        self._server: ThreadingHTTPServer | None = None

    # -- life --------------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.socket = self._server_tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.1,), name="faultproxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the proxy is not started"
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    # -- measures ----------------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the records and peaks (the faults stay: `faults.clear()` ends them)."""
        with self._lock:
            self.records.clear()
            self._peak = Counter(self._in_flight)

    def peak(self, identity: str | None = None) -> int:
        """The most requests (watches left out) in flight at once since the last clear: of one caller, or of all."""
        with self._lock:
            return self._peak[identity or "*"]

    def _begin(self, record: ProxyRecord) -> None:
        with self._lock:
            self.records.append(record)
            if not record.watch:
                for key in (record.identity, "*"):
                    self._in_flight[key] += 1
                    self._peak[key] = max(self._peak[key], self._in_flight[key])

    def _end(self, record: ProxyRecord) -> None:
        with self._lock:
            record.ended = time.monotonic()
            if not record.watch:
                for key in (record.identity, "*"):
                    self._in_flight[key] -= 1

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.upstream.hostname or "127.0.0.1", self.upstream.port,
                                           context=self._client_tls, timeout=120)


class _Dropped(Exception):
    """The client's connection is to be closed without (the rest of) an answer."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on the client's connection: an answer is written as its headers, then its body; with Nagle's
    # algorithm the body waited for the client's delayed ACK of the headers, about 45 ms on every request
    # through the proxy (measured: a function's GET 49 ms through it, 1.8 ms with this, 2 ms direct).
    disable_nagle_algorithm = True
    owner: FaultProxy
    _upstream: http.client.HTTPSConnection | None = None
    _used = 0.0  # when the upstream connection last answered

    def log_message(self, *args) -> None:
        pass

    def finish(self) -> None:
        super().finish()
        if self._upstream is not None:  # the client's connection ended: so does its upstream one
            self._upstream.close()
            self._upstream = None

    def do_GET(self) -> None:  # noqa: N802
        self._relay()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET  # noqa: N815

    def _relay(self) -> None:
        proxy = self.owner
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        record = ProxyRecord(identity_of(self.headers.get("Authorization")), self.command, url.path, url.query,
                             time.monotonic())
        proxy._begin(record)
        try:
            cut = self._faults(record, proxy.faults.take(self.command, url.path, record.identity))
            if record.status:
                return
            self._forward(record, body, cut)
        except _Dropped:
            self._close()
        except OSError:  # the client went away, or its TLS failed
            self._close()
        finally:
            proxy._end(record)

    def _faults(self, record: ProxyRecord, faults: list[Fault]) -> Fault | None:
        """Apply the faults taken (latency first); the `cut` to apply to the answer, if any."""
        cut = None
        for fault in faults:
            record.injected = record.injected or fault.kind
            if fault.kind == "latency":
                time.sleep(fault.delay)
            elif fault.kind == "drop":
                raise _Dropped()
            elif fault.kind == "cut":
                cut = fault
            else:
                body = json.dumps(fault.status_body()).encode()
                headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
                self._answer(record, fault.status, body, headers)
                return None
        return cut

    def _answer(self, record: ProxyRecord, status: int, body: bytes, headers: dict[str, str]) -> None:
        record.status, record.retry_after = status, headers.get("Retry-After", "")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, record: ProxyRecord, body: bytes, cut: Fault | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        headers["Host"] = f"{self.owner.upstream.hostname}:{self.owner.upstream.port}"
        response = None
        # A kept-alive upstream connection may have been closed since (kube-apiserver restarted): a read is tried
        # once more on a fresh one. A write never is: it may have been applied with its answer lost, and the proxy
        # must not make one request two (the client sees the connection end and decides, as without a proxy).
        tries = 2 if self.command in ("GET", "HEAD", "OPTIONS") and self._upstream is not None else 1
        if tries == 1 and self._upstream is not None and time.monotonic() - self._used > IDLE_REUSE:
            self._upstream.close()  # a write goes on a connection known to be alive, or on a fresh one
            self._upstream = None
        for attempt in range(1, tries + 1):
            if self._upstream is None:
                self._upstream = self.owner._connect()
            try:
                self._upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = self._upstream.getresponse()
                break
            except (OSError, http.client.HTTPException):
                self._upstream.close()
                self._upstream = None
                if attempt == tries:
                    raise _Dropped() from None  # kube-apiserver is down: the client sees the connection end
        assert response is not None
        self._used = time.monotonic()
        record.status, record.retry_after = response.status, response.getheader("Retry-After") or ""
        length = response.getheader("Content-Length")
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if length is not None:
                data = response.read()
                if cut is not None:  # half the body, then the connection closes
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    raise _Dropped()
                self.wfile.write(data)
                return
            self._stream(response, cut)
        except (OSError, http.client.HTTPException):
            raise _Dropped() from None
        finally:
            if response.will_close or cut is not None:
                self._upstream.close() if self._upstream else None
                self._upstream = None

    def _stream(self, response: http.client.HTTPResponse, cut: Fault | None) -> None:
        """Relay a chunked answer (a watch) as it comes; a cut ends it after its delay, without the end chunk,
        by closing both connections from a timer (a read that waits is then woken by the close)."""
        timer = None
        if cut is not None:
            upstream = self._upstream
            timer = threading.Timer(cut.delay, lambda: (self._close(), upstream.close() if upstream else None))
            timer.daemon = True
            timer.start()
        try:
            while True:
                try:
                    data = response.read1(CHUNK)
                except (AttributeError, ValueError):  # closed under it by the cut's timer (fp is None)
                    raise _Dropped() from None
                if not data:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if cut is not None:
                raise _Dropped()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            if timer is not None:
                timer.cancel()

    def _close(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

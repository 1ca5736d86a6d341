"""deploy/ run through Knative's own data plane, with the face of localknative.runtime.LocalKnative, so an e2e world
on the real backend (tests/e2e.py) asks the same questions of Knative's broker that it asks of the stand-in.

`KnativeRuntime(knative, manifests, kubeconfig_for, ...).start()` starts every Knative Service of deploy/ as a
functions-framework server with its own ServiceAccount's credentials (as LocalKnative does), and the Serving
stand-in (controlplane/knative.py `serve`) gives each Service the address of a recording front on the host's
loopback that forwards to it. Everything between the cluster and the function is Knative's: the ApiServerSource
adapters its controller deployed for deploy/'s sources, the MT channel-based broker's ingress, the in-memory channel's
dispatcher and the broker's filter, routing by deploy/'s own Triggers, their retries and dead-letter sink, and the
replies the functions answer with, published back through the ingress. Knative's PingSource adapter sends deploy/'s
ticks on its schedule (every minute).

What the runtime adds, and what each part decides (nothing about delivery):

- **The fronts** record each attempt the broker makes (a `localknative.broker.Delivery`: the event's id, type and
  subject, the Trigger, the attempt's number, the answer's status and reply) and forward it unchanged. A function
  that does not answer is a 502 from its front (Knative retries a 5xx as it retries a refused connection).
- **A tap**: a Trigger with no filter (`vmevents-tap`) whose subscriber records every event the broker took in,
  the functions' replies among them (`broker.received`).
- **`broker.publish` and `ping.tick()`** POST an event to the broker's ingress, as a source would: a tick is the
  event deploy/'s PingSource sends (localknative.sources.make_ping_event), on demand instead of at the next minute.
- **`wait_idle`**: Knative says nothing about what it holds, so idle means no request in flight at a front or the
  tap, every published event seen by the tap, every failed attempt followed by a success or a dead letter, and
  nothing new for `QUIET` seconds.
- **time_scale** shortens each Trigger's backoff, as LocalKnative multiplies its own, so the retries and dead letters
  of the fault tests take seconds, not minutes. Knative reads a duration to a tenth of a second (rickb777/date
  v1.13.0 `period.Parse` keeps one decimal place: `PT0.05S` is no backoff at all), so a scaled exponential backoff
  cannot be both short and non-zero: a scaled Trigger retries linearly, `backoffDelay` the scaled value but at least
  0.1 s (deploy/'s 6 retries then take 2.1 s, 8 take 3.6 s). Retry count and timeout are deploy/'s.
- **The PingSource's schedule** is set to one that does not come round (29 February) while the runtime runs, as
  LocalKnative's PingSource ticks only when asked: a test that counts a function's requests between two of its own
  ticks is not joined by the minute's. Knative's PingSource adapter delivering deploy/'s minute ticks is shown by
  tests/controlplane/test_knative.py and test_knative_story.py.

`stop()` puts both back as they were (and applying deploy/ again, as the next world does, would too). A Trigger
whose delivery changes gets a new Subscription, and the in-memory channel can keep the old one's entry, delivering
every event to that Trigger twice (knative/eventing#6356): start and stop remove such entries
(`Knative.drop_stale_subscribers`), so a world sees the channel an install that never edited its Triggers has.
"""
from __future__ import annotations

import http.client
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.http import CloudEvent, from_http

from localknative.broker import Delivery, binary_request, knative_duration
from localknative.runtime import of_kind
from localknative.serving import FunctionServer, service_account
from localknative.sources import make_ping_event

QUIET = 0.3           # seconds with nothing new before the data plane counts as idle
TAP = "vmevents-tap"  # the Trigger (and Knative Service) that sees every event the broker takes in
DEAD_PORT = 9         # where a stopped runtime's Services point (nothing listens there): deliveries fail fast
MIN_BACKOFF = 0.1  # Knative's shortest backoff that is not none (one decimal place)
NEVER = "0 0 29 2 *"  # a schedule that is not due for years
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade",
        "proxy-connection"}
_TRIGGER_PATH = re.compile(r"/triggers/([^/]+)/([^/]+)/")


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request's body, sent with a Content-Length or chunked (Go's client does either)."""
    if (handler.headers.get("Transfer-Encoding") or "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class _Server:
    """A threaded HTTP server on 127.0.0.1 whose POSTs `answer(headers, body) -> (status, headers, body)` answers,
    with the runtime's activity counted around each."""

    def __init__(self, runtime: KnativeRuntime, answer: Callable[[dict[str, str], bytes],
                                                               tuple[int, dict[str, str], bytes]]):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                runtime._begin()
                try:
                    body = _read_body(self)
                    status, headers, payload = answer({k.lower(): v for k, v in self.headers.items()}, body)
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                finally:
                    runtime._end()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Broker:
    """What a test reads of the broker: `received`, `deliveries`, `publish`, `wait_idle`, `url`."""

    def __init__(self, runtime: KnativeRuntime):
        self._runtime = runtime
        self.received: list[CloudEvent] = []
        self.deliveries: list[Delivery] = []

    @property
    def url(self) -> str:
        return self._runtime.ingress

    def publish(self, event: CloudEvent) -> list[str]:
        self._runtime.publish(event)
        return []

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return self._runtime.wait_idle(timeout)


class _Ping:
    """deploy/'s PingSource, ticked on demand through the ingress (its adapter also ticks on its schedule)."""

    def __init__(self, runtime: KnativeRuntime, manifest: Mapping[str, Any]):
        self._runtime, self.manifest = runtime, manifest

    def tick(self) -> CloudEvent:
        event = make_ping_event(self.manifest)
        self._runtime.publish(event)
        return event


class KnativeRuntime:
    """deploy/ on Knative's data plane. After `start()`: `.broker`, `.functions[name]`, `.ping`, `.pings[name]`."""

    def __init__(self, knative, manifests: list[Mapping[str, Any]], kubeconfig_for: Callable[[str], Any],
                 env_overrides: Mapping[str, Mapping[str, str]] | None = None, time_scale: float = 1.0,
                 function_server: Callable[..., FunctionServer] = FunctionServer, namespace: str = "vmevents",
                 ping_interval: float | None = None, on_delivery: Callable[[Delivery], None] | None = None,
                 on_log: Callable[[str, str], None] | None = None):
        """ping_interval: tick every so many seconds (`make run`'s stories), as LocalKnative's PingSource does;
        on_delivery and on_log: as LocalKnative's (localknative.timeline prints them)."""
        self.knative, self.manifests, self.kubeconfig_for = knative, manifests, kubeconfig_for
        self.env_overrides = dict(env_overrides or {})
        self.time_scale, self.function_server, self.namespace = time_scale, function_server, namespace
        self.ping_interval, self.on_delivery, self.on_log = ping_interval, on_delivery, on_log
        self._stopping = threading.Event()
        self.functions: dict[str, FunctionServer] = {}
        self.sources: dict[str, Any] = {}  # Knative's controller runs the adapters (knative.kubelet.pods)
        self.pings: dict[str, _Ping] = {}
        self.broker = _Broker(self)
        self.ingress = ""
        self.stale_subscribers = 0  # entries of an old Subscription the start removed from the channel
        self._fronts: dict[str, _Server] = {}
        self._tap: _Server | None = None
        self._cond = threading.Condition()
        self._inflight = 0
        self._last = time.monotonic()
        self._restore: list[tuple[str, dict]] = []  # (path, merge patch) that undo what start() changed
        self._expected: set[str] = set()           # ids published, not yet seen by the tap
        self._failing: set[tuple[str, str]] = set()  # (trigger, id) whose last attempt failed, no dead letter yet
        triggers = of_kind(manifests, "eventing.knative.dev", "Trigger")
        self._trigger_of: dict[str, str] = {}      # Knative Service → the Trigger that subscribes it
        for trigger in triggers:
            ref = ((trigger.get("spec") or {}).get("subscriber") or {}).get("ref") or {}
            self._trigger_of.setdefault(ref.get("name", ""), trigger["metadata"]["name"])
        brokers = of_kind(manifests, "eventing.knative.dev", "Broker")
        deliveries = [(o.get("spec") or {}).get("delivery") or {} for o in [*triggers, *brokers]]
        self._dead_letter_services = {((d.get("deadLetterSink") or {}).get("ref") or {}).get("name")
                                      for d in deliveries} - {None}
        services = {m["metadata"]["name"] for m in of_kind(manifests, "serving.knative.dev", "Service")}
        unknown = set(self.env_overrides) - services
        if unknown:
            raise ValueError(f"env_overrides name no Knative Service in the manifests: {sorted(unknown)}")

    @property
    def ping(self) -> _Ping | None:
        return next(iter(self.pings.values()), None)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> KnativeRuntime:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        api, ns = self.knative.api, self.namespace
        for svc in of_kind(self.manifests, "serving.knative.dev", "Service"):
            name = svc["metadata"]["name"]
            on_log = (lambda line, _n=name: self.on_log(_n, line)) if self.on_log else None
            server = self.function_server(svc, kubeconfig=self.kubeconfig_for(f"{ns}/{service_account(svc)}"),
                                          env_overrides=self.env_overrides.get(name), on_log=on_log)
            self.functions[name] = server
            server.start()
            front = self._fronts[name] = _Server(self, self._forwarder(name, server))
            self.knative.serve(ns, name, front.port)
        self._tap = _Server(self, self._tapped)
        self.knative.serve(ns, TAP, self._tap.port)
        api.request("POST", f"/apis/serving.knative.dev/v1/namespaces/{ns}/services", {
            "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": TAP},
            "spec": {"template": {"spec": {"containers": [{"image": "example.com/vmevents-tap:1"}]}}}}, allow=(409,))
        api.request("POST", f"/apis/eventing.knative.dev/v1/namespaces/{ns}/triggers", {
            "apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": TAP},
            "spec": {"broker": "default", "subscriber": {"ref": {
                "apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": TAP}}}}, allow=(409,))
        self._scale_deliveries()
        self._suspend_schedules()
        self.knative.wait_ready("eventing.knative.dev/v1", "Broker", ns, "default", timeout=timeout)
        for trigger in [*self._trigger_of.values(), TAP]:
            self._wait_trigger(trigger, timeout)
        self.stale_subscribers = self.knative.drop_stale_subscribers(ns)
        for source in of_kind(self.manifests, "sources.knative.dev", "ApiServerSource"):
            self.knative.wait_ready("sources.knative.dev/v1", "ApiServerSource", ns, source["metadata"]["name"],
                                    timeout=timeout)
        self.knative.kubelet.wait_names()  # the functions' and the tap's names, in every pod's hosts file
        self.ingress = self.knative.ingress_url(ns)
        for manifest in of_kind(self.manifests, "sources.knative.dev", "PingSource"):
            self.pings[manifest["metadata"]["name"]] = _Ping(self, manifest)
        self._wait_listening(timeout)
        if self.ping_interval is not None:
            threading.Thread(target=self._ticking, name="ticks", daemon=True).start()

    def _ticking(self) -> None:
        while not self._stopping.wait(self.ping_interval):
            for ping in list(self.pings.values()):
                try:
                    ping.tick()
                except OSError:  # the ingress restarting: the next tick comes
                    pass

    def _scale_deliveries(self) -> None:
        """Each of deploy/'s Triggers with its delivery's backoffDelay multiplied by time_scale, linear and at least
        MIN_BACKOFF (the Broker's delivery where the Trigger has none)."""
        if self.time_scale == 1.0:
            return
        api, ns = self.knative.api, self.namespace
        broker = api.get(api.path("eventing.knative.dev/v1", "Broker", ns, "default"))
        for name in self._trigger_of.values():
            path = api.path("eventing.knative.dev/v1", "Trigger", ns, name)
            trigger = api.get(path)
            delivery = dict((trigger.get("spec") or {}).get("delivery") or (broker.get("spec") or {}).get("delivery")
                            or {})
            if not delivery.get("backoffDelay"):
                continue
            seconds = max(knative_duration(delivery["backoffDelay"]) * self.time_scale, MIN_BACKOFF)
            self._restore.append((path, {"spec": {"delivery": (trigger.get("spec") or {}).get("delivery")}}))
            api.patch(path, {"spec": {"delivery": {**delivery, "backoffPolicy": "linear",
                                                   "backoffDelay": f"PT{int(seconds * 10) / 10:.1f}S"}}})

    def _suspend_schedules(self) -> None:
        api = self.knative.api
        for manifest in of_kind(self.manifests, "sources.knative.dev", "PingSource"):
            path = api.path("sources.knative.dev/v1", "PingSource", self.namespace, manifest["metadata"]["name"])
            source = api.get(path)
            self._restore.append((path, {"spec": {"schedule": source["spec"]["schedule"]}}))
            api.patch(path, {"spec": {"schedule": NEVER}})

    def _wait_trigger(self, name: str, timeout: float) -> None:
        """Until Knative has reconciled the Trigger as it is now (its observedGeneration) and it is Ready."""
        api = self.knative.api
        path, deadline, found = api.path("eventing.knative.dev/v1", "Trigger", self.namespace, name), \
            time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            found = api.get(path, allow=(404,)) or {}
            status = found.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if ready and status.get("observedGeneration", 0) >= (found.get("metadata") or {}).get("generation", 1):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Trigger {self.namespace}/{name} was not Ready within {timeout:.0f}s: "
                           f"{(found or {}).get('status')}")

    def _wait_listening(self, timeout: float) -> None:
        """Until an event published now reaches the tap: the ingress, the channel and the filter route it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # a type no Trigger of deploy/ takes (alert-forwarder takes io.vmevents.*): the tap alone sees it
            probe = CloudEvent({"type": "dev.vmevents-tests.probe", "source": "/vmevents/tests/knative-runtime"}, None)
            try:
                self._post(probe)
            except OSError:
                time.sleep(0.5)
                continue
            with self._cond:
                if self._cond.wait_for(lambda probe=probe: probe["id"] not in self._expected, timeout=5):
                    return
        raise RuntimeError(f"no event reached the tap through Knative's broker within {timeout:.0f}s")

    def stop(self) -> None:
        self._stopping.set()
        # Knative's objects stay (the next world applies deploy/ again); their addresses now lead nowhere, so
        # what the adapters send meanwhile fails fast instead of reaching another world's servers.
        for name in [*self._fronts, *([TAP] if self._tap else [])]:
            try:
                self.knative.serve(self.namespace, name, DEAD_PORT)
            except Exception:  # noqa: BLE001 - stopping what started, whatever failed
                pass
        api = self.knative.api
        for kind in ("Trigger", "Service"):  # the tap would take every event the adapters send, and fail it
            group = "eventing.knative.dev/v1" if kind == "Trigger" else "serving.knative.dev/v1"
            try:
                api.delete(group, kind, self.namespace, TAP)
            except Exception:  # noqa: BLE001 - stopping what started, whatever failed
                pass
        for path, patch in reversed(self._restore):
            try:
                api.patch(path, patch)
            except Exception:  # noqa: BLE001 - the next world's apply puts deploy/'s values back too
                pass
        if self._restore:
            try:
                self.knative.drop_stale_subscribers(self.namespace)
            except Exception:  # noqa: BLE001 - the next runtime's start drops them too
                pass
        for server in [*self._fronts.values(), *([self._tap] if self._tap else [])]:
            server.stop()
        stopping = [threading.Thread(target=server.stop) for server in self.functions.values()]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()

    # -- what the broker did -----------------------------------------------------------------------------

    def publish(self, event: CloudEvent) -> None:
        """POST the event to the broker's ingress in binary mode, as a source does (JSON data says so in its
        datacontenttype, as the ApiServerSource's and the PingSource's events do), and return at once: the
        in-memory channel holds the POST open until every subscriber's delivery, retries included, is over
        (docs/facts.md §6), and a test acts meanwhile (a receiver back up between two retries)."""
        with self._cond:
            self._expected.add(event["id"])  # before the thread runs: a wait right after this one waits for it
        threading.Thread(target=self._post_quietly, args=(event,), name="publish", daemon=True).start()

    def _post_quietly(self, event: CloudEvent) -> None:
        try:
            self._post(event)
        except OSError:  # the ingress restarting: what a source loses, a test sees as never taken in
            pass

    def _post(self, event: CloudEvent) -> None:
        if event.get("datacontenttype") is None and isinstance(event.data, (dict, list)):
            event["datacontenttype"] = "application/json"
        headers, body = binary_request(event)
        with self._cond:
            self._expected.add(event["id"])
        request = urllib.request.Request(self.ingress, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
        except BaseException:
            with self._cond:
                self._expected.discard(event["id"])
                self._cond.notify_all()
            raise

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                busy = self._inflight or self._expected or self._failing
                quiet_for = time.monotonic() - self._last
                if not busy and quiet_for >= QUIET:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, max(QUIET - quiet_for, 0.02)))

    def _begin(self) -> None:
        with self._cond:
            self._inflight += 1
            self._last = time.monotonic()

    def _end(self) -> None:
        with self._cond:
            self._inflight -= 1
            self._last = time.monotonic()
            self._cond.notify_all()

    def _tapped(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            event = from_http(headers, body)
        except Exception:  # noqa: BLE001 - the broker only carries CloudEvents; keep the tap answering
            return 202, {}, b""
        with self._cond:
            self.broker.received.append(event)
            self._expected.discard(event["id"])
            self._cond.notify_all()
        return 202, {}, b""

    def _forwarder(self, service: str, server: FunctionServer) -> Callable[[dict[str, str], bytes],
                                                                          tuple[int, dict[str, str], bytes]]:
        dead_letter_sink = service in self._dead_letter_services

        def forward(headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
            sent = {k: v for k, v in headers.items() if k not in _HOP}
            status, answer_headers, payload, error, answered = 502, {}, b"", None, False
            connection = http.client.HTTPConnection("127.0.0.1", server.port or 0, timeout=60)
            try:
                connection.request("POST", "/", body=body, headers=sent)
                response = connection.getresponse()
                payload = response.read()
                status, answered = response.status, True
                answer_headers = {k: v for k, v in response.getheaders() if k.lower() not in _HOP}
            except (OSError, http.client.HTTPException) as exc:
                error = f"the function did not answer: {exc}"
            finally:
                connection.close()
            lower = {k.lower(): v for k, v in answer_headers.items()}
            reply = "ce-id" in lower or lower.get("content-type", "").startswith("application/cloudevents")
            if error is None and not 200 <= status < 300:
                error = f"HTTP {status}"
            elif error is None and payload and not reply:
                error = "a 2xx whose body is not a CloudEvent"
            self._record(service, dead_letter_sink, headers, status if answered else None, error, lower)
            return status, answer_headers, payload

        return forward

    def _record(self, service: str, dead_letter: bool, headers: dict[str, str], status: int | None,
                error: str | None, answer: dict[str, str]) -> None:
        event_id = headers.get("ce-id", "")
        with self._cond:
            trigger = self._trigger_for_dead_letter(headers, event_id) if dead_letter else \
                self._trigger_of.get(service, service)
            attempt = 1 + sum(1 for d in self.broker.deliveries if d.event_id == event_id and d.trigger == trigger
                              and d.dead_lettered == dead_letter)
            record = Delivery(
                event_id=event_id, type=headers.get("ce-type", ""), subject=headers.get("ce-subject"),
                trigger=trigger, attempt=attempt, status=status, error=error,
                reply_id=answer.get("ce-id"), reply_type=answer.get("ce-type"), dead_lettered=dead_letter,
                target=f"http://{service}.{self.namespace}.svc.cluster.local", retry_after=answer.get("retry-after"))
            self.broker.deliveries.append(record)
            if dead_letter or error is None:
                self._failing.discard((trigger, event_id))
            else:
                self._failing.add((trigger, event_id))
            self._last = time.monotonic()
            self._cond.notify_all()
        if self.on_delivery:
            try:
                self.on_delivery(record)
            except Exception:  # noqa: BLE001 - a timeline printer must not break delivery
                pass

    def _trigger_for_dead_letter(self, headers: dict[str, str], event_id: str) -> str:
        """The Trigger whose delivery gave this event up: the filter's address in `knativeerrordest`
        (/triggers/<namespace>/<name>/<uid>), the subscriber's name there, or the last Trigger that failed it."""
        destination = headers.get("ce-knativeerrordest", "")
        found = _TRIGGER_PATH.search(destination)
        if found:
            return found.group(2)
        for service, trigger in self._trigger_of.items():
            if destination.startswith(f"http://{service}.{self.namespace}."):
                return trigger
        failed = [trigger for trigger, eid in self._failing if eid == event_id]
        return failed[0] if failed else "?"

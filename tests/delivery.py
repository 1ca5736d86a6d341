"""The delivery rules of a broker, asked of both brokers the same way: Knative's MT channel-based broker on the
real control plane (controlplane/knative.py) and the local stand-in (localknative/broker.py).

A case is a Broker's and its Triggers' manifests, with each subscriber a `Recorder` (a function on loopback
answering a script of responses and recording every request with its arrival time). `KnativeBroker` applies
the manifests, through Knative's webhooks, in a namespace of its own and lets Knative deliver; `LocalBroker`
hands the same manifests to localknative's Broker. Either way the test publishes by HTTP to the ingress and
reads what the recorders saw.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from localknative.broker import Broker

_names = itertools.count(1)


class Recorder:
    """A function on 127.0.0.1: answers `script` in order (the last one again and again), records each request."""

    def __init__(self, name: str, script: list[tuple[int, dict[str, str], bytes]] | None = None):
        self.name = name
        self.script = list(script or [(200, {}, b"")])
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with recorder._lock:
                    recorder.requests.append({"at": time.monotonic(), "headers": {k.lower(): v for k, v in
                                                                                 self.headers.items()}, "body": body})
                    index = min(len(recorder.requests) - 1, len(recorder.script) - 1)
                    status, headers, answer = recorder.script[index]
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def types(self) -> list[str]:
        return [r["headers"].get("ce-type", "") for r in self.requests]

    def gaps(self) -> list[float]:
        times = [r["at"] for r in self.requests]
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def event_headers(event_type: str, **extensions: str) -> dict[str, str]:
    headers = {"ce-specversion": "1.0", "ce-id": str(uuid.uuid4()), "ce-type": event_type,
               "ce-source": "/vmevents/tests", "content-type": "application/json"}
    headers.update({f"ce-{k}": v for k, v in extensions.items()})
    return headers


def post(url: str, headers: dict[str, str], body: bytes = b"{}") -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


def trigger(name: str, subscriber: str, delivery: dict | None = None, **exact: str) -> dict:
    spec: dict[str, Any] = {"broker": "default", "subscriber": {"ref": {
        "apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": subscriber}}}
    if exact:
        spec["filter"] = {"attributes": exact}
    if delivery:
        spec["delivery"] = delivery
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": name}, "spec": spec}


def dead_letter(delivery: dict, sink: str) -> dict:
    return {**delivery, "deadLetterSink": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                                                    "name": sink}}}


class LocalBroker:
    """localknative's Broker over the case's manifests, at real time (time_scale 1)."""

    name = "local"

    def setup(self, broker_delivery: dict | None, triggers: list[dict], recorders: list[Recorder]) -> str:
        ports = {r.name: r.port for r in recorders}
        self.broker = Broker(triggers, resolve=lambda d: f"http://127.0.0.1:{ports[d['ref']['name']]}/",
                             delivery_defaults=broker_delivery, time_scale=1.0).start()
        return self.broker.url

    def teardown(self) -> None:
        self.broker.stop()


class KnativeBroker:
    """Knative's broker: the case's Broker, Triggers and Knative Services applied in a fresh namespace."""

    name = "knative"

    def __init__(self, knative, cluster):
        self.knative, self.cluster = knative, cluster

    def setup(self, broker_delivery: dict | None, triggers: list[dict], recorders: list[Recorder]) -> str:
        self.namespace = f"delivery-{next(_names)}-{uuid.uuid4().hex[:6]}"
        self.knative.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        for recorder in recorders:
            self.knative.serve(self.namespace, recorder.name, recorder.port)
            self.knative.api.create({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                                 "metadata": {"name": recorder.name, "namespace": self.namespace},
                                 "spec": {"template": {"spec": {"containers": [{"image": "example.com/fn:1"}]}}}})
        broker = {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                  "metadata": {"name": "default", "namespace": self.namespace}, "spec": {}}
        if broker_delivery:
            broker["spec"]["delivery"] = broker_delivery
        self.knative.api.create(broker)
        for t in triggers:
            self.knative.api.create({**t, "metadata": {**t["metadata"], "namespace": self.namespace}})
        for kind, name in [("Broker", "default")] + [("Trigger", t["metadata"]["name"]) for t in triggers]:
            self.knative.wait_ready("eventing.knative.dev/v1", kind, self.namespace, name)
        self.knative.kubelet.wait_names()  # the channel's and the functions' names, new in this namespace
        return self.knative.ingress_url(self.namespace)

    def teardown(self) -> None:
        if getattr(self, "namespace", None):
            self.knative.api.delete("v1", "Namespace", None, self.namespace)


def session_knative():
    """Knative on a control plane of its own (not the session's, which each world resets), once per session."""
    global _session
    if _session is None:
        from controlplane.cluster import RealCluster
        from controlplane.knative import Knative
        from controlplane.server import ControlPlane

        plane = ControlPlane(event_ttl=os.environ.get("VMEVENTS_EVENT_TTL", "1h"), die_with_parent=True).start()
        atexit.register(plane.remove)
        cluster = RealCluster(plane, "1.3.1").start()  # its reset would remove knative-eventing: first
        knative = Knative(plane, die_with_parent=True).start()
        atexit.register(knative.stop)
        knative.apply_through_webhooks(cluster)
        _session = (plane, cluster, knative)
    return _session


_session: tuple | None = None


def loads(body: bytes) -> Any:
    return json.loads(body) if body else None

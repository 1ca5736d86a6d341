"""Event-to-function latency and deliveries per event through Knative's MT channel-based broker (Knative 1.21 on
the real control plane, controlplane/knative.py) and through the local stand-in (localknative/broker.py), side
by side in one run. `python -m bench broker [events]`.

The same function (a loopback HTTP server recording when each event arrives) sits behind one Trigger on each
broker. Each event is posted to the broker's ingress one after the other; its latency is from the post to its
arrival at the function. A second round has the function answer 503 to each event's first try (the Trigger
retries once after 0.2 s), to count the deliveries per event with a retry. The data plane's resident memory
(the pods of controlplane/kubelet.py) is read at the end.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from localknative.broker import Broker

RETRY = {"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT0.2S"}


class Function:
    """Records the arrival of every try of every event; answers 503 to a first try when `fail_first`."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = {}
        self.fail_first = False
        self.lock = threading.Lock()
        function = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event_id = self.headers.get("ce-id", "")
                with function.lock:
                    tries = function.arrivals.setdefault(event_id, [])
                    tries.append(time.monotonic())
                    status = 503 if function.fail_first and len(tries) == 1 else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]


def _post(url: str, event_id: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={
        "ce-specversion": "1.0", "ce-id": event_id, "ce-type": "vmevents.bench", "ce-source": "/bench",
        "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def _round(url: str, function: Function, events: int, fail_first: bool) -> dict:
    function.fail_first = fail_first
    sent: dict[str, float] = {}
    for _ in range(events):
        event_id = str(uuid.uuid4())
        sent[event_id] = time.monotonic()
        _post(url, event_id)
        deadline = time.monotonic() + 10
        while event_id not in function.arrivals and time.monotonic() < deadline:
            time.sleep(0.0005)
    time.sleep(1.0 if fail_first else 0.3)  # the retries land
    latencies = sorted((function.arrivals[i][0] - t) * 1000 for i, t in sent.items() if i in function.arrivals)
    deliveries = sum(len(function.arrivals.get(i, [])) for i in sent)
    return {"p50": statistics.median(latencies) if latencies else float("nan"),
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else float("nan"),
            "lost": events - len(latencies), "per_event": deliveries / events}


def _trigger() -> dict:
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": "bench"},
            "spec": {"broker": "default", "delivery": RETRY, "subscriber": {"ref": {
                "apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "bench"}}}}


def local(events: int) -> dict:
    function = Function()
    broker = Broker([_trigger()], resolve=lambda d: f"http://127.0.0.1:{function.port}/", time_scale=1.0).start()
    try:
        return {"ok": _round(broker.url, function, events, False), "retry": _round(broker.url, function, events, True)}
    finally:
        broker.stop()


def knative(events: int) -> dict:
    from controlplane.knative import Knative
    from controlplane.server import ControlPlane

    plane = ControlPlane(die_with_parent=True).start()
    kn = None
    try:
        started = time.monotonic()
        kn = Knative(plane, die_with_parent=True).start()
        ready = time.monotonic() - started
        function, namespace = Function(), "bench"
        kn.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kn.serve(namespace, "bench", function.port)
        kn.api.create({"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                       "metadata": {"name": "bench", "namespace": namespace},
                       "spec": {"template": {"spec": {"containers": [{"image": "example.com/bench:1"}]}}}})
        kn.api.create({"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                       "metadata": {"name": "default", "namespace": namespace}, "spec": {}})
        kn.api.create({**_trigger(), "metadata": {"name": "bench", "namespace": namespace}})
        for kind, name in (("Broker", "default"), ("Trigger", "bench")):
            kn.wait_ready("eventing.knative.dev/v1", kind, namespace, name)
        assert kn.kubelet is not None
        kn.kubelet.wait_names()
        url = kn.ingress_url(namespace)
        _round(url, function, 5, False)  # connections and caches warm
        result = {"ok": _round(url, function, events, False), "retry": _round(url, function, events, True)}
        result["rss"] = kn.rss_mib()
        result["ready_s"] = ready
        return result
    finally:
        if kn is not None:
            kn.stop()
        plane.remove()


def main(argv: list[str]) -> int:
    events = int(argv[0]) if argv else 200
    results = {"localknative": local(events), "knative": knative(events)}
    print(f"broker: {events} events posted one after the other to each broker, one Trigger, one function")
    print(f"{'path':<14}{'p50 ms':>9}{'p99 ms':>9}{'lost':>6}{'deliveries/event':>18}"
          f"{'with one 503: p50 ms':>22}{'deliveries/event':>18}")
    for name, r in results.items():
        ok, retry = r["ok"], r["retry"]
        print(f"{name:<14}{ok['p50']:>9.2f}{ok['p99']:>9.2f}{ok['lost']:>6}{ok['per_event']:>18.2f}"
              f"{retry['p50']:>22.2f}{retry['per_event']:>18.2f}")
    k, local_ = results["knative"]["ok"], results["localknative"]["ok"]
    print(f"ratio knative/localknative: p50 {k['p50'] / local_['p50']:.2f}, p99 {k['p99'] / local_['p99']:.2f}")
    rss = results["knative"]["rss"]
    data_plane = {k: v for k, v in rss.items() if k.split("/")[1] in
                  ("mt-broker-ingress", "mt-broker-filter", "imc-dispatcher")}
    print(f"Knative ready in {results['knative']['ready_s']:.1f}s; resident memory (MiB): "
          + ", ".join(f"{k.split('/')[1]} {v:.0f}" for k, v in sorted(rss.items()))
          + f"; data plane (ingress + filter + dispatcher) {sum(data_plane.values()):.0f}, all {sum(rss.values()):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""controlplane/knative_runtime.py's own parts, without Knative: the front a Knative Service is reached through
forwards an attempt unchanged and records it as the stand-in broker would (`Delivery`), a dead letter is put down to
the Trigger that gave it up, and the data plane counts as idle only once every failed attempt has been followed by a
success or a dead letter. The runtime through Knative's broker is what every e2e suite's real rows run on."""
from __future__ import annotations

import http.client
import threading
import time
from types import SimpleNamespace

from controlplane.knative_runtime import KnativeRuntime, _Server
from localknative.runtime import load_manifests
from simcluster.paths import DEPLOY_DIR
from tests.delivery import Recorder, event_headers

FILTER = "http://broker-filter.knative-eventing.svc.cluster.local/triggers/vmevents/{}/0b7e4c1a-uid"


def runtime() -> KnativeRuntime:
    return KnativeRuntime(SimpleNamespace(), load_manifests(DEPLOY_DIR), kubeconfig_for=str)


def front_of(rt: KnativeRuntime, service: str, recorder: Recorder) -> _Server:
    return _Server(rt, rt._forwarder(service, SimpleNamespace(port=recorder.port)))


def post(port: int, headers: dict[str, str], body: bytes = b'{"a": 1}') -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/", body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def test_the_front_forwards_an_attempt_unchanged_and_records_it_with_its_trigger():
    rt = runtime()
    reply = {"ce-specversion": "1.0", "ce-id": "reply-1", "ce-type": "io.vmevents.vmi-cleanup.cleaned",
             "ce-source": "/vmevents/vmi-cleanup", "content-type": "application/json"}
    function = Recorder("vmi-cleanup", [(503, {"Retry-After": "2"}, b'{"error": "busy"}'), (200, reply, b"{}")])
    front = front_of(rt, "vmi-cleanup", function)
    try:
        headers = event_headers("dev.knative.apiserver.resource.update", subject="/apis/kubevirt.io/v1/x")
        status, answer, body = post(front.port, headers)
        assert (status, answer.get("retry-after"), body) == (503, "2", b'{"error": "busy"}')
        status, answer, _ = post(front.port, headers)
        assert status == 200 and answer["ce-id"] == "reply-1"
        sent = function.requests[0]["headers"]
        assert {k: sent[k] for k in headers} == headers and function.requests[0]["body"] == b'{"a": 1}'
        first, second = rt.broker.deliveries
        assert (first.trigger, first.attempt, first.status, first.retry_after, first.ok) == \
            ("vmi-cleanup", 1, 503, "2", False)
        assert (second.attempt, second.status, second.reply_id, second.reply_type, second.ok) == \
            (2, 200, "reply-1", "io.vmevents.vmi-cleanup.cleaned", True)
        assert second.subject == "/apis/kubevirt.io/v1/x" and not second.dead_lettered
    finally:
        front.stop()
        function.stop()


def test_a_2xx_with_a_body_that_is_no_cloudevent_is_a_failed_attempt_and_no_answer_has_no_status():
    rt = runtime()
    function = Recorder("vm-stuck-report", [(200, {"Content-Type": "text/plain"}, b"OK")])
    front = front_of(rt, "vm-stuck-report", function)
    try:
        post(front.port, event_headers("dev.knative.sources.ping"))
        function.stop()  # nothing listens any more: the front answers 502 and records no status
        status, _, _ = post(front.port, event_headers("dev.knative.sources.ping"))
        assert status == 502
        ok_body, gone = rt.broker.deliveries
        assert ok_body.status == 200 and ok_body.error == "a 2xx whose body is not a CloudEvent"
        assert gone.status is None and gone.error.startswith("the function did not answer")
    finally:
        front.stop()


def test_a_dead_letter_is_put_down_to_the_trigger_that_gave_it_up_and_ends_the_wait():
    rt = runtime()
    function = Recorder("migration-report", [(503, {}, b"")])
    sink = Recorder("vmevents-dead-letter", [(204, {}, b"")])
    front, dead_letter = front_of(rt, "migration-report", function), front_of(rt, "vmevents-dead-letter", sink)
    try:
        headers = event_headers("dev.knative.apiserver.resource.update")
        post(front.port, headers)
        assert not rt.wait_idle(timeout=0.5), "a failed attempt is followed by a retry or a dead letter"
        done = threading.Event()
        threading.Thread(target=lambda: (rt.wait_idle(timeout=10), done.set()), daemon=True).start()
        time.sleep(0.2)
        post(dead_letter.port, {**headers, "ce-knativeerrordest": FILTER.format("migration-report"),
                                "ce-knativeerrorcode": "503"})
        assert done.wait(5), "idle once the dead letter came"
        last = rt.broker.deliveries[-1]
        assert (last.trigger, last.dead_lettered, last.attempt, last.ok) == ("migration-report", True, 1, True)
    finally:
        for server in (front, dead_letter, function, sink):
            server.stop()


def test_a_dead_letter_without_knatives_error_extensions_is_put_down_to_the_trigger_that_failed_it():
    """Knative's filter answers a 2xx that is no CloudEvent itself, and its dead letter then has no knativeerror*
    extensions (docs/control-plane.md): the last Trigger that failed the event is the one."""
    rt = runtime()
    function = Recorder("io-pause-report", [(200, {}, b"not an event")])
    sink = Recorder("vmevents-dead-letter", [(204, {}, b"")])
    front, dead_letter = front_of(rt, "io-pause-report", function), front_of(rt, "vmevents-dead-letter", sink)
    try:
        headers = event_headers("dev.knative.apiserver.resource.update")
        post(front.port, headers)
        post(dead_letter.port, headers)
        assert rt.broker.deliveries[-1].trigger == "io-pause-report"
        assert rt.wait_idle(timeout=5)
    finally:
        for server in (front, dead_letter, function, sink):
            server.stop()

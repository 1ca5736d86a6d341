"""The local Knative runtime behaves like Knative where vmevents depends on it.

Receivers are small `http.server`s on 127.0.0.1 that answer from a script; every wait is on a
condition with a timeout.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from cloudevents.conversion import to_structured

from localknative.broker import (
    ERROR_DATA_MAX,
    Broker,
    DeliverySpec,
    TriggerError,
    binary_request,
    knative_duration,
    matches,
    new_event,
    parse_duration,
    validate_trigger,
)
from localknative.runtime import LocalKnative, load_manifests, of_kind
from localknative.serving import FunctionServer, ServingError
from localknative.sources import (
    ApiServerSourceAdapter,
    PingSourceAdapter,
    guess_plural,
    label_selector,
    make_apiserver_event,
    make_ping_event,
    schedule_seconds,
    self_link,
)
from simcluster.paths import DEPLOY_DIR, UPSTREAM_DIR

pytestmark = pytest.mark.timeout(30)
FAST = 0.01  # time_scale: backoffs of PT0.2S become 2 ms


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


class Receiver:
    """An HTTP endpoint that records requests and answers from `script` (then from `default`).

    An answer is (status, headers, body) or a callable(request) returning one.
    """

    def __init__(self, script: list | None = None, default=(202, {}, b"")) -> None:
        self.script = list(script or [])
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()  # for answers that hang until the test lets go
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                with receiver._cond:
                    answer = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.requests.append(request)
                    receiver._cond.notify_all()
                if callable(answer):
                    answer = answer(request)
                status, headers, payload = answer
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def wait(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"{self.url} got {len(self.requests)} requests, expected {count}"
                self._cond.wait(remaining)
            return list(self.requests)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(*script, default=(202, {}, b"")) -> Receiver:
        r = Receiver(list(script), default)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def brokers():
    made: list[Broker] = []

    def make(triggers, delivery=None, **kwargs) -> Broker:
        b = Broker(triggers, resolve=lambda dest: dest["uri"], delivery_defaults=delivery,
                   time_scale=kwargs.pop("time_scale", FAST), **kwargs).start()
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop()


def make_trigger(name: str, subscriber: str, filters=None, attributes=None, delivery=None, broker="default") -> dict:
    spec: dict[str, Any] = {"broker": broker, "subscriber": {"uri": subscriber}}
    if filters is not None:
        spec["filters"] = filters
    if attributes is not None:
        spec["filter"] = {"attributes": attributes}
    if delivery is not None:
        spec["delivery"] = delivery
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
            "metadata": {"name": name, "namespace": "vmevents"}, "spec": spec}


def send(broker: Broker, event) -> requests.Response:
    headers, body = binary_request(event)
    return requests.post(broker.url, data=body, headers=headers, timeout=5)


def ce_reply(type_: str, data: dict) -> tuple[int, dict, bytes]:
    return 200, {"ce-specversion": "1.0", "ce-id": "reply-1", "ce-type": type_, "ce-source": "/test/reply",
                 "Content-Type": "application/json"}, json.dumps(data).encode()


def vmi_cleanup_trigger() -> dict:
    docs = yaml.safe_load_all((DEPLOY_DIR / "base" / "vmi-cleanup.yaml").read_text())
    return next(d for d in docs if d and d.get("kind") == "Trigger" and d["metadata"]["name"] == "vmi-cleanup")


# ---------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------

ADD, UPDATE, DELETE = (f"dev.knative.apiserver.resource.{v}" for v in ("add", "update", "delete"))
PING = "dev.knative.sources.ping"

FILTER_CASES = [
    # (filters, filter.attributes, event attributes, expected)
    pytest.param(None, None, {"type": "x"}, True, id="no-filter-passes-all"),
    pytest.param(None, {}, {"type": "x"}, True, id="empty-attributes-passes-all"),
    pytest.param(None, {"type": "a"}, {"type": "a"}, True, id="attributes-exact"),
    pytest.param(None, {"type": "a"}, {"type": "b"}, False, id="attributes-other-value"),
    pytest.param(None, {"kind": ""}, {"type": "a", "kind": "Pod"}, True, id="attributes-empty-value-is-any"),
    pytest.param(None, {"kind": ""}, {"type": "a"}, False, id="attributes-missing-attribute"),
    pytest.param([{"exact": {"type": "a"}}], {"type": "b"}, {"type": "a"}, True, id="filters-override-filter"),
    pytest.param([{"prefix": {"type": "dev.knative."}}], None, {"type": PING}, True, id="prefix"),
    pytest.param([{"prefix": {"type": "io."}}], None, {"type": PING}, False, id="prefix-no"),
    pytest.param([{"suffix": {"type": ".update"}}], None, {"type": UPDATE}, True, id="suffix"),
    pytest.param([{"suffix": {"subject": "/x"}}], None, {"type": UPDATE}, False, id="suffix-missing-attribute"),
    pytest.param([{"exact": {"type": ADD}}, {"exact": {"kind": "Pod"}}], None, {"type": ADD, "kind": "Pod"}, True,
                 id="list-is-and"),
    pytest.param([{"exact": {"type": ADD}}, {"exact": {"kind": "Pod"}}], None, {"type": ADD, "kind": "Node"}, False,
                 id="list-is-and-no"),
    pytest.param([{"any": [{"exact": {"type": "a"}}, {"exact": {"type": "b"}}]}], None, {"type": "b"}, True, id="any"),
    pytest.param([{"all": [{"prefix": {"type": "dev."}}, {"suffix": {"type": ".add"}}]}], None, {"type": ADD}, True,
                 id="all"),
    pytest.param([{"not": {"exact": {"type": "a"}}}], None, {"type": "b"}, True, id="not"),
    pytest.param([{"not": {"exact": {"type": "a"}}}], None, {"type": "a"}, False, id="not-no"),
]


@pytest.mark.parametrize("filters, attributes, event, expected", FILTER_CASES)
def test_filter_matching(filters, attributes, event, expected):
    trigger = make_trigger("t", "http://unused/", filters=filters, attributes=attributes)
    assert matches(trigger, event) is expected


VMI_CLEANUP_CASES = [
    pytest.param({"type": ADD, "kind": "VirtualMachineInstance"}, True, id="vmi-add"),
    pytest.param({"type": UPDATE, "kind": "VirtualMachineInstance"}, True, id="vmi-update"),
    pytest.param({"type": DELETE, "kind": "VirtualMachineInstance"}, False, id="vmi-delete"),
    pytest.param({"type": UPDATE, "kind": "Pod"}, True, id="pod-update"),
    pytest.param({"type": ADD, "kind": "Pod"}, False, id="pod-add"),
    pytest.param({"type": DELETE, "kind": "Pod"}, False, id="pod-delete"),
    pytest.param({"type": PING, "source": "/apis/v1/namespaces/vmevents/pingsources/x"}, True, id="ping"),
    pytest.param({"type": UPDATE, "kind": "VirtualMachine"}, False, id="vm-update"),
    pytest.param({"type": "io.vmevents.vmi-cleanup.deleted"}, False, id="own-reply"),
]


@pytest.mark.parametrize("event, expected", VMI_CLEANUP_CASES)
def test_vmi_cleanup_trigger_filters(event, expected):
    assert matches(vmi_cleanup_trigger(), event) is expected


@pytest.mark.parametrize("filters, complaint", [
    pytest.param([{"cesql": "type = 'a'"}], "CESQL", id="cesql"),
    pytest.param([{"exact": {"type": "a"}, "prefix": {"type": "b"}}], "multiple dialects", id="two-dialects"),
    pytest.param([{"any": [{"exact": {"type": "a"}, "suffix": {"kind": "d"}}]}], r"filters\[0\]\.any\[0\]",
                 id="nested-two-dialects"),
    pytest.param([{"exact": {"Type": "a"}}], "lowercase", id="attribute-name-case"),
    pytest.param([{"exact": {"type": ""}}], "must not be empty", id="empty-value"),
])
def test_trigger_validation_refuses_what_knative_refuses(filters, complaint):
    with pytest.raises(TriggerError, match=complaint):
        validate_trigger(make_trigger("bad", "http://unused/", filters=filters))


def test_an_exact_with_several_attributes_needs_all_of_them():
    """Knative's webhook accepts several keys in one exact (trigger_validation.go checks only their names) and
    its exactFilter passes an event only when every one matches (pkg/eventfilter/subscriptionsapi)."""
    trigger = make_trigger("two", "http://unused/", filters=[{"exact": {"type": "a", "kind": "Pod"}}])
    validate_trigger(trigger)
    assert matches(trigger, {"type": "a", "kind": "Pod"})
    assert not matches(trigger, {"type": "a", "kind": "VirtualMachine"})


def test_broker_refuses_a_cesql_trigger_at_load():
    with pytest.raises(TriggerError, match="CESQL"):
        Broker([make_trigger("sql", "http://unused/", filters=[{"cesql": "type = 'a'"}])], resolve=lambda d: d["uri"])


@pytest.mark.parametrize("trigger", [
    pytest.param(t, id=t["metadata"]["name"])
    for t in of_kind(load_manifests(DEPLOY_DIR), "eventing.knative.dev", "Trigger")
])
def test_deploy_triggers_pass_the_knative_webhook(trigger):
    validate_trigger(trigger)


# ---------------------------------------------------------------------------------------------
# Durations and backoff
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    ("PT0.2S", 0.2), ("PT30S", 30), ("PT1M", 60), ("PT1M30S", 90), ("PT1H", 3600), ("P1D", 86400), ("PT0.5S", 0.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, seconds", [
    ("PT0.5S", 0.5), ("PT0.25S", 0.2), ("PT0.05S", 0.0), ("PT0.010S", 0.0), ("PT1M0.19S", 60.1), ("PT2S", 2.0),
])
def test_a_delivery_duration_is_read_to_a_tenth_of_a_second_as_knative_reads_it(text, seconds):
    """rickb777/date v1.13.0 period.Parse keeps one decimal place (Knative's retries.go parses backoffDelay and
    timeout with it): Knative's broker retried a Trigger with backoffDelay PT0.010S without waiting."""
    assert knative_duration(text) == pytest.approx(seconds)
    assert DeliverySpec.from_manifest({"retry": 2, "backoffDelay": text}).backoff(2) == pytest.approx(seconds * 2)


@pytest.mark.parametrize("text", ["", "0.2s", "PT", "P", "PTS", "10m"])
def test_parse_duration_refuses_garbage(text):
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_duration(text)


@pytest.mark.parametrize("policy, waits", [
    ("exponential", [0.2, 0.4, 0.8, 1.6]),
    ("linear", [0.0, 0.2, 0.4, 0.6]),   # go-retryablehttp passes attemptNum = retry - 1
])
def test_backoff_before_each_retry(policy, waits):
    spec = DeliverySpec.from_manifest({"retry": 4, "backoffPolicy": policy, "backoffDelay": "PT0.2S"})
    assert [spec.backoff(n) for n in range(1, 5)] == pytest.approx(waits)


# ---------------------------------------------------------------------------------------------
# Broker: ingress
# ---------------------------------------------------------------------------------------------


def test_ingress_accepts_binary_and_structured_and_refuses_other(receivers, brokers):
    sub = receivers()
    broker = brokers([make_trigger("all", sub.url)])
    binary = new_event("t.binary", data={"n": 1}, subject="/s/1")
    assert send(broker, binary).status_code == 202

    structured = new_event("t.structured", data={"n": 2})
    headers, body = to_structured(structured)
    assert requests.post(broker.url, data=body, headers=headers, timeout=5).status_code == 202

    plain = requests.post(broker.url, data=b"hello", headers={"Content-Type": "text/plain"}, timeout=5)
    assert plain.status_code == 400

    got = sub.wait(2)
    assert broker.wait_idle(5)
    by_type = {r["headers"]["ce-type"]: r for r in got}
    assert set(by_type) == {"t.binary", "t.structured"}
    for request in got:  # delivered in binary mode, with the arrival time added
        assert request["headers"]["ce-knativearrivaltime"].endswith("Z")
        assert request["headers"]["prefer"] == "reply"
    assert json.loads(by_type["t.binary"]["body"]) == {"n": 1}
    assert by_type["t.binary"]["headers"]["ce-subject"] == "/s/1"
    assert json.loads(by_type["t.structured"]["body"]) == {"n": 2}
    assert len(sub.requests) == 2


def test_only_matching_triggers_of_this_broker_get_the_event(receivers, brokers):
    pods, vmis, other_broker = receivers(), receivers(), receivers()
    broker = brokers([
        make_trigger("pods", pods.url, filters=[{"exact": {"kind": "Pod"}}]),
        make_trigger("vmis", vmis.url, filters=[{"exact": {"kind": "VirtualMachineInstance"}}]),
        make_trigger("elsewhere", other_broker.url, broker="other"),
    ])
    assert broker.triggers == ["pods", "vmis"]
    send(broker, new_event(UPDATE, kind="Pod"))
    pods.wait(1)
    assert broker.wait_idle(5)
    assert vmis.requests == [] and other_broker.requests == []


# ---------------------------------------------------------------------------------------------
# Broker: delivery, retries, dead letters, replies
# ---------------------------------------------------------------------------------------------

RETRY_3 = {"retry": 3, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"}


def test_retry_on_503_then_success(receivers, brokers):
    sub = receivers((503, {}, b"busy"), (503, {}, b"busy"), (202, {}, b""))
    broker = brokers([make_trigger("t", sub.url)], delivery=RETRY_3)
    event = new_event("t.retry")
    send(broker, event)
    sub.wait(3)
    assert broker.wait_idle(5)
    assert [(d.attempt, d.status, d.ok) for d in broker.deliveries] == [(1, 503, False), (2, 503, False),
                                                                         (3, 202, True)]
    assert {r["headers"]["ce-id"] for r in sub.requests} == {event["id"]}


@pytest.mark.parametrize("status", [404, 408, 409, 429, 500, 502, 504])
def test_retryable_statuses(receivers, brokers, status):
    sub = receivers((status, {}, b""))
    broker = brokers([make_trigger("t", sub.url)],
                     delivery={"retry": 1, "backoffDelay": "PT0.1S", "backoffPolicy": "linear"})
    send(broker, new_event("t.retryable"))
    sub.wait(2)
    assert broker.wait_idle(5)
    assert [d.status for d in broker.deliveries] == [status, 202]


@pytest.mark.parametrize("status", [400, 401, 403, 415, 422])
def test_no_retry_on_other_4xx(receivers, brokers, status):
    sub = receivers((status, {}, b'{"error": "bad input"}'))
    dls = receivers()
    broker = brokers([make_trigger("t", sub.url)], delivery={**RETRY_3, "deadLetterSink": {"uri": dls.url}})
    send(broker, new_event("t.bad"))
    dead = dls.wait(1)[0]
    assert broker.wait_idle(5)
    assert len(sub.requests) == 1
    assert dead["headers"]["ce-knativeerrorcode"] == str(status)
    assert base64.b64decode(dead["headers"]["ce-knativeerrordata"]) == b'{"error": "bad input"}'


def test_2xx_with_a_plain_body_is_a_failed_delivery(receivers, brokers):
    sub = receivers(default=(200, {"Content-Type": "text/plain"}, b"OK"))  # what @cloud_event answers
    dls = receivers()
    broker = brokers([make_trigger("t", sub.url)],
                     delivery={"retry": 2, "backoffDelay": "PT0.2S", "backoffPolicy": "exponential",
                               "deadLetterSink": {"uri": dls.url}})
    send(broker, new_event("t.ok-body"))
    dead = dls.wait(1)[0]
    assert broker.wait_idle(5)
    attempts = [d for d in broker.deliveries if not d.dead_lettered]
    assert [(d.status, d.ok) for d in attempts] == [(502, False)] * 3  # 502 is retried like any 5xx
    # Knative's filter answers this 502 itself: its dead letter carries no knativeerror* extension
    # (tests/test_delivery.py shows it on Knative's broker)
    assert not [k for k in dead["headers"] if k.lower().startswith("ce-knativeerror")]


def test_empty_2xx_is_success(receivers, brokers):
    sub = receivers((200, {}, b""))
    broker = brokers([make_trigger("t", sub.url)], delivery=RETRY_3)
    send(broker, new_event("t.empty"))
    sub.wait(1)
    assert broker.wait_idle(5)
    assert [(d.status, d.ok, d.reply_id) for d in broker.deliveries] == [(200, True, None)]


def test_dead_letter_after_retries_with_the_knative_error_extensions(receivers, brokers):
    body = b"x" * 2000  # base64 of it is longer than the 1024 characters Knative keeps
    sub = receivers(default=(500, {}, body))
    dls = receivers()
    broker = brokers(
        [make_trigger("t", sub.url, delivery={"retry": 2, "backoffDelay": "PT0.2S", "backoffPolicy": "exponential",
                                              "deadLetterSink": {"uri": dls.url}})],
        delivery={"retry": 10, "backoffDelay": "PT10S"},  # the trigger's delivery wins over the broker's
    )
    event = new_event("t.fail", data={"n": 1}, subject="/apis/v1/namespaces/ns/pods/p", kind="Pod")
    send(broker, event)
    dead = dls.wait(1)[0]
    assert broker.wait_idle(5)
    assert len(sub.requests) == 3
    h = dead["headers"]
    assert (h["ce-id"], h["ce-type"], h["ce-subject"], h["ce-kind"]) == (event["id"], "t.fail", event["subject"], "Pod")
    assert json.loads(dead["body"]) == {"n": 1}
    assert h["ce-knativeerrordest"] == sub.url
    assert h["ce-knativeerrorcode"] == "500"
    assert len(h["ce-knativeerrordata"]) == ERROR_DATA_MAX
    assert h["ce-knativeerrordata"] == base64.b64encode(body).decode()[:ERROR_DATA_MAX]
    assert [d.dead_lettered for d in broker.deliveries] == [False, False, False, True]
    assert broker.deliveries[-1].ok


def test_network_error_is_retried_then_dead_lettered(receivers, brokers):
    gone = receivers()
    gone.close()  # nothing listens there any more
    dls = receivers()
    broker = brokers([make_trigger("t", gone.url)],
                     delivery={"retry": 1, "backoffDelay": "PT0.1S", "backoffPolicy": "linear",
                               "deadLetterSink": {"uri": dls.url}})
    send(broker, new_event("t.gone"))
    dead = dls.wait(1)[0]
    assert broker.wait_idle(5)
    attempts = [d for d in broker.deliveries if not d.dead_lettered]
    assert len(attempts) == 2 and all(d.status is None and "dispatch error" in d.error for d in attempts)
    assert dead["headers"]["ce-knativeerrorcode"] == "500"
    assert base64.b64decode(dead["headers"]["ce-knativeerrordata"]).startswith(b"dispatch error")


def test_timeout_counts_as_a_failed_attempt(receivers, brokers):
    dls = receivers()
    slow = receivers(default=lambda request: (slow.release.wait(10), (202, {}, b""))[1])
    broker = brokers([make_trigger("t", slow.url)],
                     delivery={"retry": 1, "timeout": "PT0.2S", "backoffDelay": "PT0.1S",
                               "backoffPolicy": "linear", "deadLetterSink": {"uri": dls.url}})
    send(broker, new_event("t.slow"))
    dls.wait(1)
    slow.release.set()
    assert broker.wait_idle(5)
    attempts = [d for d in broker.deliveries if not d.dead_lettered]
    assert len(attempts) == 2 and all("Timeout" in d.error for d in attempts)


def test_reply_is_published_back_and_routed_to_another_trigger(receivers, brokers):
    first = receivers(ce_reply("io.vmevents.test.done", {"done": True}))
    second = receivers()
    broker = brokers([
        make_trigger("first", first.url, filters=[{"exact": {"type": "t.start"}}]),
        make_trigger("second", second.url, filters=[{"prefix": {"type": "io.vmevents."}}]),
    ])
    event = new_event("t.start")
    send(broker, event)
    got = second.wait(1)[0]
    assert broker.wait_idle(5)
    assert got["headers"]["ce-type"] == "io.vmevents.test.done"
    assert got["headers"]["ce-id"] == "reply-1"
    assert json.loads(got["body"]) == {"done": True}
    assert int(got["headers"]["ce-knativebrokerttl"]) == 254
    first_delivery = next(d for d in broker.deliveries if d.trigger == "first")
    assert (first_delivery.event_id, first_delivery.reply_id, first_delivery.reply_type) == \
        (event["id"], "reply-1", "io.vmevents.test.done")
    assert len(first.requests) == 1


def test_deliveries_to_different_triggers_run_concurrently(receivers, brokers):
    slow = receivers(default=lambda request: (slow.release.wait(10), (202, {}, b""))[1])
    fast = receivers()
    seen: list = []
    broker = brokers([make_trigger("slow", slow.url), make_trigger("fast", fast.url)], on_delivery=seen.append)
    send(broker, new_event("t.both"))
    fast.wait(1)  # arrives while the slow subscriber still holds its request
    assert not broker.wait_idle(0.05)
    slow.release.set()
    assert broker.wait_idle(5)
    assert {d.trigger for d in seen} == {"slow", "fast"}


# ---------------------------------------------------------------------------------------------
# Sources: events as Knative builds them
# ---------------------------------------------------------------------------------------------


def test_resource_event_matches_the_reference_example():
    example_file = UPSTREAM_DIR / "examples" / "CONSTRUCTED-apiserversource-resource-update-cloudevent.json"
    example = json.loads(example_file.read_text())
    event = make_apiserver_event("MODIFIED", example["data"], example["source"], "Resource")
    for key in ("type", "source", "subject", "datacontenttype", "kind", "apiversion", "name", "namespace"):
        assert event[key] == example[key], key
    assert event.data == example["data"]


@pytest.mark.parametrize("api_version, kind, namespace, subject", [
    ("kubevirt.io/v1", "VirtualMachineInstance", "default",
     "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/x"),
    ("v1", "Pod", "ns", "/apis/v1/namespaces/ns/pods/x"),                       # core kinds too get /apis/
    ("kubevirt.io/v1", "KubeVirt", "kubevirt", "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/x"),
    ("longhorn.io/v1beta2", "Volume", "longhorn-system",
     "/apis/longhorn.io/v1beta2/namespaces/longhorn-system/volumes/x"),
    ("migrations.kubevirt.io/v1alpha1", "MigrationPolicy", "",
     "/apis/migrations.kubevirt.io/v1alpha1/namespaces//migrationpolicies/x"),
    ("v1", "Endpoints", "ns", "/apis/v1/namespaces/ns/endpoints/x"),
    ("kubevirt.io", "Thing", "ns", "/apis/kubevirt.io/versionUnknown/namespaces/ns/things/x"),
])
def test_subject_is_createSelfLink(api_version, kind, namespace, subject):
    assert self_link(api_version, kind, namespace, "x") == subject


@pytest.mark.parametrize("kind, plural", [
    ("Pod", "pods"), ("Ingress", "ingresses"), ("NetworkPolicy", "networkpolicies"), ("Endpoints", "endpoints"),
])
def test_plural_guess_is_UnsafeGuessKindToResource(kind, plural):
    assert guess_plural(kind) == plural


def test_reference_mode_event():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "virt-launcher-a", "namespace": "ns"}, "spec": {}}
    event = make_apiserver_event("DELETED", pod, "https://10.43.0.1:443", "Reference")
    assert event["type"] == "dev.knative.apiserver.ref.delete"
    assert event.data == {"apiVersion": "v1", "kind": "Pod", "name": "virt-launcher-a", "namespace": "ns"}
    assert (event["kind"], event["name"], event["namespace"], event["apiversion"]) == \
        ("Pod", "virt-launcher-a", "ns", "v1")


@pytest.mark.parametrize("selector, text", [
    (None, None),
    ({}, None),
    ({"matchLabels": {"kubevirt.io": "virt-launcher"}}, "kubevirt.io=virt-launcher"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]},
                           {"key": "b", "operator": "DoesNotExist"}]},
     "a in (x,y),!b"),
])
def test_label_selector(selector, text):
    assert label_selector(selector) == text


def ping_manifest(**spec) -> dict:
    return {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource",
            "metadata": {"name": "rescan", "namespace": "vmevents"},
            "spec": {"schedule": "* * * * *", **spec}}


@pytest.mark.parametrize("schedule, seconds", [("* * * * *", 60), ("*/5 * * * *", 300)])
def test_ping_schedule(schedule, seconds):
    assert schedule_seconds(schedule) == seconds


@pytest.mark.parametrize("schedule", ["0 * * * *", "*/5 1 * * *", "@hourly"])
def test_ping_schedule_refuses_other_forms(schedule):
    with pytest.raises(ValueError, match="not supported locally"):
        schedule_seconds(schedule)


def test_ping_tick_and_interval(receivers):
    sink = receivers()
    ping = PingSourceAdapter(ping_manifest(contentType="application/json", data='{"reason": "periodic re-scan"}'),
                             sink.url, interval=0.05)
    ping.tick()
    first = sink.wait(1)[0]["headers"]
    assert first["ce-type"] == "dev.knative.sources.ping"
    assert first["ce-source"] == "/apis/v1/namespaces/vmevents/pingsources/rescan"
    assert first["content-type"] == "application/json"
    assert json.loads(sink.requests[0]["body"]) == {"reason": "periodic re-scan"}
    ping.start()
    try:
        sink.wait(3)
    finally:
        ping.stop()
    assert len({r["headers"]["ce-id"] for r in sink.requests}) == len(sink.requests)


def test_ping_event_from_the_deploy_manifest():
    ping = next(m for m in load_manifests(DEPLOY_DIR) if m["kind"] == "PingSource")
    event = make_ping_event(ping)
    assert event["source"] == f"/apis/v1/namespaces/vmevents/pingsources/{ping['metadata']['name']}"
    assert json.loads(event.data) == json.loads(ping["spec"]["data"])


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------


def test_load_manifests_reads_the_kustomization(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "kustomization.yaml").write_text("namespace: demo\nresources: [a.yaml]\n")
    (base / "a.yaml").write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa}\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: cr}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: other}\n---\n"
    )
    (base / "ignored.yaml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n")
    got = {(m["kind"], m["metadata"].get("namespace")) for m in load_manifests(tmp_path)}
    assert got == {("ServiceAccount", "demo"), ("ClusterRole", None), ("ConfigMap", "other")}


def test_load_manifests_of_the_repo():
    manifests = load_manifests(DEPLOY_DIR)
    kinds = {m["kind"] for m in manifests}
    assert {"Broker", "Trigger", "ApiServerSource", "PingSource", "Service"} <= kinds
    for m in manifests:
        if m["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert m["metadata"]["namespace"] == "vmevents", m["metadata"]["name"]


# ---------------------------------------------------------------------------------------------
# Serving and the whole wiring, with a throwaway function
# ---------------------------------------------------------------------------------------------

ECHO_FUNCTION = '''
import json, os, sys
import flask

def handle(request: flask.Request):
    print(json.dumps({"type": request.headers.get("ce-type"), "greeting": os.environ.get("GREETING"),
                      "kubeconfig": os.environ.get("KUBECONFIG"), "service": os.environ.get("K_SERVICE"),
                      "home_leak": os.environ.get("VMEVENTS_TEST_LEAK")}), flush=True)
    if request.headers.get("ce-type") == "dev.knative.sources.ping":
        return ("", 200, {"ce-specversion": "1.0", "ce-id": "echo-1", "ce-type": "io.vmevents.echo.pinged",
                          "ce-source": "/vmevents/echo"})
    return ("", 204)
'''


def knative_service(name: str, source: str, env: dict[str, str], service_account: str | None = None) -> dict:
    spec: dict[str, Any] = {"containers": [{"image": "vmevents", "env": [
        {"name": "FUNCTION_TARGET", "value": "handle"}, {"name": "FUNCTION_SOURCE", "value": source},
        *({"name": k, "value": v} for k, v in env.items())]}]}
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "vmevents"}, "spec": {"template": {"spec": spec}}}


@pytest.fixture
def echo_repo(tmp_path) -> Path:
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "main.py").write_text(ECHO_FUNCTION)
    return tmp_path


def test_function_server_runs_the_manifest(echo_repo, monkeypatch):
    monkeypatch.setenv("VMEVENTS_TEST_LEAK", "yes")  # the container must not see the test's environment
    lines: list[str] = []
    manifest = knative_service("echo", "fn/main.py", {"GREETING": "hello"}, service_account="echo-sa")
    with FunctionServer(manifest, kubeconfig="/tmp/echo.kubeconfig", env_overrides={"GREETING": "override"},
                        on_log=lines.append, repo=echo_repo) as server:
        answer = requests.post(server.url, data=b"{}", timeout=5,
                               headers={"ce-specversion": "1.0", "ce-id": "1", "ce-type": "t.x", "ce-source": "/s"})
        assert answer.status_code == 204
        line = server.wait_for_log(lambda text: text.startswith("{"), timeout=5)
    assert json.loads(line) == {"type": "t.x", "greeting": "override", "kubeconfig": "/tmp/echo.kubeconfig",
                                "service": "echo", "home_leak": None}
    assert line in lines


def test_function_server_reports_a_crash(echo_repo):
    (echo_repo / "fn" / "broken.py").write_text("raise SystemExit('cannot start')\n")
    with pytest.raises(ServingError, match="exited"):
        FunctionServer(knative_service("broken", "fn/broken.py", {}), repo=echo_repo).start()


def test_local_knative_wires_services_broker_triggers_and_ping(echo_repo, receivers):
    after = receivers()
    manifests = [
        knative_service("echo", "fn/main.py", {"GREETING": "hi"}, service_account="echo-sa"),
        {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
         "metadata": {"name": "default", "namespace": "vmevents"},
         "spec": {"delivery": {"retry": 2, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"}}},
        {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
         "metadata": {"name": "echo", "namespace": "vmevents"},
         "spec": {"broker": "default", "filters": [{"exact": {"type": PING}}],
                  "subscriber": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "echo"}}}},
        {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
         "metadata": {"name": "after", "namespace": "vmevents"},
         "spec": {"broker": "default", "filters": [{"prefix": {"type": "io.vmevents.echo."}}],
                  "subscriber": {"uri": after.url}}},
        {**ping_manifest(contentType="application/json", data="{}"),
         "spec": {"schedule": "* * * * *", "data": "{}", "contentType": "application/json",
                  "sink": {"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "default"}}}},
    ]
    asked: list[str] = []
    knative = LocalKnative(manifests, kubeconfig_for=lambda sa: (asked.append(sa), f"/tmp/{sa.replace('/', '-')}")[1],
                           api_client_for=lambda sa: None, api_server_url="https://127.0.0.1:1",
                           env_overrides={"echo": {"GREETING": "override"}}, time_scale=FAST, repo=echo_repo)
    with knative:
        assert asked == ["vmevents/echo-sa"]
        knative.ping.tick()
        got = after.wait(1)[0]
        assert knative.wait_idle(5)
        line = knative.functions["echo"].wait_for_log(lambda text: text.startswith("{"), timeout=5)
    assert got["headers"]["ce-type"] == "io.vmevents.echo.pinged"
    assert json.loads(line)["greeting"] == "override"
    assert json.loads(line)["kubeconfig"] == "/tmp/vmevents-echo-sa"
    assert [(d.trigger, d.type) for d in knative.broker.deliveries] == [("echo", PING),
                                                                        ("after", "io.vmevents.echo.pinged")]


def test_local_knative_refuses_overrides_for_unknown_services():
    with pytest.raises(ValueError, match="no Knative Service"):
        LocalKnative([], kubeconfig_for=str, api_client_for=str, api_server_url="", env_overrides={"nope": {}})


# ---------------------------------------------------------------------------------------------
# ApiServerSource against the simulated API server
# ---------------------------------------------------------------------------------------------


def source_manifest(name: str) -> dict:
    return next(m for m in load_manifests(DEPLOY_DIR)
                if m["kind"] == "ApiServerSource" and m["metadata"]["name"] == name)


def launcher_pod(name: str, namespace: str = "default", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubevirt.io": "virt-launcher"} if labels is None else labels},
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}]}}


@pytest.fixture
def cluster():
    apiserver = pytest.importorskip("simcluster.apiserver", reason="the simulated API server is not there yet")
    with apiserver.SimCluster() as sim:
        yield sim


def test_apiserversource_turns_watch_events_into_knative_cloudevents(cluster, receivers):
    from simcluster.builders.kubevirt import make_vmi

    sink = receivers()
    cluster.create(make_vmi("old", phase="Running", finished=None))
    cluster.create(launcher_pod("virt-launcher-old-abcde"))
    client = cluster.api_client(service_account="vmevents/vmevents-source")
    vmis = ApiServerSourceAdapter(source_manifest("vmevents-vmis"), client, sink.url, cluster.url).start()
    pods = ApiServerSourceAdapter(source_manifest("vmevents-launcher-pods"), client, sink.url, cluster.url).start()
    try:
        assert vmis.errors == [] and pods.errors == []
        cluster.create(make_vmi("new", namespace="vmevents", phase="Running", finished=None))
        cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "vmevents", "new",
                      {"metadata": {"labels": {"a": "b"}}})
        cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "vmevents", "new")
        cluster.create(launcher_pod("virt-launcher-new-xyz12"))
        cluster.create(launcher_pod("not-a-launcher", labels={"app": "web"}))
        cluster.patch("v1", "Pod", "default", "virt-launcher-new-xyz12", {"metadata": {"labels": {"x": "y"}}})
        assert vmis.wait_for(lambda sent: len(sent) == 3, timeout=5)
        assert pods.wait_for(lambda sent: len(sent) == 2, timeout=5)
    finally:
        vmis.stop()
        pods.stop()

    got = sink.wait(5)
    def seen(kind):
        return [(r["headers"]["ce-type"], r["headers"]["ce-name"]) for r in got if r["headers"]["ce-kind"] == kind]
    assert seen("VirtualMachineInstance") == [(ADD, "new"), (UPDATE, "new"), (DELETE, "new")]
    assert seen("Pod") == [(ADD, "virt-launcher-new-xyz12"), (UPDATE, "virt-launcher-new-xyz12")]
    update = next(r for r in got
                  if r["headers"]["ce-type"] == UPDATE and r["headers"]["ce-kind"] == "VirtualMachineInstance")
    h = update["headers"]
    assert h["ce-source"] == cluster.url
    assert h["ce-subject"] == "/apis/kubevirt.io/v1/namespaces/vmevents/virtualmachineinstances/new"
    assert (h["ce-namespace"], h["ce-apiversion"], h["content-type"]) == \
        ("vmevents", "kubevirt.io/v1", "application/json")
    body = json.loads(update["body"])
    assert body["metadata"]["labels"] == {"a": "b"} and body["kind"] == "VirtualMachineInstance"
    pod = next(r for r in got if r["headers"]["ce-kind"] == "Pod")
    assert pod["headers"]["ce-subject"] == "/apis/v1/namespaces/default/pods/virt-launcher-new-xyz12"
    assert len({r["headers"]["ce-id"] for r in got}) == 5


def test_apiserversource_sends_nothing_for_objects_that_exist_at_start(cluster, receivers):
    from simcluster.builders.kubevirt import make_vmi

    sink = receivers()
    cluster.create(make_vmi("before", phase="Running", finished=None))
    client = cluster.api_client(service_account="vmevents/vmevents-source")
    vmis = ApiServerSourceAdapter(source_manifest("vmevents-vmis"), client, sink.url, cluster.url).start()
    try:
        cluster.create(make_vmi("marker", phase="Running", finished=None))  # events are in order: marker comes last
        assert vmis.wait_for(lambda sent: any(e["name"] == "marker" for e in sent), timeout=5)
    finally:
        vmis.stop()
    assert [(e["type"], e["name"]) for e, _ in vmis.sent] == [(ADD, "marker")]


def test_apiserversource_runs_with_the_rbac_of_its_service_account(cluster, receivers):
    manifest = {**source_manifest("vmevents-vmis")}
    manifest["spec"] = {**manifest["spec"], "resources": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim"}]}
    client = cluster.api_client(service_account="vmevents/vmevents-source")
    adapter = ApiServerSourceAdapter(manifest, client, receivers().url, cluster.url).start()
    adapter.stop()
    assert adapter.errors and "403" in adapter.errors[0]

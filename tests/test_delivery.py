"""How a broker delivers, shown the same way by Knative's MT channel-based broker (real backend) and by the
local stand-in: one delivery for a 2xx, retries with the Trigger's backoff on 5xx and 429, none on other 4xx,
the dead-letter sink after the last try, a CloudEvent reply published back through the broker, and a 2xx with
a body that is not a CloudEvent counted as a failure (docs/facts.md §6). Where they differ, Knative is right."""
from __future__ import annotations

import time

import pytest

from tests import backends
from tests.delivery import (
    KnativeBroker,
    LocalBroker,
    Recorder,
    dead_letter,
    event_headers,
    post,
    session_knative,
    trigger,
)

EXPONENTIAL = {"retry": 2, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"}
REPLY = {"ce-specversion": "1.0", "ce-id": "reply-1", "ce-type": "vmevents.test.reply", "ce-source": "/fn",
         "content-type": "application/json"}


def _real_marks():
    real = [b for b in backends.params() if b.values[0] == backends.REAL][0]
    return real.marks


# Knative's first start (a control plane, the release installed, its pods up) runs inside the first test
@pytest.fixture(params=["local", pytest.param("knative", marks=[*_real_marks(), pytest.mark.timeout(900)])])
def broker(request):
    if request.param == "local":
        under_test = LocalBroker()
    else:
        _, cluster, knative = session_knative()
        under_test = KnativeBroker(knative, cluster)
    yield under_test
    under_test.teardown()


@pytest.fixture
def recorders():
    made: list[Recorder] = []

    def make(name, *script):
        made.append(Recorder(name, list(script) or None))
        return made[-1]
    yield make
    for r in made:
        r.stop()


def eventually(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def publish(url, event_type="vmevents.test", **extensions):
    assert post(url, event_headers(event_type, **extensions), b'{"n": 1}') in (200, 202)


def test_a_2xx_without_body_is_delivered_once(broker, recorders):
    fn, dls = recorders("fn"), recorders("dls")
    url = broker.setup(None, [trigger("t", "fn", dead_letter(EXPONENTIAL, "dls"))], [fn, dls])
    publish(url)
    assert eventually(lambda: len(fn.requests) == 1)
    time.sleep(1.0)
    assert len(fn.requests) == 1 and dls.requests == []
    assert fn.requests[0]["headers"]["ce-type"] == "vmevents.test"


def test_a_503_is_retried_with_the_triggers_backoff_then_dead_lettered(broker, recorders):
    fn, dls = recorders("fn", (503, {}, b"busy")), recorders("dls")
    url = broker.setup(None, [trigger("t", "fn", dead_letter(EXPONENTIAL, "dls"))], [fn, dls])
    publish(url)
    assert eventually(lambda: len(dls.requests) == 1)
    assert len(fn.requests) == 3, "the first try and the Trigger's two retries"
    first, second = fn.gaps()
    # exponential from 0.2 s: the n-th retry waits 0.2 * 2^(n-1) (go-retryablehttp counts from 0)
    assert 0.18 <= first < 0.6 and 0.38 <= second < 0.9, fn.gaps()
    dead = dls.requests[0]["headers"]
    assert dead["ce-id"] == fn.requests[0]["headers"]["ce-id"] and dead["ce-knativeerrorcode"] == "503"


def test_a_429_is_retried(broker, recorders):
    fn, dls = recorders("fn", (429, {}, b""), (200, {}, b"")), recorders("dls")
    url = broker.setup(None, [trigger("t", "fn", dead_letter(EXPONENTIAL, "dls"))], [fn, dls])
    publish(url)
    assert eventually(lambda: len(fn.requests) == 2)
    time.sleep(1.0)
    assert len(fn.requests) == 2 and dls.requests == []


def test_a_400_is_not_retried_and_goes_to_the_dead_letter_sink(broker, recorders):
    fn, dls = recorders("fn", (400, {}, b"bad")), recorders("dls")
    url = broker.setup(None, [trigger("t", "fn", dead_letter(EXPONENTIAL, "dls"))], [fn, dls])
    publish(url)
    assert eventually(lambda: len(dls.requests) == 1)
    time.sleep(1.0)
    assert len(fn.requests) == 1
    assert dls.requests[0]["headers"]["ce-knativeerrorcode"] == "400"


def test_the_brokers_delivery_applies_to_a_trigger_without_one(broker, recorders):
    fn, dls = recorders("fn", (500, {}, b"")), recorders("dls")
    url = broker.setup(dead_letter({"retry": 1, "backoffPolicy": "linear", "backoffDelay": "PT0.2S"}, "dls"),
                       [trigger("t", "fn")], [fn, dls])
    publish(url)
    assert eventually(lambda: len(dls.requests) == 1)
    assert len(fn.requests) == 2


def test_a_cloudevent_reply_is_published_through_the_broker(broker, recorders):
    fn = recorders("fn", (200, REPLY, b'{"reply": true}'))
    sink = recorders("sink")
    url = broker.setup(None, [trigger("t", "fn", EXPONENTIAL, type="vmevents.test"),
                              trigger("replies", "sink", EXPONENTIAL, type="vmevents.test.reply")], [fn, sink])
    publish(url)
    assert eventually(lambda: len(sink.requests) == 1)
    time.sleep(0.5)
    assert len(fn.requests) == 1 and sink.types() == ["vmevents.test.reply"]
    assert sink.requests[0]["body"] == b'{"reply": true}'


def test_a_2xx_with_a_body_that_is_not_a_cloudevent_is_a_failed_delivery(broker, recorders):
    fn, dls = recorders("fn", (200, {"content-type": "text/plain"}, b"OK")), recorders("dls")
    url = broker.setup(None, [trigger("t", "fn", dead_letter(EXPONENTIAL, "dls"))], [fn, dls])
    publish(url)
    assert eventually(lambda: len(dls.requests) == 1)
    assert len(fn.requests) == 3
    headers = dls.requests[0]["headers"]
    assert headers["ce-id"] == fn.requests[0]["headers"]["ce-id"]
    # The filter answers that 502 itself, in plain text; the channel's dispatcher reads error details only
    # from the filter's ErrExtensionInfo JSON, so this dead letter carries none
    # (pkg/kncloudevents/event_dispatcher.go dispatchExecutionInfoTransformers).
    assert not [k for k in headers if k.startswith("ce-knativeerror")], sorted(headers)

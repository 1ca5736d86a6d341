"""What every function's HTTP tests (tests/functions/*/test_http.py) share: where a function's source is, the
ApiServerSource CloudEvent they post, the malformed requests every function must refuse, and the
answers they check. The test client itself comes from the `serve` fixture in tests/conftest.py."""
from __future__ import annotations

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from tests.conftest import REPO

UPDATE = "dev.knative.apiserver.resource.update"
DELETE = "dev.knative.apiserver.resource.delete"
VMI_SUBJECT = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm1"


def source_of(package: str) -> str:
    """The main.py functions-framework serves for functions/<package>/."""
    return str(REPO / "functions" / package / "main.py")


def apiserver_event(data, type_=UPDATE, kind="VirtualMachineInstance", subject=VMI_SUBJECT) -> CloudEvent:
    """An event as the ApiServerSource sends it (by default about the VMI default/vm1)."""
    return CloudEvent({"type": type_, "source": "https://10.43.0.1:443", "kind": kind, "subject": subject}, data)


def binary_headers(type_, *, kind=None, specversion="1.0", content_type="application/json") -> dict:
    """The headers of a binary-mode CloudEvent, written by hand so that they can be wrong."""
    headers = {"ce-specversion": specversion, "ce-id": "1", "ce-source": "s", "ce-type": type_}
    if kind is not None:
        headers["ce-kind"] = kind
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


# (headers, body, fragment of the error) no function accepts; each module adds the cases of its own input.
MALFORMED = (
    ({"Content-Type": "application/json"}, b'{"hello": 1}', "not a CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{", "not valid JSON"),
    (binary_headers("com.example.other"), b"{}", "unsupported event type"),
)


def post(client, event, mode=to_binary):
    """POST the event the way `mode` (to_binary or to_structured) encodes it."""
    headers, body = mode(event)
    return client.post("/", headers=headers, data=body)


def assert_answered_empty(response):
    assert response.status_code == 204 and response.data == b""


def assert_refused(response, fragment):
    """A 400 whose error says why."""
    assert response.status_code == 400
    assert fragment in response.get_json()["error"]


def assert_api_down(response):
    """A 503, so the broker redelivers, saying the API server is unreachable."""
    assert response.status_code == 503
    assert "unreachable" in response.get_json()["error"]


def assert_stops_the_start(start, capsys, message):
    """`start()` stops the function's start with exit code 2 and `message` on stderr."""
    with pytest.raises(SystemExit) as stopped:
        start()
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err

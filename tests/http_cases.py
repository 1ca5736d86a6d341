"""What every function's HTTP tests (tests/functions/*/test_http.py) share: where a function's source is, the
ApiServerSource CloudEvent they post, the malformed requests every function must refuse, and the
answers they check. The test client itself comes from the `serve` fixture in tests/conftest.py."""
from __future__ import annotations

import json
from dataclasses import dataclass

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


# -- the HTTP surface: requests written byte by byte, for every server a function runs under ---------------------------
# What a broker or a stray client may send, answered the same under the development server (werkzeug, as
# `functions-framework --debug` runs it) and under gunicorn (as the image runs it): tests/shared/test_http_surface.py
# and tests/deploy/test_image.py send these to each.
@dataclass(frozen=True)
class Raw:
    """One request as written on the wire. `length`: the Content-Length header as sent (None: the body's length;
    "": none at all). `sent`: how much of the body goes out before the client half-closes (None: all of it).
    `chunked`: the body goes out in chunks (Transfer-Encoding), without a Content-Length. `status`: the answer
    expected from every server."""

    name: str
    headers: dict
    body: bytes
    status: int
    length: str | None = None
    sent: int | None = None
    chunked: bool = False

    def wire(self) -> bytes:
        lines = ["POST / HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in self.headers.items())]
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        elif self.length != "":
            lines.append(f"Content-Length: {len(self.body) if self.length is None else self.length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        body = self.body if self.sent is None else self.body[:self.sent]
        if self.chunked:
            step = 1 << 20
            body = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
                            for i in range(0, len(body), step)) + b"0\r\n\r\n"
        return head + body


def send_raw(port: int, raw: Raw, timeout: float = 60.0) -> tuple[int, bytes]:
    """Send `raw` to 127.0.0.1:`port`, half-close, and read the whole answer: (status, body)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        try:
            conn.sendall(raw.wire())
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered (413) and closed before the whole request was written
            pass
        answer = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunked(body)
    return status, body


def _unchunked(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if not n:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    return out


def prefilter_tokens() -> tuple[bytes, ...]:
    """Every token a function's byte prefilter looks for (functions/*/handler.py, settings.py)."""
    from functions.device_conflict.handler import _DEVICE_TOKENS
    from functions.io_pause_report.handler import _TOKEN
    from functions.migration_report.handler import _FINAL_TOKENS
    from functions.vm_stuck_report.handler import _VM_TOKENS, _VMIM_TOKENS
    from functions.vmi_cleanup.settings import _FAILED_TOKENS

    return (*_FAILED_TOKENS, *_DEVICE_TOKENS, _TOKEN, *_FINAL_TOKENS, *_VM_TOKENS, *_VMIM_TOKENS)


def _escaped(obj: dict) -> bytes:
    """The object as Go writes it, every prefilter token in it spelt with its first letter as a JSON escape."""
    body = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    tokens = prefilter_tokens()
    assert any(token in body for token in tokens), body
    for token in tokens:
        body = body.replace(token, b'"\\u%04x' % token[1] + token[2:]) if token[:1] == b'"' else \
            body.replace(token, b'\\u%04x' % token[0] + token[1:])
    return body


def escaped_events() -> dict[str, tuple[dict, bytes]]:
    """Per function, a relevant Resource-mode event whose every prefilter token hides behind a JSON escape
    (`"phase":"\\u0053ucceeded"`): (headers, body). Decoded, it is relevant (a 503 with the API down); a byte
    search finds nothing in it."""
    from simcluster.builders import devices, io_pause, kubevirt, migration
    from simcluster.builders import stuck as b

    def headers(kind: str) -> dict:
        return binary_headers(UPDATE, kind=kind)

    vmim = migration.make_vmim(state=migration.make_state("u1", took=451, reason=migration.NOT_COMPLETED.format(450)),
                               uid="u1")
    return {
        "vmi_cleanup": (headers("VirtualMachineInstance"),
                        _escaped(kubevirt.make_vmi(phase="Succeeded"))),
        "device_conflict": (headers("VirtualMachineInstance"),
                            _escaped(devices.vmi("vm2", devices.host_device("dev1"), phase="Scheduling"))),
        "io_pause_report": (headers("VirtualMachineInstance"),
                            _escaped(io_pause.make_vmi())),
        "migration_report": (headers("VirtualMachineInstanceMigration"), _escaped(vmim)),
        "vm_stuck_report": (headers("VirtualMachine"), _escaped(b.vm(status="ErrorUnschedulable"))),
    }


def surface_cases(package: str, max_body: int) -> list[Raw]:
    """The hostile requests every function answers alike (400 and 413, never a 500 or a debugger page), and, for a
    function with a byte prefilter, its event behind a JSON escape (decoded: a 503 with the API down)."""
    headers = binary_headers(UPDATE, kind="VirtualMachineInstance")
    body = json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                       "metadata": {"name": "vm1", "namespace": "default"}, "status": {"phase": "Succeeded"}}).encode()
    cases = [
        Raw("short-body", headers, body, 400, sent=len(body) // 2),
        Raw("short-body-relevant-part", headers, body, 400, sent=len(body) - 2),
        Raw("negative-length", headers, body, 400, length="-5"),
        Raw("non-numeric-length", headers, body, 400, length="abc"),
        Raw("exponent-length", headers, body, 400, length="1e3"),
        Raw("over-the-limit", headers, body, 413, length=str(max_body + 1)),
        Raw("far-over-the-limit", headers, b"", 413, length=str(1 << 40)),
        Raw("chunked-over-the-limit", headers, b"x" * (max_body + 1), 413, chunked=True),
    ]
    if package in escaped_events():
        escaped_headers, escaped_body = escaped_events()[package]
        cases.append(Raw("escaped-token", escaped_headers, escaped_body, 503))
    return cases

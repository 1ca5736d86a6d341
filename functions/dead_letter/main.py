"""vmevents-dead-letter: the broker's last stop for an event no retry could deliver.

It logs the event, with the error the broker attached (Knative adds the extensions
knativeerrordest, knativeerrorcode and knativeerrordata, the latter base64), as one JSON line at
error level, so an operator's log pipeline sees every lost action or finding. It answers 2xx so
the broker stops there.

It does not use the strict CloudEvent intake the other functions use (shared/intake.py): what arrives here is
often exactly what a function refused with 400 (a malformed envelope, an identifier that breaks Kubernetes'
rules, data that is not JSON), and refusing it again would lose its one log line. So it reads whatever comes,
binary or structured or neither, up to MAX_KEPT bytes, and logs the attributes it finds, each clipped
(shared.runtime.loggable). A malformed event is logged as such, and answered 204.

What it cannot read is logged too, and refused as every function refuses it (shared/wsgi.py): a Content-Length that
is not a number of bytes or a body that ends before it (the sender closed early) is a 400, a body over
shared.wsgi.MAX_BODY a 413, unread. Answering 500 there, as the development server did, made the broker deliver
again a dead letter already logged.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import time
from typing import Any

import flask

from shared import metrics, wsgi
from shared.errors import BadEvent, TooLarge, VmeventsError, http_answer
from shared.redact import origin, scrub_urls
from shared.runtime import loggable, write_line

FUNCTION = "dead-letter"
SETTINGS = None  # it reads no setting (and so does not go through shared.runtime.start: see above)
# The most of a body kept for the log line (a Kubernetes object as an ApiServerSource sends it is a few KB). The rest
# is not kept: the line says how much was cut.
MAX_KEPT = 256 * 1024
_PIECE = 64 * 1024
# What of a body that is not a CloudEvent (or of its data) goes into the line, at most.
MAX_EXCERPT = 500
_ATTRIBUTES = ("id", "type", "source", "subject", "specversion", "time", "datacontenttype")
_KNATIVE = ("knativeerrordest", "knativeerrorcode", "knativeerrordata")



def _error_data(encoded: Any) -> Any:
    if not encoded or not isinstance(encoded, str):
        return encoded
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return encoded


def _headers(environ: dict) -> dict[str, str]:
    found = {"content-type": str(environ.get("CONTENT_TYPE") or "")}
    for key, value in environ.items():
        if isinstance(key, str) and key.startswith("HTTP_CE_"):
            found[key[8:].lower()] = str(value)
    return found


def _read(environ: dict) -> tuple[bytes, int, VmeventsError | None]:
    """At most MAX_KEPT bytes of the body, how many bytes it had (as far as it was read), and what made it
    unreadable: a bad Content-Length, a body over shared.wsgi.MAX_BODY (then nothing is read), or one that ended
    early (what arrived is kept). Afterwards the environ's input is empty, so that nothing reads the rest again
    (functions-framework's after-request read would buffer it whole)."""
    kept, total, error = b"", 0, None
    try:
        size = wsgi.declared_length(environ)
        stream = environ["wsgi.input"]
        chunked = "chunked" in (environ.get("HTTP_TRANSFER_ENCODING") or "").lower()
        wanted = size if size is not None else (wsgi.MAX_BODY + 1 if chunked else 0)
        while total < wanted:
            piece = stream.read(min(_PIECE, wanted - total))
            if not piece:
                break
            if len(kept) <= MAX_KEPT:
                kept += piece[:MAX_KEPT + 1 - len(kept)]
            total += len(piece)
        if size is None and total > wsgi.MAX_BODY:
            raise TooLarge(f"the (chunked) body is over {wsgi.MAX_BODY} bytes: an event is at most {wsgi.MAX_BODY}")
        if size is not None and total != size:
            raise BadEvent(f"the body ended after {total} of the {size} bytes its Content-Length says "
                           f"(the sender closed the connection early)")
    except VmeventsError as exc:
        error = exc
    except Exception:  # noqa: BLE001 - the server's read failed (werkzeug's ClientDisconnected, a reset)
        error = BadEvent("the body could not be read to its end (the sender closed the connection early)")
    finally:
        environ["wsgi.input"] = io.BytesIO()
        environ["CONTENT_LENGTH"] = "0"
    return kept, total, error


def _origin(url: Any) -> Any:
    # A URL is shown by its origin only (shared/redact.py): the subscriber's may carry user info or a token.
    return origin(url) if isinstance(url, str) and url else url


def _scrubbed(text: Any) -> Any:
    # The error data is whatever the subscriber answered, and an excerpt whatever was sent: no URL in full.
    return scrub_urls(text) if isinstance(text, str) and text else text


def _excerpt(value: Any) -> str:
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else (
        value if isinstance(value, str) else json.dumps(value, default=str)[:MAX_EXCERPT + 1])
    return text if len(text) <= MAX_EXCERPT else text[:MAX_EXCERPT - 3] + "..."


def describe(headers: dict[str, str], body: bytes, cut: bool) -> dict[str, Any]:
    """What the log line says of one request, whatever it holds: the attributes of a binary-mode event (ce-*
    headers) or of a structured one (a JSON envelope), else what it is and an excerpt of its body."""
    attributes: dict[str, Any] = {k: v for k, v in headers.items() if k != "content-type"}
    shape = "binary" if attributes else "unknown"
    data: Any = body
    if not attributes and headers["content-type"].split(";")[0].strip().lower() == "application/cloudevents+json":
        try:
            envelope = json.loads(body)
        except (ValueError, RecursionError):
            envelope = None
        if isinstance(envelope, dict):
            shape, data = "structured", envelope.get("data", envelope.get("data_base64"))
            attributes = {str(k): v for k, v in envelope.items() if k not in ("data", "data_base64")}
    line: dict[str, Any] = {
        "level": "error", "function": FUNCTION, "undelivered": True, "shape": shape,
        "event_id": attributes.get("id"), "event_type": attributes.get("type"), "source": attributes.get("source"),
        "subject": attributes.get("subject"), "destination": _origin(attributes.get("knativeerrordest")),
        "status": attributes.get("knativeerrorcode"),
        "error": _scrubbed(_error_data(attributes.get("knativeerrordata"))),
        "content_type": headers["content-type"] or None, "bytes": len(body), "cut": cut or None,
    }
    if shape != "binary" or not attributes.get("id"):
        line["excerpt"] = _scrubbed(_excerpt(data)) if data not in (None, b"") else None
    others = {k: v for k, v in attributes.items() if k not in _ATTRIBUTES + _KNATIVE}
    if others:
        line["extensions"] = others
    return {key: loggable(value) for key, value in line.items()}


metrics.PROCESS["function"] = FUNCTION
_SERVICE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SERVICES = metrics.DEAD_LETTER_DESTINATIONS  # the counter's own: one bound per process, as the counter is
MAX_SERVICES = 20  # distinct `destination` labels at most: a sender cannot make the metric grow without bound


def _service(destination: Any) -> str:
    """The Knative Service an undelivered event was for: the first label of its destination's host
    (`http://vmi-cleanup.vmevents.svc.cluster.local` → vmi-cleanup), else "unknown"."""
    host = destination.partition("://")[2].partition("/")[0].partition(":")[0] if isinstance(destination, str) else ""
    name = host.partition(".")[0]
    if not _SERVICE.fullmatch(name):
        return "unknown"
    if name not in _SERVICES and len(_SERVICES) >= MAX_SERVICES:
        return "other"
    _SERVICES.add(name)
    return name


def _code(status: Any) -> str:
    return status if isinstance(status, str) and len(status) == 3 and status.isdecimal() else "unknown"


def handle(request: flask.Request) -> flask.Response:
    """The functions-framework `http` target: log whatever arrived, answer 204 (GET/HEAD: 200 for probes); a body
    that could not be read is logged as far as it was, and answered 400 or 413 (see the module's docstring)."""
    if request.method != "POST":
        if request.path == "/metrics" and request.method in ("GET", "HEAD"):  # Prometheus (docs/metrics.md)
            return flask.Response(metrics.REGISTRY.exposition(), status=200, content_type=metrics.CONTENT_TYPE)
        return flask.Response(status=200 if request.method in ("GET", "HEAD") else 405)
    started = time.perf_counter()
    headers = _headers(request.environ)
    kept, total, refused = _read(request.environ)
    line = describe(headers, kept[:MAX_KEPT], total > MAX_KEPT)
    if refused is not None:
        line["unreadable"] = loggable(refused.message)
    # On stderr, in one write(2) (as shared.runtime.write_line does on stdout): never interleaved, never buffered.
    os.write(2, json.dumps(line, separators=(",", ":"), default=str).encode() + b"\n")
    metrics.DEAD_LETTERS.inc(FUNCTION, _service(line["destination"]), _code(line["status"]))
    reason = f"undeliverable to {line['destination'] or 'its subscriber'} (status {line['status'] or '?'})"
    status, error_headers, error_body = http_answer(refused) if refused is not None else (204, {}, b"")
    if refused is not None:
        reason += f"; refused: {refused.message}"
    write_line({"function": FUNCTION, "event_id": line["event_id"], "event_type": line["event_type"],
                "subject": line["subject"], "verdict": "dead-lettered", "effect": None,
                "reason": reason,
                "outcome": status, "reply": None, "duration_ms": round((time.perf_counter() - started) * 1000, 3)})
    return flask.Response(error_body or None, status=status, headers=error_headers)

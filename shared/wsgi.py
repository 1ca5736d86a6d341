"""A CloudEvent's headers read where the WSGI server put them, and its body read as its headers declare it.

Nearly every event a function receives is ruled out by its prefilter from a header or two and the raw body;
building every ce-* header into a dict for that (`intake.wsgi_headers`) cost a tenth of what answering at all
costs (docs/hot-path.md). Here the prefilter's headers are a view on the environ (`intake.EnvironCe`, which
`intake.environ_get` reads without a call per header), and the envelope is checked in it, with intake's
rules and sentences.

The body is read here too, the same way under gunicorn (as the image runs) and under the development server
(werkzeug), which disagree on a bad request: werkzeug reads a negative or non-numeric Content-Length as 0 (an
empty body) and fails a body shorter than its Content-Length with ClientDisconnected; gunicorn refuses the first
itself and hands over the second short, without a word. Here each is a 400, and a body above MAX_BODY a 413
before a byte of it is read (docs/hot-path.md, "The HTTP surface").
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from shared.environ import EnvironCe, environ_key
from shared.errors import BadEvent, TooLarge
from shared.intake import check_binary

__all__ = ["MAX_BODY", "EnvironCe", "binary_envelope", "check_binary_environ", "declared_length", "environ_key",
           "read_body"]

# The largest body a function reads (docs/facts.md §8). An event carries one Kubernetes object: etcd stores an object
# in one request of at most --max-request-bytes, 1.5 MiB by default (etcd server/embed/config.go), so no
# KubeVirt object (a custom resource, stored as JSON) is larger; a launcher pod is stored as protobuf, whose JSON
# kube-apiserver allows to be twice that (k8s.io/apiserver pkg/server/config.go MaxRequestBodyBytes, 3 MiB). The
# fourth MiB leaves room for the ApiServerSource's re-encoding (Go escapes <, > and & as \u003c…: docs/facts.md
# §6). A reply of a function (alert-forwarder's input) is under it by far: a finding is about 2 KB.
MAX_BODY = 4 * 1024 * 1024


def binary_envelope(environ: Mapping[str, Any]) -> bool:
    """Whether the environ holds a valid binary-mode envelope (specversion 1.0, an id, a source, a type): what
    `check_binary` accepts, without its sentence (tests/shared/test_hotpath.py holds the two together)."""
    get = environ.get
    return bool(get("HTTP_CE_SPECVERSION") == "1.0" and get("HTTP_CE_ID") and get("HTTP_CE_SOURCE")
                and get("HTTP_CE_TYPE"))


def check_binary_environ(environ: Mapping[str, Any]) -> None:
    """`check_binary` of the headers in a WSGI environ, read where the server put them."""
    if not binary_envelope(environ):
        check_binary(EnvironCe(environ))  # raises, with the sentence that says which


def declared_length(environ: Mapping[str, Any]) -> int | None:
    """The body's length as its Content-Length says (RFC 9110 §8.6: one or more ASCII digits), None without one (a
    chunked body, or none). BadEvent (400) for anything else, TooLarge (413) above MAX_BODY."""
    length = environ.get("CONTENT_LENGTH")
    if not length:  # absent, or "" (how some servers and werkzeug's test environ write an absent one)
        return None
    if not (length.isascii() and length.isdigit()):
        raise BadEvent(f"Content-Length {length[:40]!r} is not a number of bytes")
    size = int(length)
    if size > MAX_BODY:
        raise TooLarge(f"the body is {size} bytes; an event is at most {MAX_BODY} (a Kubernetes object is at most "
                       f"1.5 MiB in etcd)")
    return size


def read_body(environ: dict[str, Any]) -> bytes:
    """The whole body, read from the WSGI input as `declared_length` allows (a chunked one, as the server de-chunks
    it, up to MAX_BODY). BadEvent when it ends before its Content-Length (the client half-closed, or went away).
    Afterwards the environ's input holds what was read and Content-Length says its length, so that whoever reads it
    again (functions-framework's after-request read of every request) finds that; after an error, nothing (a 413's
    body is never read: the server drains or drops it)."""
    body = b""
    try:
        size = declared_length(environ)
        if size is None:
            if "chunked" in (environ.get("HTTP_TRANSFER_ENCODING") or "").lower():  # de-chunked by the server
                body = _read(environ["wsgi.input"], MAX_BODY + 1)
                if len(body) > MAX_BODY:
                    body = b""
                    raise TooLarge(f"the (chunked) body is over {MAX_BODY} bytes: an event is at most {MAX_BODY}")
        elif size:
            body = _read(environ["wsgi.input"], size)
            if len(body) != size:
                got, body = len(body), b""
                raise BadEvent(f"the body ended after {got} of the {size} bytes its Content-Length says "
                               f"(the sender closed the connection early)")
    finally:
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
    return body


def _read(stream: Any, size: int) -> bytes:
    try:
        return bytes(stream.read(size))
    except Exception:  # noqa: BLE001 - the server's read failed: werkzeug's ClientDisconnected, a reset, a bad chunk
        raise BadEvent("the body could not be read to its end (the sender closed the connection early, or sent a "
                       "malformed chunk)") from None

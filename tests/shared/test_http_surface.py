"""Every request gets the answer its bytes deserve, under both servers a function runs under (issue 34).

The development server (werkzeug, as `functions-framework --debug` runs it, with its debugger) and gunicorn (as the
image runs it: localknative's FunctionServer starts `python -m functions_framework`, which serves with gunicorn)
disagree on a request whose body is not what its Content-Length says: werkzeug reads a negative or non-numeric
Content-Length as 0 and turns a body cut short into a 500 with its debugger page, gunicorn refuses the first itself
and hands the second over short. Each function, under each server, is sent tests/http_cases.py's raw requests, byte by
byte: a body cut short, bad Content-Lengths, a body over the limit (declared, and chunked), and a relevant event whose
tokens hide behind JSON escapes. The answers are the same: 400, 413, and the escaped event decoded (a 503: the API
server refuses connections here); never a 500, a debugger page or a traceback. tests/deploy/test_image.py sends the
same to the image.
"""
from __future__ import annotations

import contextlib
import json
import threading

import pytest

from shared import wsgi
from tests import http_cases
from tests.http_cases import Raw, send_raw

FUNCTIONS = ["vmi_cleanup", "device_conflict", "io_pause_report", "migration_report", "vm_stuck_report",
             "alert_forwarder", "dead_letter"]
# The settings each function's start reads from the environment: none taken from the developer's.
_SETTINGS = ("CLEANUP_AFTER", "CLEANUP_FAILED", "CLEANUP_DRY_RUN", "CLEANUP_NAMESPACES", "CLEANUP_EXCLUDE_NAMESPACES",
             "ALERTMANAGER_URL", "WEBHOOK_URL", "MIN_SEVERITY")


def _service(package: str) -> dict:
    from localknative.runtime import load_manifests
    from simcluster.paths import DEPLOY_DIR

    return next(m for m in load_manifests(DEPLOY_DIR) if m.get("kind") == "Service"
                and any(e.get("value") == f"functions/{package}/main.py"
                        for e in m["spec"]["template"]["spec"]["containers"][0].get("env") or ()))


@contextlib.contextmanager
def development_server(package: str, kubeconfig):
    """functions-framework's app in werkzeug's server, with the debugger, as `functions-framework --debug` serves it
    (Flask.run: run_simple with use_debugger, threaded), on a free port."""
    from functions_framework import create_app
    from werkzeug.debug import DebuggedApplication
    from werkzeug.serving import make_server

    with pytest.MonkeyPatch.context() as mp:
        for name in _SETTINGS:
            mp.delenv(name, raising=False)
        mp.setenv("KUBECONFIG", str(kubeconfig))
        app = create_app(target="handle", source=http_cases.source_of(package))
    server = make_server("127.0.0.1", 0, DebuggedApplication(app, evalex=True), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def gunicorn(package: str, kubeconfig):
    """The function's Knative Service run as localknative runs it: functions-framework's CLI, which serves with
    gunicorn (the image's server), in a process of its own."""
    from localknative.serving import FunctionServer

    server = FunctionServer(_service(package), kubeconfig=kubeconfig).start(timeout=120)
    try:
        yield server.port, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory):
    """An API server that refuses connections: a decoded relevant event is a 503."""
    import socket

    from tests.conftest import write_kubeconfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return write_kubeconfig(tmp_path_factory.mktemp("surface") / "kubeconfig", f"http://127.0.0.1:{port}")


def _cases(package: str) -> list[Raw]:
    return http_cases.surface_cases(package, wsgi.MAX_BODY)


def _check(raw: Raw, status: int, body: bytes, where: str) -> None:
    shown = body[:300]
    assert status == raw.status, f"{where}: {raw.name}: {status} {shown!r}"
    assert b"Traceback" not in body and b"Werkzeug Debugger" not in body and b"__debugger__" not in body, \
        f"{where}: {raw.name}: {shown!r}"


def _ours(raw: Raw, body: bytes) -> str:
    """The sentence of our own 400/413/503 answer."""
    return json.loads(body)["error"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("package", FUNCTIONS)
def test_the_development_server_answers_each_request_as_its_bytes_deserve(package, kubeconfig):
    with development_server(package, kubeconfig) as port:
        for raw in _cases(package):
            status, body = send_raw(port, raw)
            _check(raw, status, body, "development server")
            error = _ours(raw, body)
            if raw.status == 400:
                assert "Content-Length" in error or "ended" in error or "read" in error, error
            elif raw.status == 413:
                assert str(wsgi.MAX_BODY) in error, error
            else:
                assert "unreachable" in error, error


@pytest.mark.timeout(600)
@pytest.mark.parametrize("package", FUNCTIONS)
def test_gunicorn_gives_the_same_answers(package, kubeconfig):
    with gunicorn(package, kubeconfig) as (port, server):
        for raw in _cases(package):
            status, body = send_raw(port, raw)
            _check(raw, status, body, "gunicorn")
        bad = [line for line in server.logs() if "Traceback" in line or "[ERROR]" in line]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", sorted(http_cases.escaped_events()))
def test_an_escaped_event_hides_from_a_byte_search_and_its_prefilter_has_it_decoded(package):
    """What the escape cases above hold: no prefilter token is in the event's bytes, and decoded it is the relevant
    event (its tokens back). Before issue 34 each prefilter ruled it out, and it was answered 204, as irrelevant."""
    import importlib

    import orjson

    headers, body = http_cases.escaped_events()[package]
    tokens = http_cases.prefilter_tokens()
    decoded = json.dumps(orjson.loads(body), sort_keys=True, separators=(",", ":")).encode()
    assert not any(token in body for token in tokens)
    assert any(token in decoded for token in tokens)
    handler = importlib.import_module(f"functions.{package}.handler")
    settings = importlib.import_module(f"functions.{package}.settings").load({})
    assert handler.worth_decoding(headers, body, settings) is True
    assert handler.worth_decoding(headers, decoded, settings) is True

"""The HTTP side of every function: intake, error mapping, replies and the one log line per event.

A function module supplies `on_event(event, ctx) -> Outcome` and a settings loader; `start()` turns
them into the functions-framework `http` target. Not `@cloud_event`: that signature always answers
"OK", which a Knative broker counts as a failed delivery (docs/facts.md §6). Here a handled event
answers 2xx with an empty body or with a reply CloudEvent, bad input answers 400 with
{"error": ...}, and a temporary failure answers 5xx so the broker redelivers. Errors become HTTP
in exactly one place: `shared.errors.http_answer`.
"""
from __future__ import annotations

import functools
import gc
import io
import logging
import os
import reprlib
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import flask
import orjson

from shared import intake, metrics, wsgi
from shared.errors import BadEvent, VmeventsError, http_answer
from shared.redact import scrub_urls
from shared.replies import Reply
from shared.settings import SettingsError, lookalikes

if TYPE_CHECKING:  # the kubernetes client (~0.4 s, ~36 MiB) is imported only by functions that use it
    from shared.kube import Kube
    from shared.recorder import Recorder


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Outcome:
    """What a function made of one event: for the reply, the log line and the tests."""

    verdict: str           # what was decided: e.g. "irrelevant", "wait", "delete-vmi"
    effect: str = "none"   # what was done: "none", "deleted-vmi", "would-delete-vmi", ...
    subject: str | None = None
    reason: str = ""
    reply: Reply | None = None


S = TypeVar("S")


@dataclass(frozen=True)
class Context(Generic[S]):
    """What a handler is given besides the event: its name, its settings and the clock."""

    function: str
    settings: S
    clock: Callable[[], datetime]


@dataclass(frozen=True)
class KubeContext(Context[S]):
    """The context of a function that talks to the Kubernetes API: its client and Event recorder are
    always there (a function started with `needs_kube=True` cannot start without them)."""

    kube: Kube
    recorder: Recorder


Handler = Callable[[intake.Incoming, Any], Outcome]
# (ce-* headers, raw body, settings) -> False when the event cannot concern the function: it is
# then answered as irrelevant without decoding its data (the hot path under a flood of updates). A prefilter
# may instead answer with the Outcome the handler would have come to (alert-forwarder's drop of a finding
# below MIN_SEVERITY); anything but False or an Outcome means "decode it".
Prefilter = Callable[[Mapping[str, str], bytes, Any], "bool | Outcome"]


# The longest a logged text gets: an error message can quote what a sender sent, and a log line must stay
# one bounded line whatever arrived.
MAX_LOGGED_TEXT = 1000


def write_line(record: dict) -> None:
    """One JSON line on stdout in a single write(2): unbuffered (a log collector sees it at once),
    not interleaved between threads (a pipe write under PIPE_BUF is atomic), and cheap enough for
    every event. Always written: every value is a short scalar (see `loggable`), and should encoding fail
    anyway the line says so instead of vanishing."""
    try:
        line = orjson.dumps({str(key)[:100]: loggable(value) for key, value in record.items()})
    except (TypeError, ValueError) as exc:
        line = orjson.dumps({"function": loggable(record.get("function")), "log_error": loggable(repr(exc))})
    _emit(line + b"\n")


# os.write(1, line), as a C-level partial: a Python function around it cost a call frame on every event.
_emit: Callable[[bytes], Any] = functools.partial(os.write, 1)


def loggable(value: Any) -> str | int | float | bool | None:
    """A value as the log line holds it: a scalar as is (text clipped to MAX_LOGGED_TEXT), anything else
    (a list, an object, however deep) as a clipped repr: the line's depth and size stay bounded."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else loggable(str(value))
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    text = value if isinstance(value, str) else _repr(value)
    return text if len(text) <= MAX_LOGGED_TEXT else text[:MAX_LOGGED_TEXT - 3] + "..."


def _repr(value: Any) -> str:
    try:
        return reprlib.repr(value)  # bounded in depth and length by construction
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not cost the line
        return f"<{type(value).__name__}>"


class FunctionApp:
    """The callable that functions-framework serves: flask.Request in, flask.Response out."""

    def __init__(self, name: str, on_event: Handler, settings: Any, kube: Kube | None,
                 clock: Callable[[], datetime] = utcnow, prefilter: Prefilter | None = None):
        self.name = name
        self.on_event = on_event
        self.prefilter = prefilter
        self.context: Context[Any] = (Context(name, settings, clock) if kube is None else
                                      KubeContext(name, settings, clock, kube, _recorder(kube, name)))
        # The log line of an irrelevant event, but for the event's texts, its status and the time (_log).
        self._irrelevant: dict[str, Any] = {
            "function": name, "event_id": None, "event_type": None, "subject": None,
            "verdict": IRRELEVANT.verdict, "effect": IRRELEVANT.effect, "reason": IRRELEVANT.reason, "outcome": 204,
            "reply": None, "duration_ms": None}
        self._count_irrelevant = metrics.EVENTS.bound(name, IRRELEVANT.verdict, "204")  # the hot path's counter

    def __call__(self, request: flask.Request) -> flask.Response:
        environ = request.environ
        if environ.get("REQUEST_METHOD") != "POST":  # a probe or a person: say who we are, change nothing
            if request.path == "/metrics" and request.method in ("GET", "HEAD"):  # Prometheus (docs/metrics.md)
                return flask.Response(metrics.REGISTRY.exposition(), status=200, content_type=metrics.CONTENT_TYPE)
            return flask.Response(status=200 if request.method in ("GET", "HEAD") else 405)
        started = time.perf_counter_ns()
        event = None
        try:
            # Read here, not by Flask (werkzeug reads a bad Content-Length as 0 and fails a short body with a 500):
            # the same 400 and 413 as under gunicorn; what was read stays for functions-framework's read after it.
            body = wsgi.read_body(environ)
            ruled = self.prefilter(intake.EnvironCe(environ), body, self.context.settings) if self.prefilter else True
            if ruled is False or ruled.__class__ is Outcome:
                wsgi.check_binary_environ(environ)  # a valid envelope: the data is not decoded by the runtime
                outcome = IRRELEVANT if ruled is False else ruled
            else:
                event = intake.parse_environ(environ, body)
                metrics.TRIGGER.set(metrics.RESCAN if event.family == "ping" else metrics.EVENT)
                metrics.FUNCTION.set(self.name)
                outcome = self.on_event(event, self.context)
            if outcome.reply is None:
                status, response = 204, flask.Response(status=204)
            else:
                status, response = 200, self._reply(outcome.reply)
        except Exception as exc:  # noqa: BLE001 - every failure must become an HTTP answer
            if isinstance(exc, RecursionError):
                # Only an event's data can nest that deep (a Kubernetes object nests a few dozen levels):
                # the same event would fail the same way again, so it is refused, not retried.
                exc = BadEvent("the event's data is nested too deeply to be read")
            status, error_headers, error_body = http_answer(exc)
            outcome = Outcome(verdict="error", reason=exc.message if isinstance(exc, VmeventsError) else repr(exc))
            response = flask.Response(error_body, status=status, headers=error_headers)
            if not isinstance(exc, VmeventsError):
                logging.getLogger("vmevents").exception("unexpected error handling event")
        if event is not None:
            if event.family == "ping":
                metrics.RESCANS.inc(self.name, "complete" if status < 300 else "failed")
            self._log(event.id, event.type, outcome.subject or event.subject, outcome, status, started)
        else:
            self._log(environ.get("HTTP_CE_ID"), environ.get("HTTP_CE_TYPE"), environ.get("HTTP_CE_SUBJECT"),
                      outcome, status, started)
        return response

    def _reply(self, reply: Reply) -> flask.Response:
        headers, body = reply.headers_and_body(self.name)
        return flask.Response(body, status=200, headers=headers)

    def _log(self, event_id: str | None, event_type: str | None, subject: str | None, outcome: Outcome,
             status: int, started: int) -> None:
        """The one line per event: write_line's, made without write_line's pass over every value when the
        line as encoded is already what write_line would write (this runs for every event): the texts from
        outside (the event's id, type and subject) are str or None (intake sees to it); when the outcome's
        are too and the whole line is at most MAX_LOGGED_TEXT bytes, no value needs clipping."""
        if outcome is IRRELEVANT and status == 204:  # nearly every event's line: its texts are the event's, the time
            self._count_irrelevant()
            record = self._irrelevant.copy()  # in write_line's order, IRRELEVANT's texts in it (made once)
            record["event_id"], record["event_type"], record["subject"] = event_id, event_type, subject
            record["outcome"] = status
            texts = subject is None or subject.__class__ is str
        else:
            reply = outcome.reply
            verdict, effect, reason = outcome.verdict, outcome.effect, outcome.reason
            metrics.EVENTS.inc(self.name, verdict if verdict.__class__ is str else "unknown", str(status))
            if reason.__class__ is str and "://" in reason:  # a URL is shown by its origin only (shared/redact.py)
                reason = scrub_urls(reason)
            record = {
                "function": self.name, "event_id": event_id, "event_type": event_type, "subject": subject,
                "verdict": verdict, "effect": effect, "reason": reason, "outcome": status,
                "reply": reply.type if reply else None,
            }
            texts = verdict.__class__ is str and effect.__class__ is str and reason.__class__ is str \
                and (subject is None or subject.__class__ is str)
        # whole microseconds, in ms: round(seconds * 1000, 3) to within a microsecond, at a third of the cost
        record["duration_ms"] = (time.perf_counter_ns() - started) // 1000 / 1000
        if texts:
            try:
                line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
            except (TypeError, ValueError):  # a text orjson refuses (a lone surrogate): write_line says so
                line = b""
            if 0 < len(line) <= MAX_LOGGED_TEXT + 1:  # the line and its newline
                _emit(line)
                return
        write_line(record)


IRRELEVANT = Outcome("irrelevant")

WsgiApp = Callable[[dict, Callable[..., Any]], Any]
# Werkzeug's headers for Flask's `Response(status=204)`: a 204 carries no Content-Length (gunicorn frames it).
_NO_CONTENT = "204 NO CONTENT"  # werkzeug spells a status in capitals
_NO_CONTENT_HEADERS = [("Content-Type", "text/html; charset=utf-8")]
_ROOT = ("/", "")


class Front:
    """The WSGI middleware that answers, before Flask, an event the function's prefilter rules out: the
    irrelevant event, nearly every event a function receives (docs/hot-path.md).

    Flask's request dispatch (a request context, URL routing, the view, a Response object, functions-framework's
    execution id and its after-request read of the body) costs more than anything a prefilter does, and an
    irrelevant event uses none of it. So a POST to / with a Content-Length is read here, and `FunctionApp`'s own
    shortcut is taken here: the same prefilter on the same environ and body, the same envelope check, the same 204
    with werkzeug's headers and the same log line. Everything else goes on to Flask (`behind`) unchanged, with
    the body put back: an event the prefilter lets through (it is decoded and handled there), a prefilter that
    raises or an envelope that fails the check (answered there, 400 and its sentence, by the one error mapping),
    a probe, another path, a chunked body, and a body that is not what its Content-Length says (not a number, over
    wsgi.MAX_BODY, or ended early: answered there by shared.wsgi.read_body, 400 or 413, the larger one unread). It
    decides nothing of its own: tests/shared/test_hotpath.py holds its answers to Flask's on ordinary and hostile
    events, and tests/shared/test_http_surface.py both under the development server and under gunicorn."""

    __slots__ = ("app", "behind")

    def __init__(self, app: FunctionApp, behind: WsgiApp):
        self.app, self.behind = app, behind

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Any:
        started = time.perf_counter_ns()
        get = environ.get
        app = self.app
        length = get("CONTENT_LENGTH")
        if (get("REQUEST_METHOD") != "POST" or get("PATH_INFO") not in _ROOT or app.prefilter is None
                or not length or not length.isdigit() or not length.isascii() or "HTTP_TRANSFER_ENCODING" in environ):
            return self.behind(environ, start_response)
        size = int(length)
        if size > wsgi.MAX_BODY:  # a 413 behind, before anything is read
            return self.behind(environ, start_response)
        try:
            body = environ["wsgi.input"].read(size)
        except Exception:  # noqa: BLE001 - the sender went away mid-body: read again behind, and a 400 there
            return self.behind(environ, start_response)
        if len(body) != size:  # the body ended early: read short again behind, where it is a 400
            environ["wsgi.input"] = io.BytesIO(body)
            return self.behind(environ, start_response)
        try:
            ruled = app.prefilter(intake.EnvironCe(environ), body, app.context.settings)
        except Exception:  # noqa: BLE001 - answered behind, where the same call raises again and is mapped
            ruled = True
        if (ruled is False or (ruled.__class__ is Outcome and ruled.reply is None)) and wsgi.binary_envelope(environ):
            start_response(_NO_CONTENT, _NO_CONTENT_HEADERS.copy())
            app._log(get("HTTP_CE_ID"), get("HTTP_CE_TYPE"), get("HTTP_CE_SUBJECT"),
                     IRRELEVANT if ruled is False else ruled, 204, started)
            return ()
        environ["wsgi.input"] = io.BytesIO(body)
        return self.behind(environ, start_response)


def _recorder(kube: Kube, name: str) -> Recorder:
    from shared.recorder import Recorder

    return Recorder(kube, name)


def start(name: str, on_event: Handler, load_settings: Callable[[Mapping[str, str]], Any],
          environ: Mapping[str, str] | None = None, *, needs_kube: bool = True,
          prefilter: Prefilter | None = None) -> FunctionApp:
    """Read the settings and connect, once, at start-up. A bad setting stops the start, naming it."""
    import os

    try:
        given = os.environ if environ is None else environ
        settings = load_settings(given)
        for line in lookalikes(name, given):  # a misspelt setting is ignored: said once, at start
            sys.stderr.write(line + "\n")
        kube = None
        if needs_kube:
            from shared.kubeconfig import connect

            kube = connect()
    except (SettingsError, RuntimeError) as exc:
        sys.stderr.write(f"{name}: cannot start: {exc}\n")
        raise SystemExit(2) from None
    metrics.PROCESS["function"] = name
    metrics.RESCAN_STOPS.zero(name)  # a series that exists from the start: increase() then counts its first stop
    app = FunctionApp(name, on_event, settings, kube, prefilter=prefilter)
    if prefilter is not None and flask.has_app_context():
        # Started by functions-framework's create_app, which runs the function's module in its app's context:
        # answer the irrelevant events in front of that app (`Front`), as it puts its own middleware there.
        served = flask.current_app._get_current_object()  # type: ignore[attr-defined]
        served.wsgi_app = Front(app, served.wsgi_app)
    # Everything loaded so far (the kubernetes client alone is a few hundred thousand objects) lives
    # as long as the process: keep the cyclic GC from re-scanning it while events stream in.
    gc.freeze()
    return app

"""A local stand-in for a Knative Broker and its Triggers: real HTTP ingress, filtering, delivery.

It behaves like the channel-based broker of knative/eventing v1.22 in the ways vmevents depends on:

- Ingress accepts binary and structured CloudEvents (400 otherwise, 202 when accepted) and adds
  `knativearrivaltime`.
- Trigger filters: `spec.filter.attributes` (exact, "" = any; pkg/eventfilter/attributes/filter.go)
  or the SubscriptionsAPI `spec.filters` (exact, prefix, suffix, all, any, not), which override
  `filter`. Triggers are validated like the eventing webhook does
  (pkg/apis/eventing/v1/trigger_validation.go): one dialect per expression, lowercase attribute
  names; an exact/prefix/suffix map may name several attributes, all of which must match. CESQL is
  refused: this simulator cannot evaluate it.
- Delivery (pkg/kncloudevents/event_dispatcher.go, retries.go): binary mode, `Prefer: reply`;
  retry on 5xx, 404, 408, 409, 429 and network errors (`SelectiveRetry`); backoff before retry
  n (n = 1, 2, ...) is delay*2^(n-1) (exponential) or delay*(n-1) (linear), because
  go-retryablehttp passes attemptNum = n-1; `timeout` is per attempt.
- A 2xx answer carrying a CloudEvent is a reply and goes back into the ingress; an empty 2xx is
  success; a 2xx with any other body is a failed delivery with code 502 (knative/eventing#6394).
- After the last failure the original event goes to the dead-letter sink with `knativeerrordest`,
  `knativeerrorcode` and `knativeerrordata` = base64 of the response body, truncated to 1024
  characters (pkg/kncloudevents/attributes/knative_error.go, dispatchExecutionInfoTransformers).
  Not after a 2xx with a body that is not a CloudEvent: the filter answers that 502 itself, with a
  plain body, and dispatchExecutionInfoTransformers, finding no ErrExtensionInfo JSON in a
  broker-filter answer, adds no extension (shown by Knative's broker in tests/test_delivery.py).
"""
from __future__ import annotations

import base64
import itertools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from cloudevents.conversion import to_binary
from cloudevents.exceptions import GenericException
from cloudevents.http import CloudEvent, from_http

log = logging.getLogger("vmevents.sim.broker")

# pkg/kncloudevents/attributes/knative_error.go
ERROR_DEST = "knativeerrordest"
ERROR_CODE = "knativeerrorcode"
ERROR_DATA = "knativeerrordata"
ERROR_DATA_MAX = 1024
ARRIVAL_TIME = "knativearrivaltime"
BROKER_TTL = "knativebrokerttl"
DEFAULT_TTL = 255

_ATTRIBUTE_NAME = re.compile(r"^[a-z][a-z0-9]*$")  # trigger_validation.go validAttributeName
_DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "cesql")


class TriggerError(ValueError):
    """A Trigger the Knative webhook would reject, or that this simulator cannot run."""


# ---------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------

_ISO_DURATION = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str) -> float:
    """Seconds in an ISO-8601 duration such as PT0.2S, PT30S, PT1M30S or P1D."""
    match = _ISO_DURATION.match(text or "")
    if not match or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"{text!r} is not an ISO-8601 duration; use a value like PT0.2S, PT30S or PT1M.")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)


_FRACTION = re.compile(r"(\d+)\.(\d)\d*")


def knative_duration(text: str) -> float:
    """A delivery duration as Knative reads it: rickb777/date v1.13.0 `period.Parse` (knative.dev/eventing
    pkg/kncloudevents/retries.go) keeps one decimal place of each field and drops the rest, so PT0.25S is 0.2 s
    and PT0.05S is no time at all."""
    parse_duration(text)  # refuse what is no duration, with its message
    return parse_duration(_FRACTION.sub(lambda m: f"{m.group(1)}.{m.group(2)}", text))


# ---------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------

Filter = Callable[[Mapping[str, Any]], bool]


def _attribute(attrs: Mapping[str, Any], name: str) -> str | None:
    value = attrs.get(name)
    return None if value is None else str(value)


def _map_filter(spec: Mapping[str, str], test: Callable[[str, str], bool]) -> Filter:
    items = [(str(k), str(v)) for k, v in spec.items()]

    def check(attrs: Mapping[str, Any]) -> bool:
        for name, wanted in items:
            value = _attribute(attrs, name)
            if value is None or not test(value, wanted):
                return False
        return True

    return check


def compile_attributes_filter(attributes: Mapping[str, str] | None) -> Filter:
    """The legacy `spec.filter.attributes`: exact match on every key; "" matches any value
    but the attribute must still exist (pkg/eventfilter/attributes/filter.go)."""
    return _map_filter(attributes or {}, lambda value, wanted: wanted == "" or value == wanted)


def compile_filter_expression(expr: Mapping[str, Any]) -> Filter:
    """One SubscriptionsAPIFilter (pkg/eventfilter/subscriptionsapi/create.go)."""
    if expr.get("cesql"):
        raise TriggerError(
            f"CESQL filter {expr['cesql']!r} is not supported by the local broker; "
            "express it with exact/prefix/suffix/all/any/not."
        )
    if expr.get("exact"):
        return _map_filter(expr["exact"], lambda value, wanted: value == wanted)
    if expr.get("prefix"):
        return _map_filter(expr["prefix"], lambda value, wanted: value.startswith(wanted))
    if expr.get("suffix"):
        return _map_filter(expr["suffix"], lambda value, wanted: value.endswith(wanted))
    if expr.get("all"):
        parts = [compile_filter_expression(e) for e in expr["all"]]
        return lambda attrs: all(p(attrs) for p in parts)
    if expr.get("any"):
        parts = [compile_filter_expression(e) for e in expr["any"]]
        return lambda attrs: any(p(attrs) for p in parts)
    if expr.get("not") is not None:
        inner = compile_filter_expression(expr["not"])
        return lambda attrs: not inner(attrs)
    return lambda attrs: True  # an empty expression is Knative's NoFilter


def compile_filters(filters: list[Mapping[str, Any]] | None) -> Filter:
    """`spec.filters`: every expression must pass; none at all passes everything."""
    parts = [compile_filter_expression(e) for e in (filters or [])]
    return lambda attrs: all(p(attrs) for p in parts)


def _validate_expression(expr: Any, path: str) -> list[str]:
    if not isinstance(expr, Mapping):
        return [f"{path}: a filter expression must be a mapping, not {expr!r}"]
    errors = []
    dialects = [d for d in _DIALECTS if expr.get(d) not in (None, "", [], {})]
    unknown = sorted(set(expr) - set(_DIALECTS))
    if unknown:
        errors.append(f"{path}: unknown filter dialect(s) {unknown}; use one of {list(_DIALECTS)}")
    if len(dialects) > 1:
        errors.append(f"{path}: multiple dialects found ({', '.join(dialects)}), filters can have only one dialect set")
    for dialect in ("exact", "prefix", "suffix"):
        mapping = expr.get(dialect)
        if not mapping:
            continue
        for name, value in mapping.items():
            if not _ATTRIBUTE_NAME.match(str(name)):
                errors.append(f"{path}.{dialect}: attribute name {name!r} must be lowercase alphanumeric, "
                              f"starting with a letter")
            if value in (None, ""):
                errors.append(f"{path}.{dialect}.{name}: the value must not be empty")
    for dialect in ("all", "any"):
        for i, sub in enumerate(expr.get(dialect) or []):
            errors += _validate_expression(sub, f"{path}.{dialect}[{i}]")
    if expr.get("not") is not None:
        errors += _validate_expression(expr["not"], f"{path}.not")
    if expr.get("cesql"):
        errors.append(f"{path}.cesql: CESQL is not supported by the local broker")
    return errors


def validate_trigger(trigger: Mapping[str, Any]) -> None:
    """Reject what the eventing webhook rejects (trigger_validation.go), plus CESQL."""
    name = trigger.get("metadata", {}).get("name", "?")
    spec = trigger.get("spec") or {}
    errors = []
    if not spec.get("broker"):
        errors.append("spec.broker: missing field")
    for attr in ((spec.get("filter") or {}).get("attributes") or {}):
        if not _ATTRIBUTE_NAME.match(str(attr)):
            errors.append(f"spec.filter.attributes: attribute name {attr!r} must be lowercase alphanumeric")
    for i, expr in enumerate(spec.get("filters") or []):
        errors += _validate_expression(expr, f"spec.filters[{i}]")
    subscriber = spec.get("subscriber") or {}
    if not (subscriber.get("ref") or subscriber.get("uri")):
        errors.append("spec.subscriber: expected exactly one of ref or uri")
    if errors:
        raise TriggerError(f"Trigger {name!r} would be rejected by Knative: " + "; ".join(errors))


def trigger_filter(trigger: Mapping[str, Any]) -> Filter:
    """The filter Knative applies for a Trigger: `filters` when present, else `filter.attributes`."""
    spec = trigger.get("spec") or {}
    if spec.get("filters"):
        return compile_filters(spec["filters"])
    return compile_attributes_filter((spec.get("filter") or {}).get("attributes"))


def matches(trigger: Mapping[str, Any], attributes: Mapping[str, Any]) -> bool:
    """Whether an event with these context attributes passes the Trigger's filter."""
    return trigger_filter(trigger)(attributes)


# ---------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliverySpec:
    retry: int = 0
    backoff_policy: str = "exponential"
    backoff_delay: float = 0.0
    timeout: float | None = None
    dead_letter_sink: Mapping[str, Any] | None = None

    @classmethod
    def from_manifest(cls, spec: Mapping[str, Any] | None) -> DeliverySpec:
        spec = spec or {}
        policy = spec.get("backoffPolicy", "exponential")
        if policy not in ("exponential", "linear"):
            raise TriggerError(f"backoffPolicy {policy!r} is not valid; use exponential or linear.")
        return cls(
            retry=int(spec.get("retry", 0)),
            backoff_policy=policy,
            backoff_delay=knative_duration(spec["backoffDelay"]) if spec.get("backoffDelay") else 0.0,
            timeout=knative_duration(spec["timeout"]) if spec.get("timeout") else None,
            dead_letter_sink=spec.get("deadLetterSink"),
        )

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry `retry_number` (1-based), as go-retryablehttp computes it."""
        n = retry_number - 1
        if self.backoff_policy == "linear":
            return self.backoff_delay * n
        return self.backoff_delay * (2 ** n)


def effective_delivery(trigger_delivery: Mapping[str, Any] | None,
                       broker_delivery: Mapping[str, Any] | None) -> DeliverySpec:
    """The Trigger's delivery when it has one, else the Broker's (the MT broker does the same)."""
    return DeliverySpec.from_manifest(trigger_delivery if trigger_delivery else broker_delivery)


@dataclass(frozen=True)
class Delivery:
    """One HTTP attempt the broker made: to a subscriber, or to a dead-letter sink."""

    event_id: str
    type: str
    subject: str | None
    trigger: str
    attempt: int
    status: int | None            # HTTP status (502 for a 2xx with a non-CloudEvent body)
    error: str | None             # network error, timeout, or why the answer counts as failed
    reply_id: str | None = None
    reply_type: str | None = None
    dead_lettered: bool = False   # True for the attempt that sent the event to the dead-letter sink
    target: str = ""
    retry_after: str | None = None  # the subscriber's Retry-After (tests: a 429 from the API reaches the broker)
    at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True)
class _Outcome:
    status: int | None
    error: str | None
    body: bytes
    reply: CloudEvent | None
    retry_after: str | None = None  # the subscriber's Retry-After header, as it answered
    # The broker filter answered the channel itself (not with the subscriber's answer wrapped in its
    # ErrExtensionInfo JSON): the dispatcher then finds no error details to put on the dead letter.
    from_filter: bool = False


def _retryable(outcome: _Outcome) -> bool:
    """pkg/kncloudevents/retries.go SelectiveRetry."""
    if outcome.status is None:
        return True
    code = outcome.status
    return code >= 500 or code in (404, 408, 409, 429)


def event_attributes(event: CloudEvent) -> dict[str, Any]:
    return dict(event.get_attributes())


def _marshal_data(data: Any) -> bytes | str:
    if data is None:
        return b""
    if isinstance(data, (bytes, str)):
        return data
    return json.dumps(data)


def binary_request(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Binary-mode headers and body with every header value a string."""
    headers, body = to_binary(event, data_marshaller=_marshal_data)
    return {k: str(v) for k, v in headers.items()}, body if isinstance(body, bytes) else str(body).encode()


def _is_cloudevent_response(headers: Mapping[str, str]) -> bool:
    lower = {k.lower(): v for k, v in headers.items()}
    return "ce-specversion" in lower or lower.get("content-type", "").startswith("application/cloudevents")


def post_event(url: str, event: CloudEvent, timeout: float | None,
               extra_headers: Mapping[str, str] | None = None) -> _Outcome:
    headers, body = binary_request(event)
    headers.update(extra_headers or {})
    try:
        response = requests.post(url, data=body, headers=headers, timeout=timeout or 30.0)
    except requests.RequestException as exc:
        return _Outcome(None, f"dispatch error: {type(exc).__name__}: {exc}", f"dispatch error: {exc}".encode(), None)
    content = response.content or b""
    if not 200 <= response.status_code < 300:
        return _Outcome(response.status_code, f"unexpected HTTP response, expected 2xx, got {response.status_code}",
                        content, None, response.headers.get("Retry-After"))
    if _is_cloudevent_response(response.headers):
        try:
            reply = from_http(dict(response.headers), content, data_unmarshaller=lambda raw: raw)
        except GenericException as exc:
            return _Outcome(502, f"malformed CloudEvent reply: {exc}", content, None)
        return _Outcome(response.status_code, None, content, reply)
    if content.strip():
        # knative/eventing#6394: "Received a non-empty response not recognized as CloudEvent".
        return _Outcome(502, "2xx with a body that is not a CloudEvent counts as a failed delivery (502)",
                        content, None, from_filter=True)
    return _Outcome(response.status_code, None, content, None)


def _error_data(body: bytes) -> str:
    return base64.b64encode(body).decode()[:ERROR_DATA_MAX]


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------------------------------
# The broker
# ---------------------------------------------------------------------------------------------


@dataclass
class _Route:
    name: str
    filter: Filter
    subscriber: str
    delivery: DeliverySpec
    dead_letter: str | None
    pool: ThreadPoolExecutor


Resolver = Callable[[Mapping[str, Any]], str]


class Broker:
    """Broker ingress on 127.0.0.1:<free port> that fans events out to its Triggers' subscribers.

    `triggers` are Trigger manifests (only those with `spec.broker == name` are used), `resolve`
    turns a Destination (`{ref: ...}` and/or `{uri: ...}`) into a URL, `delivery_defaults` is
    the Broker's `spec.delivery`. `time_scale` multiplies every backoff (tests use 0.01).
    """

    def __init__(
        self,
        triggers: list[Mapping[str, Any]],
        resolve: Resolver,
        delivery_defaults: Mapping[str, Any] | None = None,
        time_scale: float = 1.0,
        *,
        name: str = "default",
        namespace: str | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
        workers_per_trigger: int = 4,
        validate: bool = True,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.time_scale = time_scale
        self.on_delivery = on_delivery
        self.deliveries: list[Delivery] = []
        self.received: list[CloudEvent] = []
        self._lock = threading.Condition()
        self._pending = 0
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._routes: list[_Route] = []
        for trigger in triggers:
            spec = trigger.get("spec") or {}
            meta = trigger.get("metadata") or {}
            if spec.get("broker") != name:
                continue
            if namespace and meta.get("namespace") not in (None, namespace):
                continue
            if validate:
                validate_trigger(trigger)
            delivery = effective_delivery(spec.get("delivery"), delivery_defaults)
            self._routes.append(_Route(
                name=meta.get("name", "?"),
                filter=trigger_filter(trigger),
                subscriber=resolve(spec["subscriber"]),
                delivery=delivery,
                dead_letter=resolve(delivery.dead_letter_sink) if delivery.dead_letter_sink else None,
                pool=ThreadPoolExecutor(max_workers=workers_per_trigger,
                                        thread_name_prefix=f"trigger-{meta.get('name')}"),
            ))

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self._server:
            raise RuntimeError("The broker is not started; call start() first.")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    @property
    def triggers(self) -> list[str]:
        return [r.name for r in self._routes]

    def start(self) -> Broker:
        broker = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, message = broker._ingress(dict(self.headers.items()), body)
                payload = message.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
                log.debug("ingress: " + format, *args)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="broker-ingress",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        for route in self._routes:
            route.pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no delivery is pending or in flight; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def wait_for(self, predicate: Callable[[list[Delivery]], bool], timeout: float = 10.0) -> bool:
        """Block until `predicate(deliveries)` holds; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(list(self.deliveries)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    # -- ingress --------------------------------------------------------------------------

    def _ingress(self, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        try:
            event = from_http(headers, body, data_unmarshaller=lambda raw: raw)
        except GenericException as exc:
            return 400, f"not a CloudEvent in binary or structured mode: {exc}"
        attrs = event.get_attributes()
        for required in ("id", "source", "type", "specversion"):
            if not attrs.get(required):
                return 400, f"the CloudEvent has no {required}"
        ttl = attrs.get(BROKER_TTL)
        try:
            ttl = DEFAULT_TTL if ttl in (None, "") else int(ttl)
        except ValueError:
            ttl = DEFAULT_TTL
        if ttl <= 0:
            log.warning("dropping event %s: %s exhausted (reply loop?)", attrs.get("id"), BROKER_TTL)
            return 202, "dropped: ttl exhausted"
        event[BROKER_TTL] = ttl
        event[ARRIVAL_TIME] = _now_rfc3339()
        self.publish(event)
        return 202, ""

    def publish(self, event: CloudEvent) -> list[str]:
        """Route an event as if it had entered the ingress (tests may call this directly);
        returns the names of the matching triggers."""
        if ARRIVAL_TIME not in event.get_attributes():
            event[ARRIVAL_TIME] = _now_rfc3339()
        attrs = event_attributes(event)
        routes = [r for r in self._routes if r.filter(attrs)]
        with self._lock:
            self.received.append(event)
            self._pending += len(routes)
        for route in routes:
            try:
                route.pool.submit(self._deliver, route, event)
            except RuntimeError:  # pool shut down while stopping
                self._done()
        return [r.name for r in routes]

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            self._lock.notify_all()

    def _record(self, record: Delivery) -> None:
        with self._lock:
            self.deliveries.append(record)
            self._lock.notify_all()
        if self.on_delivery:
            try:
                self.on_delivery(record)
            except Exception:  # a timeline printer must not break delivery
                log.exception("on_delivery callback failed")

    # -- dispatch -------------------------------------------------------------------------

    def _attempts(self, url: str, event: CloudEvent, spec: DeliverySpec, trigger: str, dead_letter: bool,
                  extra: Mapping[str, str] | None):
        """Send with retries; yields nothing, returns the last outcome."""
        attrs = event.get_attributes()
        outcome = None
        for attempt in itertools.count(1):
            if self._stopping.is_set():
                break
            outcome = post_event(url, event, spec.timeout, extra)
            self._record(Delivery(
                event_id=attrs.get("id"), type=attrs.get("type"), subject=attrs.get("subject"),
                trigger=trigger, attempt=attempt, status=outcome.status, error=outcome.error,
                reply_id=outcome.reply["id"] if outcome.reply is not None else None,
                reply_type=outcome.reply["type"] if outcome.reply is not None else None,
                dead_lettered=dead_letter, target=url, retry_after=outcome.retry_after,
            ))
            if outcome.error is None or not _retryable(outcome) or attempt > spec.retry:
                break
            if self._stopping.wait(spec.backoff(attempt) * self.time_scale):
                break
        return outcome

    def _deliver(self, route: _Route, event: CloudEvent) -> None:
        try:
            # Kn-Namespace: the Trigger's namespace, as Knative's broker filter sets it (filter_handler.go send).
            extra = {"Prefer": "reply", **({"Kn-Namespace": self.namespace} if self.namespace else {})}
            outcome = self._attempts(route.subscriber, event, route.delivery, route.name, False, extra)
            if outcome is None:
                return
            failed_dest = route.subscriber
            if outcome.error is None and outcome.reply is not None:
                reply_outcome = self._forward_reply(event, outcome.reply)
                if reply_outcome.error is None:
                    return
                outcome, failed_dest = reply_outcome, self.url
            elif outcome.error is None:
                return
            if route.dead_letter:
                self._dead_letter(route, event, outcome, failed_dest)
            else:
                log.warning("trigger %s: event %s lost: %s", route.name, event["id"], outcome.error)
        except Exception:
            log.exception("trigger %s: delivery of %s crashed", route.name, event["id"])
        finally:
            self._done()

    def _forward_reply(self, original: CloudEvent, reply: CloudEvent) -> _Outcome:
        ttl = original.get_attributes().get(BROKER_TTL, DEFAULT_TTL)
        reply[BROKER_TTL] = max(int(ttl) - 1, 0)
        return post_event(self.url, reply, 10.0)

    def _dead_letter(self, route: _Route, event: CloudEvent, outcome: _Outcome, destination: str) -> None:
        dlq = CloudEvent(dict(event.get_attributes()), event.data)
        if not outcome.from_filter:
            dlq[ERROR_DEST] = destination
            dlq[ERROR_CODE] = str(outcome.status if outcome.status is not None else 500)
            dlq[ERROR_DATA] = _error_data(outcome.body)
        self._attempts(route.dead_letter, dlq, route.delivery, route.name, True, None)


def new_event(event_type: str, source: str = "/sim/test", data: Any = None, **attributes: Any) -> CloudEvent:
    """A CloudEvent for tests and demos, with a fresh id."""
    attrs = {"type": event_type, "source": source, "id": str(uuid.uuid4())}
    attrs.update({k: v for k, v in attributes.items() if v is not None})
    if data is not None and "datacontenttype" not in attrs and not isinstance(data, (bytes, str)):
        attrs["datacontenttype"] = "application/json"
    return CloudEvent(attrs, data)

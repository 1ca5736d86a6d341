"""Turning an HTTP request into a CloudEvent the functions understand, or a clear 400.

Accepts CloudEvents 1.0 in binary mode (ce-* headers, the body is the data) and structured mode
(application/cloudevents+json). Knows the three event families the functions subscribe to:
ApiServerSource Resource mode (data = the whole object), Reference mode (data = a reference to
fetch) and PingSource ticks (docs/facts.md §6). Parsing is hand-written rather than
`cloudevents.http.from_http` (and JSON is decoded with orjson) because it sits on the hot path of
every event, and each failure must become a sentence an operator can act on.

Every identifier an event names (kind, apiVersion, name, namespace, uid, subject) is checked here
against Kubernetes' own rules for it, so nothing a sender invents reaches a request path or a
selector: a name with a `/`, `?` or `,` in it is a 400 before any API call.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.environ import EnvironCe, environ_get, environ_key, header_name, wsgi_headers  # noqa: F401
from shared.errors import BadEvent

RESOURCE_PREFIX = "dev.knative.apiserver.resource."
REF_PREFIX = "dev.knative.apiserver.ref."
PING = "dev.knative.sources.ping"
OPERATIONS = ("add", "update", "delete")
_REQUIRED = ("id", "source", "type")
_CONTEXT = frozenset({"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema"})
_STRUCTURED = "application/cloudevents+json"

# k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1123Label (63 characters) and
# IsDNS1123Subdomain (253). Namespaces are labels; the name of every other kind the functions read
# (pods, events and KubeVirt's custom resources: apiextensions validates them with NameIsDNSSubdomain)
# is a subdomain.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(_SUBDOMAIN)
LABEL_NAMED_KINDS = frozenset({"Namespace"})
# A kind is a Go type name in CamelCase (the API's `kind`); an apiVersion is `[group/]version` with a
# Kubernetes version (v1, v1beta2, v2alpha1: apimachinery's version priority rules).
KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
API_VERSION = re.compile(rf"(?:{_SUBDOMAIN}/)?v[1-9][0-9]*(?:(?:alpha|beta)[1-9][0-9]*)?")
# metadata.uid is a UUID the API server generates (types.UID); accept its characters only, so a uid
# is always safe in a selector.
UID = re.compile(r"[0-9A-Za-z](?:[-0-9A-Za-z]{0,126}[0-9A-Za-z])?")
MAX_SUBJECT = 1024


def check_name(kind: str, name: object, what: str = "name") -> str:
    """`name` when it is a valid name for an object of `kind`, else a BadEvent saying the rule."""
    label = kind in LABEL_NAMED_KINDS
    rule, limit = (DNS1123_LABEL, 63) if label else (DNS1123_SUBDOMAIN, 253)
    if isinstance(name, str) and len(name) <= limit and rule.fullmatch(name):
        return name
    raise BadEvent(f"{what} {_shown(name)} is not a valid {kind} name (a DNS-1123 {'label' if label else 'subdomain'}: "
                   f"lower-case letters, digits{'' if label else ', dots'} and '-', at most {limit} characters)")


def check_namespace(namespace: object) -> str:
    return check_name("Namespace", namespace, "namespace")


def check_uid(uid: object) -> str:
    if isinstance(uid, str) and UID.fullmatch(uid):
        return uid
    raise BadEvent(f"uid {_shown(uid)} is not a Kubernetes uid (a UUID)")


def valid_name(kind: str, name: object) -> bool:
    try:
        check_name(kind, name)
    except BadEvent:
        return False
    return True


def _shown(value: object) -> str:
    """A value for an error message: short, whatever it is (the message is also logged)."""
    text = repr(value) if isinstance(value, str) else f"of type {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None


@dataclass(frozen=True)
class Incoming:
    """One received CloudEvent."""

    id: str
    type: str
    source: str
    subject: str | None = None
    data: Any = None
    extensions: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """'resource', 'ref', 'ping' or 'other'."""
        if self.type.startswith(RESOURCE_PREFIX):
            return "resource"
        if self.type.startswith(REF_PREFIX):
            return "ref"
        return "ping" if self.type == PING else "other"

    @property
    def operation(self) -> str | None:
        """'add', 'update' or 'delete' for ApiServerSource events."""
        if self.family in ("resource", "ref"):
            return self.type.rsplit(".", 1)[1]
        return None

    @property
    def kind(self) -> str | None:
        kind = self.extensions.get("kind") or (self.data.get("kind") if isinstance(self.data, dict) else None)
        return kind if isinstance(kind, str) else None

    def object(self) -> dict:
        """The object a Resource-mode event carries. It is a hint, never evidence: re-read it."""
        obj = self.data
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(meta, dict) or not isinstance(meta.get("name"), str) \
                or not isinstance(obj.get("kind"), str) or not obj["kind"]:
            raise BadEvent(f"event {self.id} ({self.type}) does not carry a Kubernetes object: "
                           f"data needs kind and metadata.name")
        if self.extensions.get("kind") and self.extensions["kind"] != obj["kind"]:
            raise BadEvent(f"event {self.id} says kind {self.extensions['kind']} but carries a {obj['kind']}")
        return obj

    def ref(self) -> ObjectRef:
        """The object a Reference-mode event points to."""
        data = self.data if isinstance(self.data, dict) else {}
        missing = [key for key in ("apiVersion", "kind", "name") if not isinstance(data.get(key), str)]
        if missing:
            raise BadEvent(f"event {self.id} ({self.type}) is a reference without {', '.join(missing)}")
        return ObjectRef(data["apiVersion"], data["kind"], data["name"], data.get("namespace") or None)


def checked(ref: ObjectRef, event_id: str) -> ObjectRef:
    """The reference when each of its parts follows Kubernetes' rules, else a BadEvent naming the part."""
    if not isinstance(ref.kind, str) or not KIND.fullmatch(ref.kind):
        raise BadEvent(f"event {event_id}: kind {_shown(ref.kind)} is not a Kubernetes kind")
    if ref.api_version and not (isinstance(ref.api_version, str) and API_VERSION.fullmatch(ref.api_version)):
        raise BadEvent(f"event {event_id}: apiVersion {_shown(ref.api_version)} is not a Kubernetes apiVersion "
                       f"(group/version, like kubevirt.io/v1)")
    check_name(ref.kind, ref.name, f"event {event_id}: name")
    if ref.namespace is not None:
        check_name("Namespace", ref.namespace, f"event {event_id}: namespace")
    return ref


@dataclass(frozen=True)
class About:
    """What an ApiServerSource event is about: the object's reference, and in Resource mode the
    object itself (a hint, never evidence: re-read before acting). In Reference mode `obj` is None."""

    ref: ObjectRef
    obj: dict | None
    deleted: bool

    @property
    def namespace(self) -> str:
        """The object's namespace: about() says "default" for a namespaced reference without one."""
        return self.ref.namespace or "default"


def about(event: Incoming, kinds: Collection[str], function: str, *,
          ref_kinds: Collection[str] | None = None) -> About:
    """The object an ApiServerSource event concerns, if it is one of `kinds` (in Reference mode, of
    `ref_kinds`, which defaults to `kinds`). Anything else is a BadEvent naming what `function`
    handles. PingSource ticks are the caller's to handle before."""
    if event.family not in ("ref", "resource"):
        raise BadEvent(f"unsupported event type {event.type}; {function} handles dev.knative.apiserver.resource.*, "
                       f"dev.knative.apiserver.ref.* and dev.knative.sources.ping")
    if event.operation not in OPERATIONS:
        # ApiServerSource sends add, update and delete only (docs/facts.md §6): another verb is a
        # sender this function does not understand, and guessing (say, "an update") could act on it.
        raise BadEvent(f"unsupported event type {event.type}: ApiServerSource events end in "
                       f"{', '.join(OPERATIONS)}")
    if event.family == "ref":
        ref, obj, accepted = event.ref(), None, kinds if ref_kinds is None else ref_kinds
    else:
        obj, accepted = event.object(), kinds
        meta = obj["metadata"]
        ref = ObjectRef(obj.get("apiVersion") or "", obj["kind"], meta["name"], meta.get("namespace") or None)
    ref = checked(ref, event.id)
    if ref.kind not in accepted:
        raise BadEvent(f"event {event.id} is about a {ref.kind}; {function} handles "
                       f"{' and '.join(sorted(accepted))} events" + ("" if obj is not None else " in Reference mode"))
    if ref.namespace is None:
        ref = ObjectRef(ref.api_version, ref.kind, ref.name, "default")
    return About(ref, obj, event.operation == "delete")


# A JSON escape that may spell a character of a token (printable ASCII: `"\u0053ucceeded"` is "Succeeded", and `\/`
# a `/`). Not the escapes Go's encoding/json writes by itself, as the ApiServerSource encodes every object (docs/
# facts.md §6): `\u003c`, `\u003e`, `\u0026` (<, > and &), control characters (below \u0020), \u2028, \u2029.
_SPELLS_TOKEN = re.compile(rb"\\u00(?:2[0-57-9A-Fa-f]|3[0-9ABDFabdf]|[4-7][0-9A-Fa-f])|\\/")


def spelt_with_escapes(body: bytes) -> bool:
    """Whether a token could hide in the body behind a JSON escape, where no byte search finds it: then the body
    must be decoded. A body without a backslash (memchr: about 100 ns on 4 KB) has none; one with a backslash (an
    escaped quote in a JSON annotation) is searched by a regex (3-7 µs on 4 KB; a two-byte `in` took 12 µs). An
    escaped backslash before a `u` reads as an escape here: it errs towards decoding."""
    return b"\\" in body and _SPELLS_TOKEN.search(body) is not None


def may_concern(headers: Mapping[str, str], body: bytes, kinds: Collection[str], tokens: Collection[bytes]) -> bool:
    """The functions' cheap pre-check on raw bytes. False only for a Resource-mode event of one of
    `kinds` whose JSON contains none of `tokens` anywhere, and no escape a token could hide behind
    (spelt_with_escapes): such an event is answered as irrelevant without being decoded. It can only
    err towards decoding (a token found elsewhere in the object); the next re-scan catches anything an
    event could not show."""
    if headers.__class__ is EnvironCe:  # environ_get, spelt out: a call costs more than its two lookups
        get = headers.environ.get
        event_type, kind = get("HTTP_CE_TYPE", ""), get("HTTP_CE_KIND")
    else:
        event_type, kind = headers.get("ce-type", ""), headers.get("ce-kind")
    if not event_type.startswith(RESOURCE_PREFIX) or kind not in kinds:
        return True
    for token in tokens:  # not any(...): no generator to make, on every irrelevant event
        if token in body:
            return True
    return b"\\" in body and _SPELLS_TOKEN.search(body) is not None  # spelt_with_escapes, without a call


def parse(headers: Mapping[str, str], body: bytes) -> Incoming:
    """Parse a CloudEvent from HTTP headers (case-insensitive mapping) and body. Raises BadEvent."""
    content_type = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if content_type == _STRUCTURED:
        return _structured(body)
    if headers.get("ce-specversion") is not None:
        return _binary(headers, body, content_type)
    raise BadEvent(_NOT_A_CLOUDEVENT)


_NOT_A_CLOUDEVENT = ("not a CloudEvent: send ce-* headers (binary mode) or a body of type "
                     "application/cloudevents+json (structured mode)")


def parse_environ(environ: Mapping[str, Any], body: bytes) -> Incoming:
    """`parse(wsgi_headers(environ), body)` in one pass over a WSGI environ, without the headers dict in
    between (every decoded event runs this; tests/shared/test_hotpath.py holds the two equal)."""
    content_type = (environ.get("CONTENT_TYPE") or "").split(";")[0].strip().lower()
    if content_type == _STRUCTURED:
        return _structured(body)
    attributes = {key[8:].lower(): value for key, value in environ.items() if key.startswith("HTTP_CE_")}
    if attributes.get("specversion") is None:
        raise BadEvent(_NOT_A_CLOUDEVENT)
    return _build(attributes, _decode_data(body, content_type, attributes.get("id", "?")))


def check_binary(headers: Mapping[str, str]) -> None:
    """Check a binary-mode envelope without building the event (raises BadEvent): what `_check` checks,
    spelt out for the irrelevant-event path, which runs it on every such event."""
    get = headers.get
    if get("ce-specversion") != "1.0" or not (get("ce-id") and get("ce-source") and get("ce-type")):
        _check(lambda name: get("ce-" + name))  # raises, with the sentence that says which


def _check(attribute: Callable[[str], Any]) -> None:
    if attribute("specversion") != "1.0":
        raise BadEvent(f"unsupported CloudEvents specversion {_shown(attribute('specversion'))}; send 1.0")
    missing = [name for name in _REQUIRED if not isinstance(attribute(name), str) or not attribute(name)]
    if missing:
        raise BadEvent(f"CloudEvent is missing required attribute(s): {', '.join(missing)}")


def _binary(headers: Mapping[str, str], body: bytes, content_type: str) -> Incoming:
    attributes = {key[3:].lower(): value for key, value in headers.items() if key.lower().startswith("ce-")}
    data = _decode_data(body, content_type, attributes.get("id", "?"))
    return _build(attributes, data)


def _structured(body: bytes) -> Incoming:
    try:
        envelope = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadEvent("structured CloudEvent body is not valid JSON") from None
    if not isinstance(envelope, dict):
        raise BadEvent("structured CloudEvent body must be a JSON object")
    data = envelope.pop("data", None)
    if "data_base64" in envelope:
        raise BadEvent("data_base64 is not supported: the sources send JSON data")
    return _build({key: value for key, value in envelope.items()}, data)


def _decode_data(body: bytes, content_type: str, event_id: str) -> Any:
    if not body:
        return None
    if content_type in ("", "application/json", "text/json") or content_type.endswith("+json"):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadEvent(f"event {event_id}: data is not valid JSON") from None
    return body.decode("utf-8", errors="replace")


def _build(attributes: dict[str, Any], data: Any) -> Incoming:
    _check(attributes.get)
    subject = attributes.get("subject")
    if subject is not None and (not isinstance(subject, str) or len(subject) > MAX_SUBJECT
                                or not subject.isprintable()):
        raise BadEvent(f"event {_shown(attributes['id'])}: subject must be a printable string of at most "
                       f"{MAX_SUBJECT} characters")
    extensions = {}
    for key, value in attributes.items():
        if key in _CONTEXT:
            continue
        # CloudEvents 1.0 §3.1.1 and the JSON format §2.2: an attribute is a string, an integer or a
        # boolean; an object or a list is not a CloudEvent this function should guess about.
        if not isinstance(value, (str, int, float)) or value != value:  # value != value: NaN
            raise BadEvent(f"event {_shown(attributes['id'])}: attribute {_shown(key)} must be a string, "
                           f"a number or a boolean")
        extensions[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return Incoming(id=attributes["id"], type=attributes["type"], source=attributes["source"],
                    subject=subject, data=data, extensions=extensions)

"""What a reply event carries: the findings in it, read by the one schema of docs/findings.md. Pure, no I/O.

A reply whose data has a `findings` list is a summary (a re-scan's `.scanned`, device-conflict's `.batch`):
one finding per item. Any other reply is one finding. Nothing here knows which function sent it: a
producer that adds a field changes nothing, and a reply that lacks one of the schema's fields still
becomes a finding (its category and identity then come from the event's type and subject).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import BadEvent
from shared.intake import Incoming

PREFIX = "io.vmevents."
STATES = ("detected", "resolved", "reported")


@dataclass(frozen=True)
class Finding:
    """One finding, as the schema names its fields (docs/findings.md)."""

    function: str
    category: str
    state: str                         # detected | resolved | reported
    subject: str | None
    identity: Mapping[str, str]
    severity: str | None
    summary: str
    advice: tuple[Any, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None              # the id of the reply it came in (or would have, inside a summary)


def findings(event: Incoming) -> list[Finding]:
    """The findings a reply event carries. Raises BadEvent for what is not a finding."""
    if not event.type.startswith(PREFIX):
        raise BadEvent(f"unsupported event type {event.type}; alert-forwarder handles the io.vmevents.* "
                       f"replies of the other functions")
    if not isinstance(event.data, Mapping):
        raise BadEvent(f"event {event.id} ({event.type}) has no JSON object as data; a finding's data is "
                       f"a JSON object")
    function, _, what = event.type[len(PREFIX):].partition(".")
    items = event.data.get("findings")
    if items is None:
        return [_finding(event.data, function, what, event.subject, event.id)]
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise BadEvent(f"event {event.id} ({event.type}): data.findings must be a list of objects")
    return [_finding(item, function, what, event.subject, None) for item in items]


def _finding(data: Mapping[str, Any], function: str, what: str, subject: str | None, event_id: str | None) -> Finding:
    state = _text(data.get("state"))
    if state not in STATES:
        state = what if what in STATES else "reported"
    given = data.get("identity")
    identity = ({str(k): str(v) for k, v in given.items() if v not in (None, "")} if isinstance(given, Mapping)
                else _from_subject(_text(data.get("subject")) or subject))
    advice = data.get("advice")
    details = data.get("details")
    return Finding(function=_text(data.get("function")) or function,
                   category=_text(data.get("category")) or what or "finding",
                   state=state, subject=_text(data.get("subject")) or subject, identity=identity,
                   severity=_text(data.get("severity")) or None,
                   summary=_text(data.get("summary")) or "",
                   advice=tuple(advice) if isinstance(advice, list) else ((advice,) if advice else ()),
                   details=details if isinstance(details, Mapping) else {},
                   id=_text(data.get("id")) or event_id)


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _from_subject(subject: str | None) -> dict[str, str]:
    """{namespace, name} from an API path like /apis/kubevirt.io/v1/namespaces/<ns>/<plural>/<name>."""
    parts = (subject or "").strip("/").split("/")
    if "namespaces" not in parts:
        return {}
    rest = parts[parts.index("namespaces") + 1:]
    found = {"namespace": rest[0] if rest else "", "name": rest[2] if len(rest) > 2 else ""}
    return {k: v for k, v in found.items() if v}

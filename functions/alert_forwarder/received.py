"""What a reply event carries: the findings in it, read by the one schema of docs/findings.md. Pure, no I/O.

A reply whose data has a `findings` list is a summary (a re-scan's `.scanned`, device-conflict's `.batch`):
one finding per item. Any other reply is one finding. Nothing here knows which function sent it: a
producer that adds a field changes nothing, and a reply that lacks one of the schema's fields still
becomes a finding (its category and identity then come from the event's type and subject).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shared.errors import BadEvent
from shared.finding import FINDING_LABEL, Finding, digest
from shared.intake import Incoming

PREFIX = "io.vmevents."
STATES = ("detected", "resolved", "reported")
MAX_DEPTH = 64  # a finding's data nests a few levels (details of details); JSON encoders recurse


@dataclass(frozen=True)
class Received:
    """One finding as a reply carried it (docs/findings.md): the schema's fields, its state and its life."""

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
    key: str = ""                      # with function, category and subject: its identity (docs/findings.md)
    opened_at: datetime | None = None  # its episode's start (openedAt), when it has one
    resolved_at: datetime | None = None
    episode: int | None = None         # its episode's number, when it has one
    record: tuple[str, str] | None = None  # where it is kept: its Event's (namespace, name) (shared/ledger.py)
    data: Mapping[str, Any] = field(default_factory=dict)  # the finding as the reply carried it

    @property
    def labels(self) -> dict[str, str]:
        """Its identity as labels: the producer's, and the digest of its whole identity (shared.finding's rule:
        two findings are never one alert), computed here for a finding written before the label existed."""
        return {**self.identity, FINDING_LABEL: self.identity.get(FINDING_LABEL)
                or digest(self.function, self.category, self.subject or "", self.key)}


def findings(event: Incoming) -> list[Received]:
    """The findings a reply event carries. Raises BadEvent for what is not a finding."""
    if not event.type.startswith(PREFIX):
        raise BadEvent(f"unsupported event type {event.type}; alert-forwarder handles the io.vmevents.* "
                       f"replies of the other functions")
    if not isinstance(event.data, Mapping):
        raise BadEvent(f"event {event.id} ({event.type}) has no JSON object as data; a finding's data is "
                       f"a JSON object")
    if _deeper_than(event.data, MAX_DEPTH):
        raise BadEvent(f"event {event.id} ({event.type}): data nested deeper than {MAX_DEPTH} levels; a finding's "
                       f"data is a few levels deep (docs/findings.md)")
    function, _, what = event.type[len(PREFIX):].partition(".")
    items = event.data.get("findings")
    if items is None:
        return [_finding(event.data, function, what, event.subject, event.id)]
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise BadEvent(f"event {event.id} ({event.type}): data.findings must be a list of objects")
    return [_finding(item, function, what, event.subject, None) for item in items]


def _finding(data: Mapping[str, Any], function: str, what: str, subject: str | None, event_id: str | None) -> Received:
    state = _text(data.get("state"))
    if state not in STATES:
        state = what if what in STATES else "reported"
    given = data.get("identity")
    identity = ({str(k): str(v) for k, v in given.items() if v not in (None, "")} if isinstance(given, Mapping)
                else _from_subject(_text(data.get("subject")) or subject))
    advice = data.get("advice")
    details = data.get("details")
    return Received(function=_text(data.get("function")) or function,
                   category=_text(data.get("category")) or what or "finding",
                   state=state, subject=_text(data.get("subject")) or subject, identity=identity,
                   severity=_text(data.get("severity")) or None,
                   summary=_text(data.get("summary")) or "",
                   advice=tuple(advice) if isinstance(advice, list) else ((advice,) if advice else ()),
                   details=details if isinstance(details, Mapping) else {},
                   id=_text(data.get("id")) or event_id, key=_text(data.get("key")),
                   opened_at=_when(data.get("openedAt")), resolved_at=_when(data.get("resolvedAt")),
                   episode=_episode(data.get("episode")), record=_record(data.get("record")), data=data)


def on_record(data: Mapping[str, Any], state: str, opened_at: datetime | None,
              resolved_at: datetime | None, episode: int | None = None,
              where: tuple[str, str] | None = None) -> Received:
    """A finding as its record keeps it (shared/ledger.py: the schema, with its life beside it); `state` is
    `detected` for an open one, `resolved` for one that ended; `where`, its Event's namespace and name."""
    found = _finding({**data, "state": state}, _text(data.get("function")), state, _text(data.get("subject")), None)
    return replace(found, opened_at=opened_at or found.opened_at, resolved_at=resolved_at or found.resolved_at,
                   episode=episode or found.episode, record=where or found.record)


def of_record(finding: Finding, state: str, opened_at: datetime | None, resolved_at: datetime | None,
              episode: int, where: tuple[str, str]) -> Received:
    """`on_record` from the finding the ledger already read (shared/ledger.py Record.finding), without writing it
    out and reading it back: a tick does this for every finding on record."""
    return Received(function=finding.function, category=finding.category, state=state, subject=finding.subject,
                    identity={k: v for k, v in finding.labels.items() if v}, severity=finding.severity.strip() or None,
                    summary=finding.summary.strip(), advice=tuple(finding.advice), details=finding.details,
                    key=finding.key, opened_at=opened_at, resolved_at=resolved_at, episode=episode, record=where)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON values nest deeper than `limit` (no recursion: what is checked may be nested thousands deep, and
    the alert's words and the webhook's payload are made of it)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _episode(value: Any) -> int | None:
    """An episode number (1, 2, ...); None when absent or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _record(value: Any) -> tuple[str, str] | None:
    """`<namespace>/<Event name>`, each a DNS-1123 name as Kubernetes writes them, or None: a reply names the
    API path the forwarder then reads, so nothing else is accepted (shared/kube.py escapes it too)."""
    if not isinstance(value, str):
        return None
    namespace, slash, name = value.partition("/")
    if not slash or len(namespace) > 63 or not _NAME.fullmatch(namespace) or not _NAME.fullmatch(name):
        return None
    return namespace, name


def _when(value: Any) -> datetime | None:
    """An RFC 3339 time of the schema (openedAt, resolvedAt); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        found = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo is not None else None


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

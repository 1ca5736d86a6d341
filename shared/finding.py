"""The one finding schema (docs/findings.md): what a finding is, as every reply carries it, and the one summary
shape of a reply that carries several. shared/ledger.py keeps a finding's life; this module is pure."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.replies import Reply, reply_type

DETECTED, RESOLVED, REPORTED = "detected", "resolved", "reported"  # a finding's state in a reply
BATCH = "batch"                              # several notices of one event, in one summary reply
# The label that makes an alert one finding's alone: the digest of the finding's whole identity (function,
# category, subject, key), the same digest that names its Event (`<recipient>.f<digest>`). The readable labels a
# producer gives (namespace, vm, device, ...) route and group; they need not tell apart two findings (a holder
# with two blocked VMs, a VMI recreated under the same name), and two findings under one label set would be one
# alert in Alertmanager, ended by whichever resolves first.
FINDING_LABEL = "finding"


def digest(function: str, category: str, subject: str, key: str) -> str:
    """The identity's digest: the `finding` label, and the suffix of the finding's Event name."""
    return hashlib.sha256("\x00".join((function, category, subject, key)).encode()).hexdigest()[:16]


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Finding:
    """A situation a person should know about, as every reply carries it (docs/findings.md)."""

    function: str                  # the producer, e.g. "device-conflict"
    category: str                  # what kind of finding (the alert table's key)
    subject: str                   # the API path of the object it is about
    key: str                       # what tells apart two findings of one category and subject ("" if nothing)
    identity: Mapping[str, str]    # the labels that name it (Alertmanager's labels besides alertname, severity)
    severity: str = "warning"      # info | warning | critical
    summary: str = ""              # one sentence
    advice: tuple[Any, ...] = ()   # what to do: sentences, or {action, why, yaml}
    details: Mapping[str, Any] = field(default_factory=dict)  # the producer's own fields: free-form

    @property
    def ident(self) -> str:
        return "\x00".join((self.function, self.category, self.subject, self.key))

    @property
    def labels(self) -> dict[str, str]:
        """The identity as labels: the producer's, and the digest of the whole identity (FINDING_LABEL), so that
        two findings are never one alert."""
        return {**{k: v for k, v in self.identity.items() if k != FINDING_LABEL},
                FINDING_LABEL: digest(self.function, self.category, self.subject, self.key)}

    def data(self, state: str, **life: Any) -> dict[str, Any]:
        """The finding as reply data: the schema's fields, then its life (episode, openedAt, ...)."""
        return {"function": self.function, "category": self.category, "subject": self.subject, "key": self.key,
                "identity": self.labels, "severity": self.severity, "summary": self.summary,
                "advice": list(self.advice), "details": dict(self.details), "state": state, **life}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Finding:
        """The finding a reply or a record carries; the identity's digest label is derived, so it is left out."""
        return cls(str(data["function"]), str(data["category"]), str(data["subject"]), str(data.get("key") or ""),
                   {str(k): str(v) for k, v in (data.get("identity") or {}).items() if k != FINDING_LABEL},
                   str(data.get("severity") or "warning"), str(data.get("summary") or ""),
                   tuple(data.get("advice") or ()), dict(data.get("details") or {}))


def report(finding: Finding, what: str = REPORTED) -> Reply:
    """A finding with no episode (something done, e.g. a VMI cleaned up): one reply of type
    `<function>.<what>` with state `reported`, and no memory; its id comes from its identity alone."""
    return Reply(reply_type(finding.function, what), finding.subject, finding.data(REPORTED), key=finding.ident)


def summary(function: str, what: str, subject: str, replies: Iterable[Reply], sentence: str,
            scanned: Mapping[str, int] | None = None) -> Reply | None:
    """Several findings in one reply (a re-scan's `.scanned`, device-conflict's `.batch`): each item is its
    own reply's data and id; `scanned` counts what was looked at. None when there is no finding."""
    items = [dict(r.data, id=r.id) for r in replies]
    if not items:
        return None
    data = {"summary": sentence, "scanned": dict(scanned or {}), "findings": items}
    return Reply(reply_type(function, what), subject, data, key="|".join(sorted(i["id"] for i in items)))


def one_or_summary(function: str, subject: str, replies: list[Reply], sentence: str) -> Reply | None:
    """One answer carries one reply: a single finding as itself, several as a `.batch` summary."""
    if len(replies) == 1:
        return replies[0]
    return summary(function, BATCH, subject, replies, sentence)

"""What a reply event carries: the findings in it, and the readers of their fields that both the
rule table (decide.py) and the texts (wording.py) use. Pure, no I/O.

Each producer shapes its finding its own way (the per-producer adapters of decide.py and
wording.py read them); this module only takes them out of the event.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.errors import BadEvent
from shared.intake import Incoming

PREFIX = "io.vmevents."
# A re-scan's summary (`<function>.scanned`) or a batch (`<function>.batch`, several changes in one
# answer) carries findings: one alert each. vmi-cleanup lists them under `cleaned`; migration-report
# and io-pause-report under `reported` / `findings`, each item with its own `type`; device-conflict's
# batch under `detected` and `resolved` (the type is `<function>.detected` / `.resolved`).
COLLECTIONS = (".scanned", ".batch")
EXPANDS = {"cleaned": "io.vmevents.vmi-cleanup.cleaned", "reported": None, "findings": None,
           "detected": ".detected", "resolved": ".resolved"}


@dataclass(frozen=True)
class Finding:
    """One finding, as a reply event carries it: the event's type and subject, and its data."""

    type: str
    subject: str | None
    data: Mapping[str, Any]

    def text(self, *keys: str) -> str | None:
        """The first of these data fields that is a non-empty string."""
        for key in keys:
            value = self.data.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None


def findings(event: Incoming) -> list[Finding]:
    """The findings a reply event carries. Raises BadEvent for what is not a finding."""
    if not event.type.startswith(PREFIX):
        raise BadEvent(f"unsupported event type {event.type}; alert-forwarder handles the io.vmevents.* "
                       f"replies of the other functions")
    if not isinstance(event.data, Mapping):
        raise BadEvent(f"event {event.id} ({event.type}) has no JSON object as data; a finding's data is "
                       f"a JSON object")
    if not event.type.endswith(COLLECTIONS):
        return [Finding(event.type, event.subject, event.data)]
    family, found = event.type.rsplit(".", 1)[0], []
    for key, item_type in EXPANDS.items():
        items = event.data.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
            raise BadEvent(f"event {event.id} ({event.type}): data.{key} must be a list of objects")
        for item in items:
            of_type = (item.get("type") if item_type is None
                       else family + item_type if item_type[0] == "." else item_type)
            if not isinstance(of_type, str) or not of_type.startswith(PREFIX) or of_type.endswith(COLLECTIONS):
                raise BadEvent(f"event {event.id} ({event.type}): an item of data.{key} has no io.vmevents.* type")
            found.append(Finding(of_type, item.get("subject") or event.subject,
                                 {k: v for k, v in item.items() if k not in ("type", "subject", "id")}))
    return found


def split_ref(ref: Any) -> tuple[str, str]:
    """"ns/name" → (ns, name); a bare name has no namespace."""
    if isinstance(ref, Mapping):  # {"namespace": ..., "name": ...} or {"vm": "ns/name"}
        if isinstance(ref.get("vm"), str):
            return split_ref(ref["vm"])
        return str(ref.get("namespace") or ""), str(ref.get("name") or "")
    text = str(ref or "")
    namespace, _, name = text.rpartition("/")
    return namespace, name


def names(items: Any) -> list[str]:
    """A list of object references as "ns/name" strings."""
    return ["/".join(part for part in split_ref(item) if part) for item in (items if isinstance(items, list) else ())
            if item]


def volumes(f: Finding) -> list[Mapping[str, Any]]:
    """io-pause-report's volumes[{pvc, pv, longhornVolume, robustness, rebuilding, progress}]."""
    return [v for v in f.data.get("volumes") or () if isinstance(v, Mapping)]

"""Label and field selectors, parsed and matched as k8s.io/apimachinery pkg/labels and pkg/fields do.

Functions list with selectors (`kubevirt.io=virt-launcher`, `involvedObject.name=vm1`); a simulator that
ignored them would hide bugs that only show on a real cluster with more than one object.
"""
from __future__ import annotations

import re
from collections.abc import Callable

# labels.Parse: `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`.
_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"\s*(?P<not>!)?\s*(?P<key>{_KEY})\s*"
    rf"(?:(?P<op>==|=|!=)\s*(?P<value>{_VALUE})"
    rf"|(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*(?:,|$)")
# fields.ParseSelector: `path=v`, `path==v`, `path!=v`.
_FIELD_TERM = re.compile(r"^\s*(?P<path>[A-Za-z0-9_.]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^,]*?)\s*$")
# Every kind supports these two (generic registry's DefaultClusterScopedAttr / DefaultNamespaceScopedAttr).
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")

Requirement = Callable[[dict], bool]


def parse_labels(selector: str | None) -> list[Requirement]:
    if not selector or not selector.strip():
        return []
    requirements, position = [], 0
    while position < len(selector):
        found = _REQUIREMENT.match(selector, position)
        if not found or found.end() == position:
            raise ValueError(f"unable to parse requirement: invalid label selector: {selector!r}")
        requirements.append(_label_requirement(found))
        position = found.end()
    return requirements


def _label_requirement(found: re.Match) -> Requirement:
    key = found["key"]
    if found["not"]:
        if found["op"] or found["setop"]:
            raise ValueError(f"unable to parse requirement: '!' only negates existence: {found.group(0)!r}")
        return lambda labels: key not in labels
    if found["op"] in ("=", "=="):
        value = found["value"]
        return lambda labels: labels.get(key) == value
    if found["op"] == "!=":
        value = found["value"]
        # labels.Requirement.Matches: NotEquals also matches when the key is absent.
        return lambda labels: labels.get(key) != value
    if found["setop"]:
        values = {v.strip() for v in found["values"].split(",") if v.strip()}
        if found["setop"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: key not in labels or labels[key] not in values
    return lambda labels: key in labels


def parse_fields(selector: str | None, supported: tuple[str, ...]) -> list[Requirement]:
    if not selector or not selector.strip():
        return []
    requirements = []
    for term in selector.split(","):
        found = _FIELD_TERM.match(term)
        if not found:
            raise ValueError(f"invalid selector: '{selector}'; can't understand '{term}'")
        path, op, value = found["path"], found["op"], found["value"]
        if path not in _COMMON_FIELDS + supported:
            # The kinds' field label conversion funcs answer exactly this (pkg/apis/core/v1/conversion.go).
            raise ValueError(f'field label not supported: {path}')
        requirements.append(_field_requirement(path, op != "!=", value))
    return requirements


def _field_requirement(path: str, equal: bool, value: str) -> Requirement:
    return lambda obj: (field_value(obj, path) == value) == equal


def field_value(obj: dict, path: str) -> str:
    current = obj
    for part in path.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if isinstance(current, dict) and path == "source":
        current = current.get("component")  # Event `source` selects on source.component
    return "" if current is None else str(current)


def matcher(label_selector: str | None, field_selector: str | None,
            supported_fields: tuple[str, ...] = ()) -> Callable[[dict], bool]:
    """One predicate over whole objects for both selectors; raises ValueError on a malformed selector."""
    label_reqs = parse_labels(label_selector)
    field_reqs = parse_fields(field_selector, supported_fields)

    def matches(obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r(labels) for r in label_reqs) and all(r(obj) for r in field_reqs)
    return matches

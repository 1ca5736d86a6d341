"""Typed reads of JSON objects, from event payloads and from the API alike: a value of the wrong type is absent.

An event's payload is whatever a sender put there, and even an API object may hold a field of an unexpected
shape (a newer KubeVirt, a hand-written object in the simulator): reading `obj["status"]["phase"]` raises
on a list where an object is due, which would answer 500. Every reader here returns the value when it has the
type asked for and the default otherwise, so a function sees "absent" and decides accordingly, never an
exception. Kubernetes' own Go clients get the same effect from `unstructured.NestedString` and friends
(k8s.io/apimachinery pkg/apis/meta/v1/unstructured/helpers.go), which answer "not found" on a type mismatch.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Path = tuple[str, ...]


def _walk(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def mapping(obj: Any, *path: str) -> dict[str, Any]:
    """The object at `path`, or {} when absent or not an object."""
    value = _walk(obj, path)
    return value if isinstance(value, dict) else {}


def text(obj: Any, *path: str, default: str | None = None) -> str | None:
    """The string at `path`, or `default` when absent or not a string."""
    value = _walk(obj, path)
    return value if isinstance(value, str) else default


def string(obj: Any, *path: str) -> str:
    """The string at `path`, or "" when absent or not a string."""
    value = _walk(obj, path)
    return value if isinstance(value, str) else ""


def flag(obj: Any, *path: str) -> bool | None:
    """The boolean at `path`, or None when absent or not a boolean."""
    value = _walk(obj, path)
    return value if isinstance(value, bool) else None


def integer(obj: Any, *path: str) -> int | None:
    """The integer at `path` (not a boolean), or None."""
    value = _walk(obj, path)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def array(obj: Any, *path: str) -> list[Any]:
    """The list at `path`, or [] when absent or not a list."""
    value = _walk(obj, path)
    return value if isinstance(value, list) else []


def objects(obj: Any, *path: str) -> Iterator[dict[str, Any]]:
    """The entries of the list at `path` that are objects (anything else in it is skipped)."""
    return (entry for entry in array(obj, *path) if isinstance(entry, dict))


def strings(obj: Any, *path: str) -> dict[str, str]:
    """A map of strings at `path` (labels, annotations): entries whose value is not a string are absent."""
    return {key: value for key, value in mapping(obj, *path).items() if isinstance(value, str)}

"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), the two patch formats the functions send.

Strategic merge patch is applied as a merge patch: the kinds it differs on (lists with patchMergeKey, such
as a pod's containers) are not something the functions patch. The JSON patch follows evanphx/json-patch,
which the real apiserver uses (handlers/patch.go).
"""
from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH)
_MISSING = object()


class MalformedPatch(ValueError):
    """The patch document itself is wrong (400 BadRequest)."""


class PatchFailed(ValueError):
    """A well-formed JSON patch that does not apply to this object (422 in the real server)."""


def apply(patch_type: str, document: Any, patch: Any) -> Any:
    if patch_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise MalformedPatch("error decoding patch: a merge patch must be a JSON object")
        return merge(document, patch)
    if patch_type == JSON_PATCH:
        return json_patch(document, patch)
    raise MalformedPatch(f"unknown Content-Type header for patch: {patch_type}")


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, MergePatch(Target, Patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def json_patch(document: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise MalformedPatch("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise MalformedPatch("invalid JSON patch operation: each needs `op` and `path`")
        document = _apply_operation(document, operation)
    return document


def _apply_operation(document: Any, operation: dict) -> Any:
    op, path = operation["op"], operation["path"]
    if op in ("add", "replace", "test") and "value" not in operation:
        raise MalformedPatch(f"{op} operation on {path} is missing a value")
    if op == "add":
        return _add(document, path, copy.deepcopy(operation["value"]))
    if op == "remove":
        return _remove(document, path)[0]
    if op == "replace":
        document, _ = _remove(document, path, verb="replace")
        return _add(document, path, copy.deepcopy(operation["value"]))
    if op in ("move", "copy"):
        source = _get(document, operation.get("from", ""))
        if op == "move":
            document, source = _remove(document, operation["from"], verb="move")
        return _add(document, path, copy.deepcopy(source))
    if op == "test":
        if not json_equal(_get(document, path, default=None), operation["value"]):
            raise PatchFailed(f"testing value {path} failed: test failed")
        return document
    raise MalformedPatch(f"Unexpected kind: {op}")


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ==, true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b or (_number(a) and _number(b) and a == b)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pointer(path: str) -> list[str]:
    """RFC 6901: "" is the whole document, "/a~1b/0" is ["a/b", "0"]."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise MalformedPatch(f"JSON pointer must start with '/': {path}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list, token: str, path: str, allow_end: bool = False) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchFailed(f"invalid array index {token!r} in {path}")
    position = int(token)
    if position > len(container) or (position == len(container) and not allow_end):
        raise PatchFailed(f"array index {position} out of bounds in {path}")
    return position


def _get(document: Any, path: str, default: Any = _MISSING) -> Any:
    current = document
    for token in _pointer(path):
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        elif default is not _MISSING:
            return default
        else:
            raise PatchFailed(f"doc is missing path: {path}")
    return current


def _parent(document: Any, path: str) -> tuple[Any, str]:
    tokens = _pointer(path)
    parent_path = "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens[:-1])
    parent = _get(document, parent_path)
    return parent, tokens[-1]


def _add(document: Any, path: str, value: Any) -> Any:
    if path == "":
        return value
    parent, token = _parent(document, path)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, path, allow_end=True), value)
    else:
        raise PatchFailed(f"add operation does not apply: doc is missing path: {path}")
    return document


def _remove(document: Any, path: str, verb: str = "remove") -> tuple[Any, Any]:
    if path == "":
        return None, document
    parent, token = _parent(document, path)
    if isinstance(parent, dict) and token in parent:
        return document, parent.pop(token)
    if isinstance(parent, list):
        return document, parent.pop(_index(parent, token, path))
    raise PatchFailed(f"{verb} operation does not apply: doc is missing key: {path}")

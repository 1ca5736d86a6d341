"""YAML as people write it, with comments: the block style of deploy/, flow style for short lists of words
(`verbs: ["get", "list"]`), strings quoted only where YAML would read them as something else.

PyYAML writes no comments, and the manifests keep their reasons as comments beside what they explain. The
subset here is what deploy/ uses: mappings, sequences, scalars. `Note` puts a comment above a key or an item
(wrapped to the line length) or after a scalar; `Flow` asks for a list on one line. Every text written is read
back with yaml.safe_load by the caller's tests, so a value never changes in the writing.
"""
from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

WIDTH = 118


@dataclass(frozen=True)
class Note:
    """A value with a comment above it (its key's line, or its item's `- `) and/or after it (a scalar's line)."""

    value: Any
    above: str = ""
    after: str = ""


class Flow(tuple):
    """A sequence of scalars written on one line: ["a", "b"]."""


class Quoted(str):
    """A string always written in double quotes (the chart's values: every setting a string)."""


def comment(text: str, indent: int) -> list[str]:
    """`text` as comment lines at `indent`, wrapped; a blank line in it starts a new paragraph (a bare `#`)."""
    lines: list[str] = []
    pad = " " * indent
    for number, paragraph in enumerate(text.split("\n\n")):
        if number:
            lines.append(f"{pad}#")
        words = " ".join(paragraph.split())
        lines += [f"{pad}# {line}" for line in textwrap.wrap(words, WIDTH - indent - 2, break_on_hyphens=False,
                                                                 break_long_words=False)]
    return lines


def scalar(value: Any, *, in_flow: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if in_flow or isinstance(value, Quoted) or not _plain(text):
        return json.dumps(text, ensure_ascii=False)
    return text


def _plain(text: str) -> bool:
    """Whether YAML reads `text`, written bare, as this very string."""
    if not text or text != text.strip() or re.search(r"[:#]\s|\s#|^[-?:,\[\]{}#&*!|>'\"%@`]", text) \
            or text.endswith(":"):
        return False
    try:
        return yaml.safe_load(f"k: {text}") == {"k": text}
    except yaml.YAMLError:
        return False


def _after(note: str) -> str:
    return f"  # {note}" if note else ""


def _unwrap(value: Any) -> tuple[Any, str, str]:
    if isinstance(value, Note):
        return value.value, value.above, value.after
    return value, "", ""


def _is_empty_block(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple) and not isinstance(value, Flow) and not value


def mapping(items: Mapping[str, Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for key, raw in items.items():
        value, above, after = _unwrap(raw)
        lines += comment(above, indent) if above else []
        if isinstance(value, Flow):
            lines.append(f"{pad}{key}: [{', '.join(scalar(v, in_flow=True) for v in value)}]{_after(after)}")
        elif _is_empty_block(value):
            lines.append(f"{pad}{key}: {'{}' if isinstance(value, Mapping) else '[]'}{_after(after)}")
        elif isinstance(value, Mapping):
            lines.append(f"{pad}{key}:{_after(after)}")
            lines += mapping(value, indent + 2)
        elif isinstance(value, list | tuple):
            lines.append(f"{pad}{key}:{_after(after)}")
            lines += sequence(value, indent + 2)
        else:
            lines.append(f"{pad}{key}: {scalar(value)}{_after(after)}")
    return lines


def sequence(items: Sequence[Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for raw in items:
        value, above, after = _unwrap(raw)
        lines += comment(above, indent) if above else []
        if isinstance(value, Mapping) and value:
            inner = mapping(value, indent + 2)
            first = next(i for i, line in enumerate(inner) if not line.lstrip().startswith("#"))
            lines += inner[:first]  # comments above the first key go above the item's dash
            lines.append(f"{pad}- {inner[first][indent + 2:]}")
            lines += inner[first + 1:]
        elif isinstance(value, list | tuple) and not isinstance(value, Flow):
            raise ValueError("a sequence directly in a sequence is not written here")
        else:
            lines.append(f"{pad}- {scalar(value)}{_after(after)}")
    return lines


def document(obj: Mapping[str, Any], head: str = "", indent: int = 0) -> str:
    """One YAML document, with `head` as the comment above it; `indent`: every line shifted (a block in a block)."""
    return "\n".join((comment(head, indent) if head else []) + mapping(obj, indent)) + "\n"


def documents(docs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Several documents (head, object), separated by `---`."""
    return "---\n".join(document(obj, head) for head, obj in docs)


def plain(value: Any) -> Any:
    """The data a text written from `value` must read back as: its notes dropped, flows as lists."""
    value = value.value if isinstance(value, Note) else value
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return str(value) if isinstance(value, Quoted) else value

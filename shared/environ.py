"""The WSGI environ as a CloudEvent's headers, read only where asked (shared.intake re-exports these): what a
prefilter is handed on the hot path (docs/hot-path.md)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


def environ_get(headers: Mapping[str, str]) -> Callable[[str], Any]:
    """A `get` of a prefilter's headers by their WSGI environ keys (`HTTP_CE_TYPE`, `CONTENT_TYPE`: `environ_key`):
    for the runtime's `EnvironCe`, the environ's own `get`, so that each header costs a dict lookup and not a
    Python-level call as well (twice the lookup); for any other mapping (tests hand plain dicts), its `get` of the
    header's name. Absent, a header is None (Content-Type included, where `EnvironCe.get` says "")."""
    if headers.__class__ is EnvironCe:
        return headers.environ.get
    return lambda key: headers.get(header_name(key))


def header_name(key: str) -> str:
    """The header a WSGI environ holds at `key` (`environ_key`'s inverse), as intake names it: Content-Type, ce-*."""
    return "Content-Type" if key == "CONTENT_TYPE" else key[5:].lower().replace("_", "-")


class EnvironCe(Mapping[str, str]):
    """The headers `wsgi_headers` gives, read from the WSGI environ only when asked for: what a prefilter is
    handed (`shared.wsgi` names it too). A prefilter reads one or two of them (ce-type, ce-kind) of nearly
    every event a function receives; building the whole dict for that costs more than the rest of the
    irrelevant path. A WSGI server hands each header over as `HTTP_` + its name upper-cased with `-` as `_`
    (PEP 3333; gunicorn/http/wsgi.py), so `ce-type` is `HTTP_CE_TYPE`. `environ` is the WSGI environ itself:
    a prefilter on the hot path reads it directly (`environ_get`), by those keys."""

    __slots__ = ("environ",)

    def __init__(self, environ: Mapping[str, Any]):
        self.environ = environ

    def get(self, name: str, default: Any = None) -> Any:
        key = _ENVIRON_KEYS.get(name) or environ_key(name)
        return self.environ.get(key, "" if key == "CONTENT_TYPE" else default)  # as wsgi_headers has it

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return str(value)

    def __iter__(self) -> Iterator[str]:
        return iter(wsgi_headers(self.environ))

    def __len__(self) -> int:
        return len(wsgi_headers(self.environ))


def environ_key(name: str) -> str:
    """Where a WSGI environ holds the header `name`."""
    return "CONTENT_TYPE" if name.lower() == "content-type" else "HTTP_" + name.upper().replace("-", "_")


# The names prefilters ask for, converted once.
_ENVIRON_KEYS = {name: environ_key(name) for name in (
    "Content-Type", "ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-kind", "ce-name",
    "ce-namespace", "ce-apiversion")}


def wsgi_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """The headers intake reads, straight from a WSGI environ: Content-Type and every ce-* header.

    Iterating werkzeug's EnvironHeaders converts every header of the request; this reads only
    what a CloudEvent needs. For a prefilter, `EnvironCe` reads fewer still.
    """
    headers = {"Content-Type": environ.get("CONTENT_TYPE", "")}
    for key, value in environ.items():
        if key.startswith("HTTP_CE_"):
            headers["ce-" + key[8:].lower()] = value
    return headers

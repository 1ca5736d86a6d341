"""A CloudEvent's headers read where the WSGI server put them: the irrelevant-event path's intake.

Nearly every event a function receives is ruled out by its prefilter from a header or two and the raw body;
building every ce-* header into a dict for that (`intake.wsgi_headers`) cost a tenth of what answering at all
costs (docs/hot-path.md). Here the prefilter's headers are a view on the environ, and the envelope is checked
in it, with intake's rules and sentences.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shared.intake import check_binary, wsgi_headers


class EnvironCe(Mapping[str, str]):
    """The headers `wsgi_headers` gives, read from the WSGI environ only when asked for: what a prefilter is
    handed. A prefilter reads one or two of them (ce-type, ce-kind) of nearly every event a function
    receives; building the whole dict for that costs more than the rest of the irrelevant path. A WSGI
    server hands each header over as `HTTP_` + its name upper-cased with `-` as `_` (PEP 3333;
    gunicorn/http/wsgi.py), so `ce-type` is `HTTP_CE_TYPE`."""

    __slots__ = ("_environ",)

    def __init__(self, environ: Mapping[str, Any]):
        self._environ = environ

    def get(self, name: str, default: Any = None) -> Any:  # the hot path
        key = _ENVIRON_KEYS.get(name) or environ_key(name)
        return self._environ.get(key, "" if key == "CONTENT_TYPE" else default)  # as wsgi_headers has it

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return str(value)

    def __iter__(self) -> Iterator[str]:
        return iter(wsgi_headers(self._environ))

    def __len__(self) -> int:
        return len(wsgi_headers(self._environ))


def environ_key(name: str) -> str:
    """Where a WSGI environ holds the header `name`."""
    return "CONTENT_TYPE" if name.lower() == "content-type" else "HTTP_" + name.upper().replace("-", "_")


# The names prefilters ask for, converted once.
_ENVIRON_KEYS = {name: environ_key(name) for name in (
    "Content-Type", "ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-kind", "ce-name",
    "ce-namespace", "ce-apiversion")}


def check_binary_environ(environ: Mapping[str, Any]) -> None:
    """`check_binary` of the headers in a WSGI environ, read where the server put them."""
    get = environ.get
    if get("HTTP_CE_SPECVERSION") != "1.0" or not (get("HTTP_CE_ID") and get("HTTP_CE_SOURCE")
                                                    and get("HTTP_CE_TYPE")):
        check_binary(EnvironCe(environ))  # raises, with the sentence that says which

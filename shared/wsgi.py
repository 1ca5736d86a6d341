"""A CloudEvent's headers read where the WSGI server put them: the irrelevant-event path's intake.

Nearly every event a function receives is ruled out by its prefilter from a header or two and the raw body;
building every ce-* header into a dict for that (`intake.wsgi_headers`) cost a tenth of what answering at all
costs (docs/hot-path.md). Here the prefilter's headers are a view on the environ (`intake.EnvironCe`, which
`intake.environ_get` reads without a call per header), and the envelope is checked in it, with intake's
rules and sentences.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.environ import EnvironCe, environ_key
from shared.intake import check_binary

__all__ = ["EnvironCe", "binary_envelope", "check_binary_environ", "environ_key"]


def binary_envelope(environ: Mapping[str, Any]) -> bool:
    """Whether the environ holds a valid binary-mode envelope (specversion 1.0, an id, a source, a type): what
    `check_binary` accepts, without its sentence (tests/shared/test_hotpath.py holds the two together)."""
    get = environ.get
    return bool(get("HTTP_CE_SPECVERSION") == "1.0" and get("HTTP_CE_ID") and get("HTTP_CE_SOURCE")
                and get("HTTP_CE_TYPE"))


def check_binary_environ(environ: Mapping[str, Any]) -> None:
    """`check_binary` of the headers in a WSGI environ, read where the server put them."""
    if not binary_envelope(environ):
        check_binary(EnvironCe(environ))  # raises, with the sentence that says which

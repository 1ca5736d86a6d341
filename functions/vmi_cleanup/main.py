"""The functions-framework entry point of vmi-cleanup: `--target handle`.

Settings are read and the Kubernetes client configured here, once, when the server starts; a bad
setting stops the start with a message naming the variable.
"""
from flask import Request, Response

from functions.vmi_cleanup.handler import on_event, worth_decoding
from functions.vmi_cleanup.settings import FUNCTION, load
from shared.runtime import start

app = start(FUNCTION, on_event, load, prefilter=worth_decoding)


def handle(request: Request) -> Response:
    """The functions-framework `http` target (it must be a plain function)."""
    return app(request)

"""The functions-framework entry point of evacuation-report: `--target handle`.

Settings are read and the Kubernetes client configured here, once, when the server starts; a bad
setting stops the start with a message naming the variable.
"""
from functions.evacuation_report.handler import FUNCTION, on_event, worth_decoding
from functions.evacuation_report.settings import load
from shared.runtime import start

app = start(FUNCTION, on_event, load, prefilter=worth_decoding)


def handle(request):
    """The functions-framework `http` target (it must be a plain function)."""
    return app(request)

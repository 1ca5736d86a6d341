"""The functions-framework entry point of io-pause-report: `--target handle`.

Settings are read and the Kubernetes client configured here, once, when the server starts; a bad
setting stops the start with a message naming the variable.
"""
from functions.io_pause_report.io_pause import FUNCTION, Settings, on_event, worth_decoding
from shared.runtime import start

app = start(FUNCTION, on_event, Settings.from_env, prefilter=worth_decoding)


def handle(request):
    """The functions-framework `http` target (it must be a plain function)."""
    return app(request)

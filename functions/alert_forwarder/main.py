"""The functions-framework entry point of alert-forwarder: `--target handle`.

Settings (receivers, credentials files, MIN_SEVERITY) are read once, when the server starts; a bad
setting stops the start with a message naming the variable. Its Kubernetes client touches the finding Events
only: it reads a notice's record before sending it and writes on it what each receiver accepted (delivery.py),
and lists every finding on record on a tick (tick.py).
"""
from functions.alert_forwarder.handler import on_event, worth_decoding
from functions.alert_forwarder.settings import FUNCTION, load
from shared.runtime import start

app = start(FUNCTION, on_event, load, prefilter=worth_decoding)


def handle(request):
    """The functions-framework `http` target (it must be a plain function)."""
    return app(request)

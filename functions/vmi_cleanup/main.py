"""The functions-framework entry point of vmi-cleanup: `--target handle`.

Settings are read and the Kubernetes client configured here, once, when the server starts; a bad
setting stops the start with a message naming the variable.
"""
from functions.vmi_cleanup.cleanup import FUNCTION, Settings, on_event
from shared.runtime import start

handle = start(FUNCTION, on_event, Settings.from_env)

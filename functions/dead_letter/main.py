"""vmevents-dead-letter: the broker's last stop for an event no retry could deliver.

It logs the event, with the error the broker attached (Knative adds the extensions
knativeerrordest, knativeerrorcode and knativeerrordata, the latter base64), as one JSON line at
error level, so an operator's log pipeline sees every lost action or finding. It answers 2xx so
the broker stops there.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import sys

from shared.intake import Incoming
from shared.redact import origin, scrub_urls
from shared.runtime import Context, Outcome, start

FUNCTION = "dead-letter"
_log = logging.getLogger("vmevents.dead-letter")
if not _log.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(message)s"))
    _log.addHandler(_handler)
    _log.propagate = False


def _error_data(encoded: str | None) -> str | None:
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return encoded


def on_event(event: Incoming, ctx: Context) -> Outcome:
    ext = event.extensions
    # A URL is shown by its origin only (shared/redact.py): the subscriber's may carry user info, and the
    # error data is whatever the subscriber answered.
    destination = origin(ext["knativeerrordest"]) if ext.get("knativeerrordest") else None
    error = _error_data(ext.get("knativeerrordata"))
    _log.error(json.dumps({
        "level": "error", "function": FUNCTION, "undelivered": True,
        "event_id": event.id, "event_type": event.type, "source": event.source, "subject": event.subject,
        "destination": destination, "status": ext.get("knativeerrorcode"),
        "error": scrub_urls(error) if error else error,
    }, separators=(",", ":")))
    return Outcome("dead-lettered", subject=event.subject,
                   reason=f"undeliverable to {destination or 'its subscriber'} "
                          f"(status {ext.get('knativeerrorcode', '?')})")


app = start(FUNCTION, on_event, lambda environ: None, needs_kube=False)


def handle(request):
    """The functions-framework `http` target (it must be a plain function)."""
    return app(request)

"""The two kinds of failure a function can have, and the one place they become HTTP answers.

A *permanent* error means retrying cannot help (bad input): the broker must not redeliver, so it
answers 4xx. A *temporary* error means the same event may succeed later (API unreachable,
throttled, a conflict worth retrying): it answers 5xx so the broker redelivers (docs/facts.md §6: the
broker retries 5xx, 404, 408, 409 and 429, and no other 4xx). Modelled on kopf's
PermanentError / TemporaryError.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable
from email.utils import parsedate_to_datetime
from urllib.parse import unquote

from shared.redact import scrub_urls


class VmeventsError(Exception):
    """Base of every error that maps to an HTTP answer."""

    status = 500

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class PermanentError(VmeventsError):
    """Retrying the same event cannot help."""

    status = 400


class BadEvent(PermanentError):
    """The request is not a CloudEvent this function understands."""


class TooLarge(PermanentError):
    """A request body above what any event can be (shared.wsgi.MAX_BODY): refused before it is read."""

    status = 413


class TemporaryError(VmeventsError):
    """The same event may succeed on redelivery."""

    status = 503


# A Retry-After beyond this is not a server's hint but a mistake: the broker's own backoff applies instead.
MAX_RETRY_AFTER = 3600.0


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (RFC 9110 §10.2.3: delay-seconds or an HTTP-date), or None
    when absent or unreadable. A date in the past is 0 s; anything is capped at MAX_RETRY_AFTER."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 HTTP-dates are GMT
        return None
    seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def longest_retry_after(errors: Iterable[VmeventsError]) -> float | None:
    """The longest Retry-After among errors, for an error that stands for all of them (a re-scan's)."""
    waits = [error.retry_after for error in errors if error.retry_after is not None]
    return max(waits) if waits else None


def http_answer(error: Exception) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) for an error; anything unexpected is a 500 (the broker retries it)."""
    status = error.status if isinstance(error, VmeventsError) else 500
    message = error.message if isinstance(error, VmeventsError) else f"internal error: {error!r}"
    message = scrub_urls(message)  # a URL is shown by its origin only, whoever wrote the message
    headers = {"Content-Type": "application/json"}
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    return status, headers, json.dumps({"error": message}).encode()


def refused_request(method: str, path: str, query: dict | None, said: str) -> str:
    """The error of a request RBAC refused (403): what it asked, in RBAC's words (`<verb> <resource>[/<sub>] in
    API group "<group>" in namespace "<ns>"`), from our own request rather than the server's message (which a
    proxy or another version may word otherwise), so the operator knows which grant is missing. The verbs
    follow k8s.io/apiserver endpoints/request/requestinfo.go: GET of a collection is list (watch with
    watch=1), DELETE of one is delete and of a collection deletecollection."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    group, rest = ("", parts[2:]) if parts[:1] == ["api"] else (parts[1] if len(parts) > 1 else "", parts[3:])
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":  # a namespaced resource (a namespace itself has 2 parts)
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = (rest + ["", "", ""])[:3]
    collection = not name
    verb = {"GET": "watch" if (query or {}).get("watch") else ("list" if collection else "get"),
            "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "deletecollection" if collection else "delete"}.get(method, method.lower())
    group_words = f'API group "{group}"' if group else "the core API group"
    where = f'in namespace "{namespace}"' if namespace else "at the cluster scope"
    asked = f"{verb} {resource}{f'/{sub}' if sub else ''} in {group_words} {where}"
    return (f"RBAC refused {asked} ({method} {path}): grant it to the function's ServiceAccount (deploy/); "
            f"the server said: {said}")

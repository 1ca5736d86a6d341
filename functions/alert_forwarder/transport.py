"""alert-forwarder's transport: POST one body to one receiver, and say what went wrong without leaking a secret.

What a receiver answers is not ours to repeat: a receiver that echoes the request (many debugging endpoints
do) would put the bearer token into our reply, our log line and the dead-letter sink. So an error names the
receiver by scheme and host only (a webhook URL's path is often the secret itself: Slack's are), gives the
status, and at most a short excerpt of the body with anything token-like redacted. Credentials go to the
configured host only: a redirect to another host is followed without the Authorization header and without
the custom headers of WEBHOOK_HEADERS_FILE (requests itself drops only Authorization, sessions.py
`rebuild_auth` / `should_strip_auth`).

A redirect is followed only within the receiver's own origin (scheme, host, port), or to an origin the operator
allowed (REDIRECT_ALLOWED_ORIGINS, exact origins): a receiver, or whoever answers in its name, can otherwise point
our POST, with the finding in it, at anything the pod can reach: the API server, a cluster Service, the cloud's
link-local metadata endpoint (169.254.169.254). Such a redirect is a refusal (502) that names the origin.
"""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import orjson

from functions.alert_forwarder import wording
from functions.alert_forwarder.settings import redact
from shared.errors import TemporaryError, VmeventsError, parse_retry_after
from shared.redact import REDACTED, scrub, url_secrets

if TYPE_CHECKING:  # requests (and urllib3, charset_normalizer: ~6 MiB) is imported on the first post
    import requests

# Only the redirects that keep the method and the body (RFC 9110 §15.4.8-9): a 301/302/303 turns a POST
# into a GET, which would "deliver" the alert to nobody with a 200.
FOLLOWED_REDIRECTS = (307, 308)
MAX_REDIRECTS = 3
EXCERPT = 80  # characters of a receiver's error body, at most, after redaction


class ReceiverRefused(VmeventsError):
    """The receiver answered, but not with success: its status is in the message (the broker retries,
    then dead-letters the finding)."""

    status = 502


_session: requests.Session | None = None  # one connection pool per process, made on the first post
_making = threading.Lock()


def session() -> requests.Session:
    """The process's requests session: requests is imported, and the session made, by the first post (a dropped
    finding, most of what alert-forwarder receives, never posts)."""
    global _session
    with _making:
        if _session is None:
            import requests

            _session = requests.Session()
        return _session


def post(name: str, url: str, body: Any, headers: Mapping[str, str], verify: bool | str, timeout: float, *,
         credentials: Collection[str] = (), allowed: Collection[str] = ()) -> list[VmeventsError]:
    """[] on success, else [the error]: 503 for down or throttling, 502 for a refusal. `body`: JSON values, or
    the JSON already encoded (a tick's chunk). `credentials` names the headers that must not leave `url`'s host;
    `allowed`, the origins besides `url`'s that a redirect may lead to (`scheme://host[:port]`)."""
    # What an echoing receiver could quote back: our header values, and every part of the URL (a webhook
    # URL is a credential: shared/redact.py).
    secrets = [part for value in headers.values() for part in (value, value.partition(" ")[2]) if part]
    secrets += url_secrets(url)
    sent = {"Content-Type": "application/json", **headers}
    data = body if isinstance(body, bytes) else encoded(body)
    client = session()
    import requests  # imported by session()

    try:
        response = client.post(url, data=data, headers=sent, verify=verify, timeout=timeout,
                               allow_redirects=False)
        for _ in range(MAX_REDIRECTS):
            if response.status_code not in FOLLOWED_REDIRECTS or not response.headers.get("Location"):
                break
            following = urljoin(response.url or url, response.headers["Location"])
            secrets += url_secrets(following)  # a redirect names a URL that may be as secret as ours
            if _origin(following) != _origin(url) and _origin(following) not in {_origin(o) for o in allowed}:
                return [ReceiverRefused(wording.redirected(name, redact(url), response.status_code,
                                                           redact(following)))]
            if _origin(following) != _origin(url):
                sent = {key: value for key, value in sent.items()
                        if key.lower() != "authorization" and key not in credentials}
            response = client.post(following, data=data, headers=sent, verify=verify, timeout=timeout,
                                   allow_redirects=False)
    except requests.RequestException as exc:
        return [TemporaryError(wording.unreachable(name, redact(url), type(exc).__name__))]
    if 200 <= response.status_code < 300:
        return []
    said = excerpt(response.text, secrets)
    if response.status_code >= 500 or response.status_code in (408, 429):
        return [TemporaryError(wording.answered(name, redact(url), response.status_code, said),
                               retry_after=parse_retry_after(response.headers.get("Retry-After")))]
    return [ReceiverRefused(wording.refused(name, redact(url), response.status_code, said))]


def encoded(body: Any) -> bytes:
    """JSON: orjson's, or json's for what orjson refuses (nesting deeper than 254, as a reply's data may carry into
    the webhook payload; a key that is not a string), as requests' own `json=` did."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, default=str).encode()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return parts.scheme, (parts.hostname or "").lower(), port


_TOKENISH = re.compile(r"(?i)\b(?:bearer|basic|token)\s+\S+|[A-Za-z0-9_\-+/=.]{24,}|https?://\S+")


def excerpt(text: str, secrets: Collection[str] = ()) -> str:
    """': <at most EXCERPT characters of the body>', with what we sent and anything token-like redacted, or ''."""
    text = scrub(" ".join((text or "")[:4096].split()), secrets)
    text = _TOKENISH.sub(REDACTED, text)
    if not text:
        return ""
    return f": {text if len(text) <= EXCERPT else text[:EXCERPT - 1] + '…'}"

"""How a URL or a credential may be shown: a URL by its origin only, and never a part of a secret.

A webhook URL is a credential: a Slack incoming-webhook URL carries its secret in the path, other services put
a token in the query, and any URL may carry `user:password@`. Alertmanager itself treats `url` as a secret
(its `SecretURL` marshals to `<secret>`, config/config.go). So wherever a URL could reach a reply, a log line,
an Event, a dead-letter record or an error message, it is shown as `scheme://host[:port]`, and a text that
might quote it (a receiver's error body that echoes the request, a redirect's Location) is scrubbed of every
part of it before it is shown.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus, urlsplit

REDACTED = "[redacted]"
# Shorter parts are not scrubbed from a text: "a" or "v1" would blank out unrelated words. A secret is longer.
MIN_SECRET = 4
# Anything that looks like an absolute URL, up to the first character a URL cannot hold unescaped.
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>`]+")


def origin(url: str) -> str:
    """A URL as it may be shown: `scheme://host[:port]`, never user info, path, query or fragment. A text
    without a scheme ("hooks.slack.com/services/...", which parses as a path) is shown up to its first
    `/`, `?` or `#`, without user info."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "http://[not-an-address]/": shown as its scheme only
        return f"{url.partition(':')[0][:20]}://{REDACTED}"
    if not parts.netloc:
        return re.split(r"[/?#]", url, maxsplit=1)[0].rpartition("@")[2][:100]
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # "host:notaport"
        port = ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal: brackets again
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"


def url_secrets(url: str) -> list[str]:
    """Every part of a URL that must not be shown, raw and decoded: the user info and its halves, the path
    and each of its segments, the query and each of its values, the fragment. Longest first, so a scrub
    replaces the whole before a part of it."""
    try:
        parts = urlsplit(url if "://" in url else f"//{url}")
    except ValueError:  # unparseable: the whole of it is the secret
        return [url] if len(url) >= MIN_SECRET else []
    found: set[str] = set()
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    pieces = [userinfo, *userinfo.split(":", 1), parts.path, *parts.path.split("/"), parts.query, parts.fragment]
    for pair in parts.query.split("&"):
        pieces += [pair, pair.partition("=")[2]]
    if parts.netloc and parts.netloc in url:  # the whole rest: path, query and fragment as written
        pieces.append(url.split(parts.netloc, 1)[1])
    for piece in pieces:
        for form in (piece, unquote(piece), unquote_plus(piece)):
            if len(form) >= MIN_SECRET:
                found.add(form)
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret replaced by [redacted] and every URL in it shown by its origin only."""
    text = scrub_urls(text)
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def scrub_urls(text: str) -> str:
    """`text` with every URL in it shown by its origin only (what an error message may say of a URL)."""
    return _URL.sub(lambda found: origin(found.group(0)), text) if "://" in text else text

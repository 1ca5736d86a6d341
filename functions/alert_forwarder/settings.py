"""alert-forwarder's settings: the receivers, their credentials files, MIN_SEVERITY and the alert
lifetimes, read and checked once at start-up so that a typo stops the start and names the variable."""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.redact import origin
from shared.settings import Env, SettingsError

FUNCTION = "alert-forwarder"
SEVERITIES = ("info", "warning", "critical")  # the Prometheus community's usual `severity` values, in rank order
DEFAULT_RUNBOOK_BASE = "https://github.com/vmevents/vmevents/blob/main/README.md"
WEBHOOK_FORMATS = ("json", "slack")


@dataclass(frozen=True)
class Receiver:
    """Where and how to POST: URLs, a file holding credentials, TLS verification."""

    urls: tuple[str, ...]
    credentials_file: str | None = None
    verify: bool | str = True  # requests' `verify`: True, False, or a CA bundle path


@dataclass(frozen=True)
class Settings:
    alertmanager: Receiver | None = None
    webhook: Receiver | None = None
    webhook_format: str = "json"
    min_severity: str = "warning"
    cluster: str = ""
    alert_ttl: timedelta = timedelta(hours=1)
    # Findings that have a `.resolved` (device conflicts, IO-error pauses) are reported once per
    # episode, not repeated: their alert stays firing until the `.resolved` arrives, bounded by this
    # so that a lost `.resolved` cannot keep an alert up forever.
    until_resolved_ttl: timedelta = timedelta(days=7)
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    timeout: float = 5.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        am_urls = _urls(env, "ALERTMANAGER_URL")
        webhook_urls = _urls(env, "WEBHOOK_URL")
        if len(webhook_urls) > 1:
            raise SettingsError("WEBHOOK_URL holds several URLs; give one, like https://hooks.slack.com/services/...")
        # Every setting is read and checked even when its receiver is off: a typo never waits for the day
        # someone sets the URL.
        alertmanager = Receiver(am_urls, _file(env, "ALERTMANAGER_BEARER_TOKEN_FILE", read_token),
                                _verify(env, "ALERTMANAGER"))
        webhook = Receiver(webhook_urls, _file(env, "WEBHOOK_HEADERS_FILE", read_headers), _verify(env, "WEBHOOK"))
        runbook = env.raw("RUNBOOK_BASE_URL", DEFAULT_RUNBOOK_BASE)
        if not _is_http_url(runbook):
            raise SettingsError(f"RUNBOOK_BASE_URL={runbook!r} is not an http(s) URL; use the address of this "
                                f"README, like {DEFAULT_RUNBOOK_BASE}.")
        return cls(alertmanager=alertmanager if am_urls else None, webhook=webhook if webhook_urls else None,
                   webhook_format=env.choice("WEBHOOK_FORMAT", "json", WEBHOOK_FORMATS),
                   min_severity=env.choice("MIN_SEVERITY", "warning", SEVERITIES),
                   cluster=_label_value(env, "CLUSTER_NAME"),
                   alert_ttl=_positive(env.duration("ALERT_TTL", "1h"), "ALERT_TTL", "1h"),
                   until_resolved_ttl=_positive(env.duration("ALERT_TTL_UNTIL_RESOLVED", "7d"),
                                                "ALERT_TTL_UNTIL_RESOLVED", "7d"),
                   runbook_base=runbook,
                   timeout=env.number("SEND_TIMEOUT", 5.0, minimum=0.1, maximum=60))


def _is_http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def redact(url: str) -> str:
    """A URL as it may be shown (in an error, a reply, a log line): `scheme://host[:port]` (shared.redact)."""
    return origin(url)


def _urls(env: Env, name: str) -> tuple[str, ...]:
    urls = tuple(part.strip().rstrip("/") for part in env.raw(name, "").split(",") if part.strip())
    bad = [url for url in urls if not _is_http_url(url)]
    if bad:  # scheme and host only: a webhook URL's path and query are often its secret
        raise SettingsError(f"{name}={redact(bad[0])!r} is not an http(s) URL (shown: its scheme and host only); "
                            f"use a value like http://alertmanager.monitoring.svc:9093.")
    return urls


def _file(env: Env, name: str, check: Callable[[str], Any]) -> str | None:
    path = env.raw(name, "")
    if not path:
        return None
    try:
        check(path)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{name}={path!r} cannot be used: {exc}. Mount the Secret there, "
                            f"or leave {name} empty.") from exc
    return path


def _verify(env: Env, prefix: str) -> bool | str:
    if env.boolean(f"{prefix}_INSECURE_SKIP_VERIFY", False):
        return False
    return _file(env, f"{prefix}_CA_FILE", _a_file) or True


def _a_file(path: str) -> None:
    if not Path(path).is_file():
        raise ValueError("it is not a file (mount the CA bundle there)")


def _label_value(env: Env, name: str) -> str:
    value = env.raw(name, "")
    if len(value) > 253:
        raise SettingsError(f"{name} is {len(value)} characters long; use a short cluster name like harvester-prod.")
    return value


def _positive(value: timedelta, name: str, example: str) -> timedelta:
    if value <= timedelta(0):
        raise SettingsError(f"{name} must be longer than 0s; use a value like {example}.")
    return value


def read_token(path: str) -> str:
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token or "\n" in token:
        raise ValueError("the file must hold exactly one token")
    return token


def read_headers(path: str) -> dict[str, str]:
    """`Name: value` per line (blank lines and lines starting with # are ignored)."""
    headers = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        if not colon or not re.fullmatch(r"[A-Za-z0-9-]+", name.strip()):
            raise ValueError(f"line {number} is not `Name: value`")
        headers[name.strip()] = value.strip()
    return headers


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from this environment; a bad value raises SettingsError naming the variable."""
    return Settings.from_env(environ)

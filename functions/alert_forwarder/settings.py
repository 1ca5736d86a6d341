"""alert-forwarder's settings: the receivers, their credentials files, MIN_SEVERITY and the alert
lifetimes, read and checked once at start-up so that a typo stops the start and names the variable."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from functions.alert_forwarder.declaration import (
    ALERT_CLOCK_SKEW,
    ALERT_RESOLVED_FOR,
    ALERT_TTL,
    ALERT_VALID_FOR,
    DECLARATION,
    MIN_SEVERITY,
    RUNBOOK_BASE_URL,
    SEND_TIMEOUT,
    WEBHOOK_FORMAT,
)
from shared.redact import origin
from shared.settings import Env, SettingsError, checked

FUNCTION = DECLARATION.name
DEFAULT_RUNBOOK_BASE = RUNBOOK_BASE_URL.default


@dataclass(frozen=True)
class Receiver:
    """Where and how to POST: URLs, a file holding credentials, TLS verification."""

    urls: tuple[str, ...]
    credentials_file: str | None = None
    verify: bool | str = True  # requests' `verify`: True, False, or a CA bundle path


@dataclass(frozen=True)
class Target:
    """One place a notice goes: an Alertmanager replica, or the webhook. `id` names it in the receipts kept on a
    finding's Event (receipts.py): its kind and a digest of its URL, never the URL (a webhook URL is a secret)."""

    id: str
    kind: str  # ALERTMANAGER | WEBHOOK
    url: str


ALERTMANAGER, WEBHOOK = "alertmanager", "webhook"


def target(kind: str, url: str) -> Target:
    return Target(f"{kind}-{hashlib.sha256(url.encode()).hexdigest()[:10]}", kind, url)


@dataclass(frozen=True)
class Settings:
    alertmanager: Receiver | None = None
    webhook: Receiver | None = None
    webhook_format: str = WEBHOOK_FORMAT.value
    min_severity: str = MIN_SEVERITY.value
    cluster: str = ""
    alert_ttl: timedelta = ALERT_TTL.value
    # A finding with an episode is kept alive as Prometheus keeps its alerts (docs/alert-forwarder.md): each
    # post of its firing alert ends `valid_for` later (Prometheus: 4 × max(evaluation interval, resend delay
    # 1m), rules/alerting.go sendAlerts), and every tick re-posts it from the finding's record; a resolved
    # one is re-posted for `resolved_for` (Prometheus' resolvedRetention, 15m) with its end `clock_skew` in
    # the past, so that an Alertmanager whose clock is behind ours still sees it ended.
    valid_for: timedelta = ALERT_VALID_FOR.value
    resolved_for: timedelta = ALERT_RESOLVED_FOR.value
    clock_skew: timedelta = ALERT_CLOCK_SKEW.value
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    timeout: float = SEND_TIMEOUT.value
    # Origins besides a receiver's own that a 307/308 may lead to (transport.py): none by default.
    redirect_origins: tuple[str, ...] = ()

    @property
    def targets(self) -> tuple[Target, ...]:
        """Every place a notice goes, Alertmanager's replicas first."""
        found = [target(ALERTMANAGER, url) for url in (self.alertmanager.urls if self.alertmanager else ())]
        return (*found, *(target(WEBHOOK, url) for url in (self.webhook.urls if self.webhook else ())))

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
        runbook = RUNBOOK_BASE_URL.read(environ)
        if not _is_http_url(runbook):
            raise SettingsError(f"RUNBOOK_BASE_URL={runbook!r} is not an http(s) URL; use the address of this "
                                f"README, like {DEFAULT_RUNBOOK_BASE}.")
        return cls(alertmanager=alertmanager if am_urls else None, webhook=webhook if webhook_urls else None,
                   webhook_format=WEBHOOK_FORMAT.read(environ),
                   min_severity=MIN_SEVERITY.read(environ),
                   cluster=_label_value(env, "CLUSTER_NAME"),
                   alert_ttl=_positive(ALERT_TTL.read(environ), ALERT_TTL.name, ALERT_TTL.default),
                   valid_for=_longer_than_a_tick(ALERT_VALID_FOR.read(environ), ALERT_VALID_FOR.name,
                                                 ALERT_VALID_FOR.default),
                   resolved_for=_longer_than_a_tick(ALERT_RESOLVED_FOR.read(environ), ALERT_RESOLVED_FOR.name,
                                                    ALERT_RESOLVED_FOR.default),
                   clock_skew=_at_most(ALERT_CLOCK_SKEW.read(environ), ALERT_CLOCK_SKEW.name,
                                       timedelta(minutes=10), ALERT_CLOCK_SKEW.default),
                   runbook_base=runbook,
                   timeout=SEND_TIMEOUT.read(environ),
                   redirect_origins=_origins(env, "REDIRECT_ALLOWED_ORIGINS"))


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


def _origins(env: Env, name: str) -> tuple[str, ...]:
    """Comma-separated origins, each `http(s)://host[:port]` and nothing more (no path, no user info)."""
    found = []
    for item in (part.strip() for part in env.raw(name, "").split(",")):
        if not item:
            continue
        parts = urlsplit(item)
        try:
            parts.port  # noqa: B018 - a bad port raises here, and is named below
        except ValueError:
            parts = parts._replace(scheme="")
        if (parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc
                or parts.path not in ("", "/") or parts.query or parts.fragment):
            raise SettingsError(f"{name} holds {redact(item)!r}, which is not an origin; give origins separated "
                                f"by commas, like https://hooks.example.com,https://am.example.com:9093")
        found.append(item.rstrip("/"))
    return tuple(found)


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


TICK = timedelta(minutes=1)  # the PingSource's period (deploy/base/sources.yaml: every minute)


def _longer_than_a_tick(value: timedelta, name: str, example: str) -> timedelta:
    """A lifetime renewed on every tick must outlast a tick (Prometheus allows for two failed sends in four)."""
    if value <= TICK:
        raise SettingsError(f"{name} must be longer than the PingSource's period (1m), or an alert ends between "
                            f"two ticks; use a value like {example}.")
    return value


def _at_most(value: timedelta, name: str, limit: timedelta, example: str) -> timedelta:
    if not timedelta(0) <= value <= limit:
        raise SettingsError(f"{name} must be from 0s to {int(limit.total_seconds() // 60)}m; use a value like "
                            f"{example}.")
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
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    return Settings.from_env(environ)

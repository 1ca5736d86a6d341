"""alert-forwarder: deliver the other functions' findings to Alertmanager and webhooks, where
operators already look.

Reads top to bottom: settings → parse (which finding a reply event carries; no I/O) → decide (pure:
the alerts, or a drop with its reason) → act (POST to every configured receiver) → report (the
log line). Alertmanager does grouping, silencing, inhibition and routing; this function only turns
a finding into an alert with stable labels, so a repeat keeps the same alert alive and a
`.resolved` finding ends it. It needs no Kubernetes API access at all.

A receiver that is down or throttling answers 503, one that refuses the alert 502: the broker
retries and, after its retries, dead-letters the finding, so none is lost silently.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from shared.errors import BadEvent, TemporaryError, VmeventsError
from shared.intake import Incoming
from shared.runtime import Context, Outcome
from shared.settings import Env, SettingsError

FUNCTION = "alert-forwarder"
PREFIX = "io.vmevents."
SEVERITIES = ("info", "warning", "critical")  # the Prometheus community's usual `severity` values, in rank order
_SEVERITY_ALIASES = {"informational": "info", "notice": "info", "warn": "warning", "error": "critical",
                     "high": "critical", "page": "critical"}
DEFAULT_RUNBOOK_BASE = "https://github.com/vmevents/vmevents/blob/main/README.md"
WEBHOOK_FORMATS = ("json", "slack")
MAX_TEXT = 2900  # a Slack section's text is limited to 3000 characters


# -- settings -------------------------------------------------------------------------------------
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


def _urls(env: Env, name: str) -> tuple[str, ...]:
    urls = tuple(part.strip().rstrip("/") for part in env.raw(name, "").split(",") if part.strip())
    bad = [url for url in urls if not _is_http_url(url)]
    if bad:
        raise SettingsError(f"{name}={bad[0]!r} is not an http(s) URL; use a value like "
                            f"http://alertmanager.monitoring.svc:9093.")
    return urls


def _file(env: Env, name: str, check: Callable[[str], Any]) -> str | None:
    path = env.raw(name, "")
    if not path:
        return None
    try:
        check(path)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{name}={path!r} cannot be used: {exc}. Mount the Secret there, or leave {name} empty.")
    return path


def _verify(env: Env, prefix: str) -> bool | str:
    if env.boolean(f"{prefix}_INSECURE_SKIP_VERIFY", False):
        return False
    ca = env.raw(f"{prefix}_CA_FILE", "")
    if ca and not os.path.isfile(ca):
        raise SettingsError(f"{prefix}_CA_FILE={ca!r} is not a file; mount the CA bundle there, or leave it empty.")
    return ca or True


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


# -- the table: which finding becomes which alert --------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """One finding, as a reply event carries it: the event's type and subject, and its data."""

    type: str
    subject: str | None
    data: Mapping[str, Any]

    def text(self, *keys: str) -> str | None:
        """The first of these data fields that is a non-empty string."""
        for key in keys:
            value = self.data.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None


@dataclass(frozen=True)
class Rule:
    """How one finding type becomes an alert. `labels` gives the identity labels besides alertname,
    severity and cluster: the same finding again gives the same labels, so Alertmanager keeps one
    alert alive instead of adding another."""

    alertname: str
    severity: str                                   # used when the finding carries none
    labels: Callable[[Finding], dict[str, str]]
    summary: Callable[[Finding], str]
    description: Callable[[Finding], str]
    runbook: str                                    # the README anchor
    resolves: bool = False                          # a `.resolved` finding ends the alert


def _split(ref: Any) -> tuple[str, str]:
    """"ns/name" → (ns, name); a bare name has no namespace."""
    if isinstance(ref, Mapping):  # {"namespace": ..., "name": ...} or {"vm": "ns/name"}
        if isinstance(ref.get("vm"), str):
            return _split(ref["vm"])
        return str(ref.get("namespace") or ""), str(ref.get("name") or "")
    text = str(ref or "")
    namespace, _, name = text.rpartition("/")
    return namespace, name


def _subject(finding: Finding) -> tuple[str, str]:
    """(namespace, name) from the event's subject, an API path like
    /apis/kubevirt.io/v1/namespaces/<ns>/<plural>/<name>."""
    parts = (finding.subject or "").strip("/").split("/")
    if "namespaces" in parts:
        at = parts.index("namespaces")
        rest = parts[at + 1:]
        return (rest[0] if rest else ""), (rest[2] if len(rest) > 2 else "")
    return "", ""


def _vm_labels(ref: Any, finding: Finding) -> dict[str, str]:
    namespace, name = _split(ref) if ref else _subject(finding)
    if not namespace:
        namespace = _subject(finding)[0]
    return {"namespace": namespace, "vm": name}


def _names(items: Any) -> list[str]:
    return ["/".join(part for part in _split(item) if part) for item in items or () if item]


def _advice(finding: Finding) -> str:
    advice = finding.data.get("advice")
    if isinstance(advice, str):
        return advice
    if isinstance(advice, list):
        return "\n".join(f"- {_step(item)}" for item in advice if item)
    return ""


def _step(item: Any) -> str:
    """One piece of advice: a sentence, or {action, why[, yaml]} as migration-report writes it."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        said = item.get("text") or ": ".join(str(item[k]) for k in ("action", "why") if item.get(k))
        if said:
            return str(said)
    return json.dumps(item, sort_keys=True, default=str)


def _paragraphs(*parts: str | None) -> str:
    return "\n\n".join(part for part in parts if part)


# device-conflict: {kind, device, resourceName, node, holder, blocked[], severity}
def _device_labels(f: Finding) -> dict[str, str]:
    blocked = _names(f.data.get("blocked"))
    return {**_vm_labels(f.data.get("holder") or (blocked[0] if blocked else None), f),
            "device": str(f.data.get("device") or ""), "conflict": str(f.data.get("kind") or "")}


def _device_summary(f: Finding) -> str:
    given = f.text("message", "summary")
    if given:
        return given
    device, resource, node = f.data.get("device"), f.data.get("resourceName"), f.data.get("node") or "its node"
    holder, blocked = f.data.get("holder"), ", ".join(_names(f.data.get("blocked"))) or "another VM"
    kind = f.data.get("kind")
    if kind == "start-blocked":
        return f"VM {blocked} cannot start: {holder} holds {device} ({resource}) on {node}."
    if kind == "double-assigned":
        return f"VMs {', '.join(filter(None, [holder, blocked]))} all name {device} ({resource}); only one can run."
    if holder:
        return f"{holder} holds {device} ({resource}) on {node}; {blocked} names it too and cannot start while it runs."
    return f"Host device {device} ({resource}) is in conflict ({kind})."


def _device_description(f: Finding) -> str:
    return _paragraphs(_advice(f), f"Holder: {f.data.get('holder') or '—'}; blocked: "
                                   f"{', '.join(_names(f.data.get('blocked'))) or '—'}; node: {f.data.get('node') or '—'}; "
                                   f"resource: {f.data.get('resourceName') or '—'}.")


# migration-report: a structured report with at least vmi "ns/name", class and a summary sentence
def _migration_labels(f: Finding) -> dict[str, str]:
    migration = f.data.get("migration") or f.data.get("vmim") or f.data.get("name")
    if isinstance(migration, Mapping):
        migration = migration.get("name")
    return {**_vm_labels(f.data.get("vmi") or f.data.get("vm"), f),
            "migration": _split(migration)[1] if migration else _subject(f)[1]}


def _migration_summary(f: Finding) -> str:
    what = "failed" if f.type.endswith(".failed") else "succeeded close to its timeout"
    return f.text("summary", "message") or f"Migration of VMI {f.data.get('vmi')} {what} ({f.data.get('class')})."


def _migration_description(f: Finding) -> str:
    return _paragraphs(f"Class: {f.data.get('class') or 'unknown'}.", _advice(f))


# io-pause-report: {vmi, volumes[{pvc, pv, longhornVolume, robustness, rebuilding, progress}], class, pauses, advice}
def _volumes(f: Finding) -> list[Mapping[str, Any]]:
    return [v for v in f.data.get("volumes") or () if isinstance(v, Mapping)]


def _io_labels(f: Finding) -> dict[str, str]:
    names = sorted({str(v.get("pvc") or v.get("longhornVolume") or v.get("name")) for v in _volumes(f)
                    if v.get("pvc") or v.get("longhornVolume") or v.get("name")})
    return {**_vm_labels(f.data.get("vmi") or f.data.get("vm"), f), "volume": ",".join(names)}


def _io_summary(f: Finding) -> str:
    if f.type.endswith(".resolved"):
        return f.text("summary", "message") or f"VM {f.data.get('vmi')} no longer pauses on IO errors."
    pauses = f.data.get("pauses")
    times = f" {pauses} time(s)" if isinstance(pauses, int) else ""
    return (f.text("summary", "message")
            or f"VM {f.data.get('vmi')} paused{times} on IO errors ({f.data.get('class') or 'unknown'}).")


def _io_description(f: Finding) -> str:
    volumes = "; ".join(
        f"{v.get('pvc') or v.get('name')} → Longhorn volume {v.get('longhornVolume') or '—'} "
        f"(robustness {v.get('robustness') or '?'}"
        + (f", rebuilding {v.get('progress')}%" if v.get("rebuilding") else "") + ")"
        for v in _volumes(f))
    return _paragraphs(f"Class: {f.data.get('class') or 'unknown'}.", volumes and f"Volumes: {volumes}.", _advice(f))


# vmi-cleanup: {vmi, vm, action, reason, previousRunStrategy, dryRun} (informational)
def _cleanup_labels(f: Finding) -> dict[str, str]:
    return _vm_labels(f.data.get("vm") or f.data.get("vmi"), f)


def _cleanup_summary(f: Finding) -> str:
    return f"vmi-cleanup {f.data.get('action')} for VMI {f.data.get('vmi')}: {f.data.get('reason')}"


def _cleanup_description(f: Finding) -> str:
    return (f"Previous run strategy: {f.data.get('previousRunStrategy') or '—'}; "
            f"dry run: {'yes' if f.data.get('dryRun') else 'no'}.")


_DEVICE = dict(labels=_device_labels, summary=_device_summary, description=_device_description,
               runbook="vmhostdeviceconflict")
_IO = dict(labels=_io_labels, summary=_io_summary, description=_io_description, runbook="vmpausedonioerror")
_CLEANUP = dict(labels=_cleanup_labels, summary=_cleanup_summary, description=_cleanup_description,
                runbook="vmicleanedup")

TABLE: dict[str, Rule] = {
    "io.vmevents.device-conflict.detected": Rule("VMHostDeviceConflict", "warning", **_DEVICE),
    "io.vmevents.device-conflict.resolved": Rule("VMHostDeviceConflict", "warning", **_DEVICE, resolves=True),
    "io.vmevents.migration-report.failed": Rule("VMMigrationFailed", "warning", _migration_labels,
                                                _migration_summary, _migration_description, "vmmigrationfailed"),
    "io.vmevents.migration-report.near-timeout": Rule("VMMigrationNearTimeout", "warning", _migration_labels,
                                                      _migration_summary, _migration_description,
                                                      "vmmigrationneartimeout"),
    "io.vmevents.io-pause-report.detected": Rule("VMPausedOnIOError", "critical", **_IO),
    "io.vmevents.io-pause-report.resolved": Rule("VMPausedOnIOError", "critical", **_IO, resolves=True),
    "io.vmevents.vmi-cleanup.cleaned": Rule("VMICleanedUp", "info", **_CLEANUP),
}
# A re-scan's summary (`<function>.scanned`) or a batch (`<function>.batch`, several changes in one
# answer) carries findings: one alert each. vmi-cleanup lists them under `cleaned`; migration-report
# and io-pause-report under `reported` / `findings`, each item with its own `type`; device-conflict's
# batch under `detected` and `resolved` (the type is `<function>.detected` / `.resolved`).
COLLECTIONS = (".scanned", ".batch")
EXPANDS = {"cleaned": "io.vmevents.vmi-cleanup.cleaned", "reported": None, "findings": None,
           "detected": ".detected", "resolved": ".resolved"}


def generic_rule(event_type: str) -> Rule:
    """Any other io.vmevents.<function>.<what>: forwarded, so a new finding reaches operators
    before this table knows it. `<what>.resolved` ends the alert of `<what>.detected`."""
    function, _, what = event_type[len(PREFIX):].partition(".")
    resolves = what == "resolved"
    camel = "".join(word.capitalize() for word in re.split(r"[^A-Za-z0-9]+", f"{function} {'detected' if resolves else what}") if word)

    def labels(f: Finding) -> dict[str, str]:
        return _vm_labels(f.data.get("vm") or f.data.get("vmi"), f)

    def summary(f: Finding) -> str:
        return f.text("summary", "message") or f"{f.type} about {f.subject or 'the cluster'}."

    def description(f: Finding) -> str:
        return _clip(json.dumps(dict(f.data), sort_keys=True, default=str), 1000)

    return Rule(f"Vmevents{camel}", "warning", labels, summary, description, "other-findings", resolves)


# -- parse ----------------------------------------------------------------------------------------
def findings(event: Incoming) -> list[Finding]:
    """The findings a reply event carries (no I/O). Raises BadEvent for what is not a finding."""
    if not event.type.startswith(PREFIX):
        raise BadEvent(f"unsupported event type {event.type}; alert-forwarder handles the io.vmevents.* "
                       f"replies of the other functions")
    if not isinstance(event.data, Mapping):
        raise BadEvent(f"event {event.id} ({event.type}) has no JSON object as data; a finding's data is "
                       f"a JSON object")
    if not event.type.endswith(COLLECTIONS):
        return [Finding(event.type, event.subject, event.data)]
    family, found = event.type.rsplit(".", 1)[0], []
    for key, item_type in EXPANDS.items():
        items = event.data.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
            raise BadEvent(f"event {event.id} ({event.type}): data.{key} must be a list of objects")
        for item in items:
            kind = item.get("type") if item_type is None else (family + item_type if item_type[0] == "." else item_type)
            if not isinstance(kind, str) or not kind.startswith(PREFIX) or kind.endswith(COLLECTIONS):
                raise BadEvent(f"event {event.id} ({event.type}): an item of data.{key} has no io.vmevents.* type")
            found.append(Finding(kind, item.get("subject") or event.subject,
                                 {k: v for k, v in item.items() if k not in ("type", "subject", "id")}))
    return found


# -- decide (pure) --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    resolved: bool

    def postable(self) -> dict:
        """Alertmanager API v2 PostableAlert."""
        return {"labels": self.labels, "annotations": self.annotations,
                "startsAt": _rfc3339(self.starts_at), "endsAt": _rfc3339(self.ends_at)}

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.labels, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Decision:
    action: str                # "forward" or "drop"
    reason: str
    alerts: tuple[Alert, ...] = field(default=())


def severity_of(finding: Finding, rule: Rule) -> str:
    given = str(finding.data.get("severity") or "").strip().lower()
    given = _SEVERITY_ALIASES.get(given, given)
    return given if given in SEVERITIES else rule.severity


def rule_for(event_type: str) -> Rule:
    return TABLE.get(event_type) or generic_rule(event_type)


def resolved_later(event_type: str) -> bool:
    """A `.detected` finding whose function also sends `.resolved`: it is not repeated while it lasts."""
    return event_type.endswith(".detected") and TABLE.get(event_type[:-len("detected")] + "resolved") is not None


def to_alert(finding: Finding, settings: Settings, now: datetime) -> tuple[Alert, str]:
    """The alert for one finding and its severity. A firing alert lasts ALERT_TTL unless repeated
    (Alertmanager keeps the earliest startsAt and the latest endsAt of the same labels); a resolved
    one ends now."""
    rule = rule_for(finding.type)
    severity = severity_of(finding, rule)
    labels = {"alertname": rule.alertname, "severity": severity,
              **{k: v for k, v in rule.labels(finding).items() if v}}
    if settings.cluster:
        labels["cluster"] = settings.cluster
    annotations = {"summary": _clip(rule.summary(finding), 1000), "description": _clip(rule.description(finding), 4000),
                   "runbook_url": f"{settings.runbook_base}#{rule.runbook}"}
    ends = now if rule.resolves else now + (settings.until_resolved_ttl if resolved_later(finding.type)
                                            else settings.alert_ttl)
    return Alert(labels, annotations, now, ends, rule.resolves), severity


def decide(event_type: str, found: list[Finding], settings: Settings, now: datetime) -> Decision:
    """Which alerts to send for these findings. Pure: every fact is an argument."""
    if event_type.startswith(f"{PREFIX}{FUNCTION}."):
        return Decision("drop", "alert-forwarder's own event (never forwarded: no loop)")
    floor = SEVERITIES.index(settings.min_severity)
    alerts, below = [], []
    for finding in found:
        alert, severity = to_alert(finding, settings, now)
        (alerts if SEVERITIES.index(severity) >= floor else below).append(alert)
    if not alerts and not below:
        return Decision("drop", "the event carries no finding")
    if not alerts:
        return Decision("drop", f"severity {below[0].labels['severity']}, below MIN_SEVERITY={settings.min_severity}")
    state = "resolved" if all(a.resolved for a in alerts) else "firing"
    names = ", ".join(sorted({f"{a.labels['alertname']} {_about(a.labels)}" for a in alerts}))
    dropped = f" ({len(below)} below MIN_SEVERITY)" if below else ""
    if not settings.alertmanager and not settings.webhook:
        return Decision("drop", f"no receiver configured (set ALERTMANAGER_URL or WEBHOOK_URL) for {state}: {names}")
    return Decision("forward", f"{state}: {names}{dropped}", tuple(alerts))


def _about(labels: Mapping[str, str]) -> str:
    who = "/".join(part for part in (labels.get("namespace"), labels.get("vm")) if part) or "cluster"
    extra = [f"{k}={labels[k]}" for k in ("device", "volume", "migration") if labels.get(k)]
    return who + (f" [{', '.join(extra)}]" if extra else "")


# -- act ------------------------------------------------------------------------------------------
class ReceiverRefused(VmeventsError):
    """The receiver answered, but not with success: its error is in the message (the broker retries,
    then dead-letters the finding)."""

    status = 502


_session = requests.Session()  # one connection pool per process


def on_event(event: Incoming, ctx: Context) -> Outcome:
    decision = decide(event.type, findings(event), ctx.settings, ctx.clock())
    if decision.action == "drop":
        return Outcome("drop", subject=event.subject, reason=decision.reason)
    sent = deliver(decision.alerts, event, ctx.settings)
    return Outcome("forward", effect="+".join(sent), subject=event.subject, reason=decision.reason)


def deliver(alerts: tuple[Alert, ...], event: Incoming, settings: Settings) -> list[str]:
    """POST to every receiver; every one is tried even if another failed, and any failure makes the
    whole event fail so the broker redelivers it (Alertmanager merges a repeat into the same alert)."""
    sent, failures = [], []
    if settings.alertmanager:
        am = settings.alertmanager
        token = read_token(am.credentials_file) if am.credentials_file else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = [alert.postable() for alert in alerts]
        for url in am.urls:  # every replica: Alertmanager replicas do not share alerts
            failures += _post("Alertmanager", f"{url}/api/v2/alerts", body, headers, am.verify, settings.timeout)
        sent.append("alertmanager")
    if settings.webhook:
        hook = settings.webhook
        headers = read_headers(hook.credentials_file) if hook.credentials_file else {}
        for alert in alerts:
            payload = (slack_message if settings.webhook_format == "slack" else webhook_payload)(alert, event, settings)
            failures += _post("the webhook", hook.urls[0], payload, {"X-Vmevents-Alert": alert.fingerprint, **headers},
                              hook.verify, settings.timeout)
        sent.append(f"webhook-{settings.webhook_format}")
    if failures:
        temporary = [f for f in failures if isinstance(f, TemporaryError)]
        message = "; ".join(f.message for f in failures)
        if temporary:
            raise TemporaryError(message, retry_after=max((f.retry_after or 0 for f in temporary), default=0) or None)
        raise ReceiverRefused(message)
    return sent


def _post(name: str, url: str, body: Any, headers: Mapping[str, str], verify: bool | str,
          timeout: float) -> list[VmeventsError]:
    """[] on success, else [the error]: 503 for down or throttling, 502 for a refusal."""
    try:
        response = _session.post(url, json=body, headers=dict(headers), verify=verify, timeout=timeout)
    except requests.RequestException as exc:
        return [TemporaryError(f"{name} at {_redact(url)} is unreachable ({type(exc).__name__}); "
                               f"the broker will redeliver")]
    if 200 <= response.status_code < 300:
        return []
    said = _clip(response.text.strip().replace("\n", " "), 300)
    if response.status_code >= 500 or response.status_code in (408, 429):
        retry_after = response.headers.get("Retry-After", "")
        return [TemporaryError(f"{name} at {_redact(url)} answered {response.status_code} {said}; "
                               f"the broker will redeliver",
                               retry_after=float(retry_after) if retry_after.isdigit() else None)]
    hint = " (check its credentials file)" if response.status_code in (401, 403) else ""
    return [ReceiverRefused(f"{name} at {_redact(url)} refused the alert: {response.status_code} {said}{hint}")]


def _redact(url: str) -> str:
    """A webhook URL is often a secret itself (Slack's are): show its host only."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


# -- the webhook formats --------------------------------------------------------------------------
def webhook_payload(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """Alertmanager's own webhook payload (version 4) with one alert, so receivers written for
    Alertmanager read it unchanged, plus `finding`: the event it came from."""
    status = "resolved" if alert.resolved else "firing"
    return {"version": "4", "groupKey": f"vmevents/{alert.fingerprint}", "truncatedAlerts": 0, "status": status,
            "receiver": FUNCTION, "groupLabels": {"alertname": alert.labels["alertname"]},
            "commonLabels": alert.labels, "commonAnnotations": alert.annotations, "externalURL": "",
            "alerts": [{"status": status, **alert.postable(), "generatorURL": "", "fingerprint": alert.fingerprint}],
            "finding": {"id": event.id, "type": event.type, "source": event.source, "subject": event.subject,
                        "data": event.data}}


def slack_message(alert: Alert, event: Incoming, settings: Settings) -> dict:
    """A Slack incoming-webhook message: a headline, the summary, the description and the runbook."""
    labels, notes = alert.labels, alert.annotations
    if alert.resolved:
        headline = f":white_check_mark: *RESOLVED: {labels['alertname']}* {_about(labels)}"
    else:
        icon = {"critical": ":red_circle:", "warning": ":warning:"}.get(labels["severity"], ":information_source:")
        headline = f"{icon} *{labels['severity'].upper()}: {labels['alertname']}* {_about(labels)}"
    if labels.get("cluster"):
        headline += f" on cluster {labels['cluster']}"
    body = _paragraphs(_escape(headline), _escape(notes["summary"]),
                       "\n".join(f"> {line}" if line else ">" for line in _escape(notes["description"]).splitlines()),
                       f"<{notes['runbook_url']}|Runbook>")
    context = " · ".join(f"{k}={_escape(v)}" for k, v in sorted(labels.items()))
    return {"text": _escape(f"{headline.replace('*', '')}: {notes['summary']}"),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": _clip(body, MAX_TEXT)}},
                       {"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(context, MAX_TEXT)}]}]}


def _escape(text: str) -> str:
    """Slack mrkdwn: &, < and > are control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")

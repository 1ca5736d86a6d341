"""`vmevents explain <namespace>/<vm>`: what every function would decide about one VM now, and why; the findings on
record about it; and the Events vmevents wrote about it. Read-only: every request is a GET (a write is refused
before it is sent), with the operator's kubeconfig.

Each function's answer comes from its own code: its reads and its pure `decide` on fresh objects (the same
`explain` entry its handler's flow uses before it acts), with the settings its Knative Service runs with (read from
the cluster; the function's defaults when that cannot be read, and the answer says so).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.kinds import EVENT, VMIM
from shared.kube import Kube
from shared.ledger import record_of
from shared.recorder import Recorder
from shared.runtime import KubeContext

FUNCTIONS = ("vmi-cleanup", "device-conflict", "io-pause-report", "migration-report", "vm-stuck-report",
             "evacuation-report", "alert-forwarder")
KSVC_PATH = "/apis/serving.knative.dev/v1/namespaces/{namespace}/services/{name}"


class WriteRefused(RuntimeError):
    """explain tried to change the cluster: a bug, never sent."""


class ReadOnlyKube(Kube):
    """A Kube that sends GETs only: anything else is refused before it leaves the process."""

    def _send(self, method: str, path: str, *args: Any, **kwargs: Any) -> bytes:
        if method != "GET":
            raise WriteRefused(f"vmevents explain is read-only: refused {method} {path}")
        return super()._send(method, path, *args, **kwargs)


def read_only(kube: Kube) -> ReadOnlyKube:
    return ReadOnlyKube(kube._api, connect=kube._connect, page_size=kube.page_size)


@dataclass
class Answer:
    """One function's answer about the VM: its verdict and reason (what it would do now and why), and more lines."""

    function: str
    verdict: str
    reason: str
    lines: list[str] = field(default_factory=list)
    settings: str = "cluster"   # where its settings came from: "cluster" (its Knative Service) or "defaults"


@dataclass
class Explanation:
    vm: str
    now: str
    answers: list[Answer]
    findings: list[dict[str, Any]]
    events: list[dict[str, Any]]


# -- settings: those the Knative Service runs with --------------------------------------------------
def service_env(kube: Kube, namespace: str, function: str) -> dict[str, str] | None:
    """The literal env of the function's Knative Service's container; None when it cannot be read (no such
    Service, no Knative, no permission)."""
    try:
        service = kube.request("GET", KSVC_PATH.format(namespace=namespace, name=function))
    except Exception:  # noqa: BLE001 - any reason it cannot be read: the defaults, said so
        return None
    containers = (((service.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    env = containers[0].get("env") if containers and isinstance(containers[0], dict) else None
    return {str(e["name"]): str(e.get("value", "")) for e in env or () if isinstance(e, dict) and "name" in e
            and "valueFrom" not in e}


def settings_of(kube: Kube, namespace: str, function: str, overrides: Mapping[str, Mapping[str, str]]
                ) -> tuple[Any, str]:
    from cli import registry

    env = overrides.get(function)
    where = "given"
    if env is None:
        env = service_env(kube, namespace, function)
        where = "cluster" if env is not None else "defaults"
    return registry.settings_loader(function)(env or {}), where


# -- the answers --------------------------------------------------------------------------------------
def explain(kube: Kube, namespace: str, name: str, *, functions_namespace: str = "vmevents",
            now: datetime | None = None, overrides: Mapping[str, Mapping[str, str]] | None = None,
            clock: Callable[[], datetime] | None = None) -> Explanation:
    """Every function's answer about the VM `namespace/name`, the findings on record and the Events written."""
    from cli import registry

    kube = read_only(kube)
    when = now or datetime.now(UTC)
    answers = []
    for function in FUNCTIONS:
        settings, where = settings_of(kube, functions_namespace, function, overrides or {})
        ctx = KubeContext(function, settings, clock or (lambda: when), kube, Recorder(kube, function))
        try:
            answer = registry.explainer(function)(ctx, namespace, name)
        except WriteRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - one function's failure to read is that function's answer
            answer = Answer(function, "unknown", f"could not read: {getattr(exc, 'message', None) or exc}")
        answer.settings = where
        answers.append(answer)
    events = about_vm(kube, namespace, name)
    findings = [finding_line(record) for event in events if (record := record_of(event)) is not None]
    return Explanation(f"{namespace}/{name}", when.strftime("%Y-%m-%dT%H:%M:%SZ"), answers, findings,
                       [event_line(e) for e in events])


def about_vm(kube: Kube, namespace: str, name: str) -> list[dict]:
    """The Events vmevents wrote on the VM, its VMI (same name) and its migrations, oldest first."""
    migrations = {m["metadata"]["name"]
                  for m in kube.list(VMIM, namespace, label_selector=f"kubevirt.io/vmi-name={name}")}
    mine = [e for e in kube.list(EVENT, namespace)
            if str(e.get("reportingComponent") or "").startswith("vmevents.io/")
            and (e.get("involvedObject") or {}).get("name") in {name} | migrations]
    return sorted(mine, key=lambda e: (str(e.get("lastTimestamp") or ""), e["metadata"]["name"]))


def finding_line(record: Any) -> dict[str, Any]:
    finding = record.finding
    return {"function": finding.function, "category": finding.category, "severity": finding.severity,
            "state": record.state, "episode": record.episode, "count": record.count,
            "openedAt": record.opened_at.strftime("%Y-%m-%dT%H:%M:%SZ") if record.opened_at else None,
            "resolvedAt": record.resolved_at.strftime("%Y-%m-%dT%H:%M:%SZ") if record.resolved_at else None,
            "summary": finding.summary, "finding": finding.labels.get("finding")}


def event_line(event: Mapping[str, Any]) -> dict[str, Any]:
    involved = event.get("involvedObject") or {}
    return {"time": event.get("lastTimestamp"), "type": event.get("type"), "reason": event.get("reason"),
            "count": event.get("count") or 1, "function": (event.get("source") or {}).get("component"),
            "on": f"{involved.get('kind')}/{involved.get('name')}", "message": event.get("message")}


# -- the words ----------------------------------------------------------------------------------------
SHOWN = 220  # the most of a message or summary shown on one line (--output json has them whole)


def _clip(text: Any) -> str:
    said = " ".join(str(text or "").split())
    return said if len(said) <= SHOWN else said[:SHOWN - 1] + "…"


def text(found: Explanation) -> str:
    """A few readable lines."""
    width = max(len(f) for f in FUNCTIONS)
    sources = {a.settings for a in found.answers}
    said_settings = {"cluster": "each function's settings as its Knative Service runs it",
                     "defaults": "the functions' default settings (their Knative Services could not be read)",
                     "given": "the settings given"}
    head = said_settings[next(iter(sources))] if len(sources) == 1 else "settings as marked"
    out = [f"{found.vm}, as vmevents sees it at {found.now} ({head}):"]
    for answer in found.answers:
        said = f"{answer.verdict}: {answer.reason}" if answer.reason else answer.verdict
        marked = f" [{answer.settings} settings]" if len(sources) > 1 else ""
        out.append(f"  {answer.function:<{width}}  {_clip(said)}{marked}")
        out += [f"  {'':<{width}}    {_clip(line)}" for line in answer.lines]
    out.append(f"findings on record: {len(found.findings) or 'none'}")
    for f in found.findings:
        life = f"resolved {f['resolvedAt']}" if f["state"] == "resolved" else f"open since {f['openedAt']}"
        out.append(f"  {f['function']} {f['category']} ({f['severity']}), episode {f['episode']}, {life}, "
                   f"seen {f['count']}x: {_clip(f['summary'])}")
    out.append(f"Events vmevents wrote: {len(found.events) or 'none'}")
    for e in found.events[-10:]:
        count = f" x{e['count']}" if e["count"] and e["count"] > 1 else ""
        out.append(f"  {e['time']} {e['type']} {e['reason']}{count} on {e['on']} ({e['function']}): "
                   f"{_clip(e['message'])}")
    if len(found.events) > 10:
        out.append(f"  ... and {len(found.events) - 10} earlier (--output json has them all)")
    return "\n".join(out)


def as_json(found: Explanation) -> str:
    return json.dumps(asdict(found), indent=2, sort_keys=False, default=str)

"""The words a function is declared in, once (functions/<name>/declaration.py; docs/ARCHITECTURE.md, "Adding a
function").

A declaration says what a function is to the cluster and to the people who run it: its name, its Knative Service
(scale bounds and why, containerConcurrency, resources and why), the events its Trigger passes and whether it
takes the PingSource's tick, its settings (name, default, one-line doc, how it is read), its RBAC with the reason
for each grant, and the alerts its findings become. deploy/base/<function>.yaml, the chart's values, the Add-on's
values, the docs' settings tables, README's table and alert-forwarder's table are generated from it (`make
generate`, catalog/), and a function's settings.py reads its defaults from it. This module is plain data and the
readers of settings: a declaration imports nothing else.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shared.settings import Env

BROKER = "default"                     # the one Broker every Trigger subscribes to (deploy/base/broker.yaml)
DEAD_LETTER_SINK = "vmevents-dead-letter"  # the Knative Service every Trigger's undeliverable events go to
TICK = "dev.knative.sources.ping"      # the PingSource's event type (deploy/base/sources.yaml: every minute)
REPLIES = "io.vmevents."               # the prefix of every function's reply type (shared/replies.py)
SEVERITIES = ("info", "warning", "critical")  # a finding's and an alert's, in rank order (Prometheus' usual words)
# The ApiServerSource's event types, by the verb of the change they announce (knative.dev/eventing
# pkg/apis/sources/v1/apiserver_types.go, ApiServerSourceAddEventType and the others).
VERBS = {"add": "dev.knative.apiserver.resource.add", "update": "dev.knative.apiserver.resource.update",
         "delete": "dev.knative.apiserver.resource.delete"}


# -- settings -------------------------------------------------------------------------------------
class Parse(Protocol):
    """How a setting's text becomes its value (shared.settings.Env), and what a valid text looks like."""

    @property
    def form(self) -> str: ...

    def read(self, env: Env, name: str, default: str) -> Any: ...


@dataclass(frozen=True)
class Duration:
    form: str = "a duration such as 90s, 10m, 2h, 1d (at most 365d)"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.duration(name, default)


@dataclass(frozen=True)
class Boolean:
    form: str = "true or false"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.boolean(name, default == "true")


@dataclass(frozen=True)
class Names:
    form: str = "namespace names, comma-separated"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.names(name)


@dataclass(frozen=True)
class Namespace:
    form: str = "a namespace name"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.namespace(name, default)


@dataclass(frozen=True)
class ObjectRef:
    optional: bool = False  # empty means none
    form: str = "namespace/name"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.object_ref(name, default, optional=self.optional)


@dataclass(frozen=True)
class Number:
    minimum: float
    maximum: float

    @property
    def form(self) -> str:
        return f"a number from {self.minimum:g} to {self.maximum:g}"

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.number(name, float(default), minimum=self.minimum, maximum=self.maximum)


@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]

    @property
    def form(self) -> str:
        return "one of " + ", ".join(self.choices)

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.choice(name, default, self.choices)


@dataclass(frozen=True)
class Custom:
    """Read by the function's own settings.py (a URL list, a file, a table of its own): the text as given."""

    form: str

    def read(self, env: Env, name: str, default: str) -> Any:
        return env.raw(name, default)


@dataclass(frozen=True)
class Setting:
    """One environment variable a function reads: its default (as the manifest writes it), what it means (one
    line, for the docs' table and the chart's values), how it is read, and why its value is what it is (a comment
    above it in the manifest, when there is more to say than the doc). `addon`: the Harvester Add-on lists it
    among the settings operators change most."""

    name: str
    default: str
    doc: str
    parse: Parse
    why: str = ""
    addon: bool = False

    @property
    def value(self) -> Any:
        """The default, read as the function reads the variable."""
        return self.read({})

    def read(self, environ: Mapping[str, str]) -> Any:
        return self.parse.read(Env(environ), self.name, self.default)


# Settings several functions read, each with the same meaning (a function may `replace` the doc).
RESCAN_BUDGET = Setting(
    "RESCAN_BUDGET", "20s", "a re-scan starts no new visit after this long (at most the Trigger's 30 s delivery "
    "timeout); the next tick does the rest ([api-cost.md](api-cost.md))", Duration(),
    why="A re-scan stops starting visits after this, below the Trigger's delivery timeout (PT30S, below); the next "
        "tick does the rest (shared/rescan.py).")
RESCAN_WORKERS = Setting("RESCAN_WORKERS", "8", "a re-scan's candidates read at once (1–32)", Number(1, 32))
FINDING_RENEW_AFTER = Setting(
    "FINDING_RENEW_AFTER", "15m", "the re-scan rewrites an open finding's Event once its last write is this old "
    "(keep it, plus the re-scan period, well under `--event-ttl`)", Duration(),
    why="rewrite an open finding's Event this long after its last write: keep it, plus the PingSource's period, well "
        "under kube-apiserver's --event-ttl (1h) (docs/findings.md)")
LONGHORN_NAMESPACE = Setting("LONGHORN_NAMESPACE", "longhorn-system", "where the Longhorn Volumes are", Namespace())


# -- the Knative Service --------------------------------------------------------------------------
@dataclass(frozen=True)
class Scale:
    """autoscaling.knative.dev/min-scale and max-scale, and why."""

    min: int
    max: int
    why: str


@dataclass(frozen=True)
class Resources:
    """The container's CPU request and memory request and limit, and the measurement they rest on."""

    cpu: str
    memory: str
    memory_limit: str
    why: str


@dataclass(frozen=True)
class SecretVolume:
    """An optional Secret mounted read-only (credentials come from files only)."""

    name: str
    secret: str
    path: str
    why: str


@dataclass(frozen=True)
class Service:
    scale: Scale
    resources: Resources
    concurrency: int = 8
    concurrency_why: str = "= THREADS in the image (gunicorn's threads in its one worker): one request per thread."
    name: str = ""                   # the Knative Service's name when it is not the function's
    volumes: tuple[SecretVolume, ...] = ()
    no_account_why: str = ""         # it calls no API: no ServiceAccount, no token mounted, and why


# -- its events -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class On:
    """Changes of these kinds (any of them) announced by the ApiServerSources, with these verbs (add, update,
    delete)."""

    kinds: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str = ""


@dataclass(frozen=True)
class Delivery:
    retry: int = 6
    backoff_delay: str = "PT0.5S"
    timeout: str = "PT30S"           # shared/rescan.py DELIVERY_TIMEOUT (tests/deploy check they agree)


@dataclass(frozen=True)
class Trigger:
    """Which events the broker passes to the function: `on` (ApiServerSource changes), the other functions'
    replies (`replies`), and the PingSource's tick (`tick`). Filters see attributes only."""

    why: str
    on: tuple[On, ...] = ()
    replies: bool = False
    tick: bool = True
    delivery: Delivery = Delivery()


# -- RBAC -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One PolicyRule: `why` is written above it, `note` after its verbs."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()      # resourceNames
    why: str = ""
    note: str = ""


@dataclass(frozen=True)
class Grant:
    """A role of the function's ServiceAccount and its binding: a ClusterRole bound cluster-wide, or (`namespaced`)
    a Role in vmevents. `suffix` names it: vmevents-<function>[-<suffix>]. `scoped_by`: a `*_NAMESPACES` setting;
    where an install sets it, the ClusterRole is bound by one RoleBinding per namespace it lists instead
    (deploy/overlays/scoped-*, the chart)."""

    rules: tuple[Rule, ...]
    suffix: str = ""
    namespaced: bool = False
    scoped_by: str = ""
    why: str = ""


# -- findings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    """The alert some categories of the function's findings become in Alertmanager (alert-forwarder): its name,
    the severity used when a finding carries none, and its runbook (README's heading, by the alert's name)."""

    name: str
    severity: str
    categories: tuple[str, ...]

    @property
    def runbook(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Identity:
    """What makes two of the function's findings the same one (docs/findings.md, "Per producer"), in the docs'
    words: the subject, the key, the labels the alert carries, the states its replies announce; `categories`: how
    its category is chosen, when there is more to say than the list."""

    subject: str
    key: str
    labels: str
    state: str = "detected / resolved"
    categories: str = ""


# -- the function ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    """One function, declared once. `summary`: README's line; `about`: the head of its manifest (what it does and
    the least privilege it needs); `replies`: the reply types' last words; `reasons`: its Events' reasons."""

    name: str
    summary: str
    about: str
    service: Service
    trigger: Trigger | None = None
    settings: tuple[Setting, ...] = ()
    grants: tuple[Grant, ...] = ()
    alerts: tuple[Alert, ...] = ()
    identity: Identity | None = None
    replies: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def package(self) -> str:
        return self.name.replace("-", "_")

    @property
    def service_name(self) -> str:
        return self.service.name or self.name

    @property
    def account(self) -> str | None:
        """Its ServiceAccount (named after it), when it has any grant."""
        return self.name if self.grants else None

    def setting(self, name: str) -> Setting:
        found = [s for s in self.settings if s.name == name]
        if not found:
            raise KeyError(f"{self.name} declares no setting {name}")
        return found[0]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(c for alert in self.alerts for c in alert.categories)

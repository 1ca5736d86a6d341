"""The local runtime that stands in for Knative Eventing and Serving in the e2e tests and `make run`.

`LocalKnative(load_manifests(DEPLOY_DIR), ...)` reads what deploy/base declares and runs it:
every Knative Service as a functions-framework process, the Broker with its Triggers, each
ApiServerSource watching the (simulated) API server with its ServiceAccount's credentials, and
the PingSource. Nothing is specific to one function: a new function is a new manifest.
The pieces live in broker.py, sources.py and serving.py; this module wires them together.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import yaml

from localknative.broker import (  # noqa: F401 (re-exported)
    Broker,
    Delivery,
    DeliverySpec,
    TriggerError,
    matches,
    new_event,
    parse_duration,
    trigger_filter,
    validate_trigger,
)
from localknative.knative_source import KnativeApiServerSource
from localknative.paths import REPO
from localknative.serving import FunctionServer, ServingError, service_account  # noqa: F401
from localknative.sources import (  # noqa: F401
    ApiServerSourceAdapter,
    PingSourceAdapter,
    make_apiserver_event,
    make_ping_event,
    self_link,
)

# libyaml's parser where PyYAML has it: every world loads deploy/.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Kinds without a namespace (everything else gets the kustomization's `namespace:`).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "Node", "StorageClass", "PriorityClass"}


def load_manifests(deploy_dir: str | os.PathLike) -> list[dict]:
    """Every YAML document of the files listed in `<deploy_dir>/base/kustomization.yaml`
    `resources`, with the kustomization's `namespace:` applied to namespaced objects without one."""
    base = Path(deploy_dir) / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    namespace = kustomization.get("namespace")
    manifests = []
    for resource in kustomization.get("resources") or []:
        path = base / resource
        if path.is_dir():
            raise ValueError(f"{path}: nested kustomizations are not supported by the local runtime; list files.")
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):
            if not doc:
                continue
            meta = doc.setdefault("metadata", {})
            if namespace and doc.get("kind") not in CLUSTER_SCOPED and not meta.get("namespace"):
                meta["namespace"] = namespace
            manifests.append(doc)
    return manifests


def of_kind(manifests: list[Mapping[str, Any]], api_group: str, kind: str) -> list[Mapping[str, Any]]:
    return [m for m in manifests
            if m.get("kind") == kind and m.get("apiVersion", "").split("/")[0] == api_group]


class LocalKnative:
    """Runs deploy/base locally. After `start()`: `.broker`, `.functions[name]`, `.sources[name]`,
    `.ping` (the first PingSource, or None) and `.pings[name]`.

    kubeconfig_for(service_account) -> path of a kubeconfig for that ServiceAccount;
    api_client_for(service_account) -> a `kubernetes.client.ApiClient` with its credentials.
    ServiceAccount names are "<namespace>/<name>".
    """

    def __init__(
        self,
        manifests: list[Mapping[str, Any]],
        kubeconfig_for: Callable[[str], str | os.PathLike],
        api_client_for: Callable[[str], Any],
        api_server_url: str,
        env_overrides: Mapping[str, Mapping[str, str]] | None = None,
        ping_interval: float | None = None,
        time_scale: float = 1.0,
        on_delivery: Callable[[Delivery], None] | None = None,
        on_log: Callable[[str, str], None] | None = None,
        start_sources: bool = True,
        validate_triggers: bool = True,
        repo: str | os.PathLike = REPO,
        apiserversource_binary: str | os.PathLike | None = None,
        namespaces_of: Callable[[Mapping[str, Any] | None], list[str]] | None = None,
        source_listed: Callable[[Mapping[str, Any]], bool] | None = None,
        function_server: Callable[..., FunctionServer] = FunctionServer,
    ) -> None:
        self.manifests = manifests
        self.kubeconfig_for = kubeconfig_for
        self.api_client_for = api_client_for
        self.api_server_url = api_server_url
        self.env_overrides = dict(env_overrides or {})
        self.ping_interval = ping_interval
        self.time_scale = time_scale
        self.on_delivery = on_delivery
        self.on_log = on_log
        self.start_sources = start_sources
        self.validate_triggers = validate_triggers
        self.repo = Path(repo)
        # Knative's own receive adapter (localknative.knative_source) instead of our stand-in, when given.
        self.apiserversource_binary = apiserversource_binary
        self.namespaces_of = namespaces_of
        self.source_listed = source_listed
        # What runs a Knative Service: a process from the work tree, or (image/run.py) its container.
        self.function_server = function_server
        self.functions: dict[str, FunctionServer] = {}
        self.sources: dict[str, ApiServerSourceAdapter | KnativeApiServerSource] = {}
        self.pings: dict[str, PingSourceAdapter] = {}
        self.broker: Broker | None = None
        self.brokers: dict[str, Broker] = {}
        services = {m["metadata"]["name"] for m in of_kind(manifests, "serving.knative.dev", "Service")}
        unknown = set(self.env_overrides) - services
        if unknown:
            raise ValueError(f"env_overrides name no Knative Service in the manifests: {sorted(unknown)}")
        if validate_triggers:
            for trigger in of_kind(manifests, "eventing.knative.dev", "Trigger"):
                validate_trigger(trigger)  # fail before starting anything

    @property
    def ping(self) -> PingSourceAdapter | None:
        return next(iter(self.pings.values()), None)

    # -- addressing -----------------------------------------------------------------------

    def resolve(self, destination: Mapping[str, Any], namespace: str | None = None) -> str:
        """A Knative Destination (`ref` and/or `uri`) as a URL of a locally running thing."""
        ref, uri = destination.get("ref"), destination.get("uri")
        if not ref:
            if not uri:
                raise ValueError(f"destination {dict(destination)} has neither ref nor uri")
            return uri
        group = ref.get("apiVersion", "").split("/")[0]
        kind, name = ref.get("kind"), ref.get("name")
        if (group, kind) == ("serving.knative.dev", "Service"):
            if name not in self.functions:
                raise ValueError(f"ref to Knative Service {name!r}, which is not in the manifests")
            base = self.functions[name].url
        elif (group, kind) == ("eventing.knative.dev", "Broker"):
            if name not in self.brokers:
                raise ValueError(f"ref to Broker {name!r}, which is not in the manifests")
            base = self.brokers[name].url
        else:
            raise ValueError(f"ref to {ref.get('apiVersion')} {kind} {name!r} cannot be resolved locally")
        return urljoin(base, uri) if uri else base

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> LocalKnative:
        try:
            self._start_functions()
            self._start_brokers()
            if self.start_sources:
                self._start_sources()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_functions(self) -> None:
        for svc in of_kind(self.manifests, "serving.knative.dev", "Service"):
            name, ns = svc["metadata"]["name"], svc["metadata"].get("namespace", "default")
            on_log = (lambda line, _n=name: self.on_log(_n, line)) if self.on_log else None
            server = self.function_server(svc, kubeconfig=self.kubeconfig_for(f"{ns}/{service_account(svc)}"),
                                    env_overrides=self.env_overrides.get(name), on_log=on_log, repo=self.repo)
            self.functions[name] = server
            server.start()

    def _start_brokers(self) -> None:
        triggers = of_kind(self.manifests, "eventing.knative.dev", "Trigger")
        for manifest in of_kind(self.manifests, "eventing.knative.dev", "Broker"):
            meta = manifest["metadata"]
            ns = meta.get("namespace")
            broker = Broker(
                [t for t in triggers if t["metadata"].get("namespace") == ns],
                resolve=lambda dest, _ns=ns: self.resolve(dest, _ns),
                delivery_defaults=(manifest.get("spec") or {}).get("delivery"),
                time_scale=self.time_scale, name=meta["name"], namespace=ns,
                on_delivery=self.on_delivery, validate=self.validate_triggers,
            )
            self.brokers[meta["name"]] = broker.start()
        self.broker = self.brokers.get("default") or next(iter(self.brokers.values()), None)

    def _start_sources(self) -> None:
        for src in of_kind(self.manifests, "sources.knative.dev", "ApiServerSource"):
            meta, spec = src["metadata"], src.get("spec") or {}
            sa = f"{meta.get('namespace', 'default')}/{spec.get('serviceAccountName') or 'default'}"
            adapter: ApiServerSourceAdapter | KnativeApiServerSource
            if self.apiserversource_binary is not None:
                if self.namespaces_of is None:
                    raise ValueError("Knative's adapter needs namespaces_of (to resolve namespaceSelector)")
                adapter = KnativeApiServerSource(src, self.apiserversource_binary, self.kubeconfig_for(sa),
                                                 self.resolve(spec["sink"]), self.namespaces_of,
                                                 listed=self.source_listed)
            else:
                adapter = ApiServerSourceAdapter(src, self.api_client_for(sa), self.resolve(spec["sink"]),
                                                 self.api_server_url)
            self.sources[meta["name"]] = adapter
            adapter.start()
        for src in of_kind(self.manifests, "sources.knative.dev", "PingSource"):
            ping = PingSourceAdapter(src, self.resolve(src["spec"]["sink"]), interval=self.ping_interval)
            self.pings[src["metadata"]["name"]] = ping
            if self.ping_interval is not None:
                ping.start()

    def stop(self) -> None:
        # The pings and sources all at once, then the brokers, then the functions all at once: a source's watches
        # may take their 5 s to wake (and a function its SIGKILL's 5 s), and one after another, on a loaded machine,
        # they outlasted a person's patience and the 30 s `make run`'s test gives Ctrl-C.
        _all_at_once([*self.pings.items(), *self.sources.items()])
        for broker in self.brokers.values():
            broker.stop()
        _all_at_once(list(self.functions.items()))

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return all(b.wait_idle(timeout) for b in self.brokers.values())

    def __enter__(self) -> LocalKnative:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _all_at_once(parts: list[tuple[str, Any]]) -> None:
    """Call every part's stop() at once and wait for them all."""
    stopping = [threading.Thread(target=part.stop, name=f"stop-{name}") for name, part in parts]
    for thread in stopping:
        thread.start()
    for thread in stopping:
        thread.join()

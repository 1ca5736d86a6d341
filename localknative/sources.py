"""Local stand-ins for the Knative ApiServerSource and PingSource receive adapters.

ApiServerSource, as knative/eventing v1.22 `pkg/adapter/apiserver` does it:
- a Reflector lists, then watches, each `spec.resources` entry; its store is a `resourceDelegate`
  (delegate.go) whose `Replace` is a no-op, so objects that exist at start (and whatever changed
  while a watch was being re-established after 410 Gone) produce **no** events; ADDED, MODIFIED
  and DELETED become add, update and delete events;
- events are built like events/events.go `makeEvent`: type `dev.knative.apiserver.resource.*`
  (Resource mode, data = the object) or `dev.knative.apiserver.ref.*` (Reference mode, data =
  {apiVersion, kind, name, namespace}); `source` = the API server URL; `subject` from
  `createSelfLink`: `/apis/<apiVersion>/namespaces/<ns>/<plural guessed from the kind>/<name>`,
  also for core kinds (`/apis/v1/...`) and for cluster-scoped objects (empty namespace segment);
  extensions kind, name, namespace, apiversion; a fresh uuid4 id per send (delegate.go);
- a failed send is only logged (delegate.go sendCloudEvent).

PingSource, as pkg/adapter/mtping/runner.go `makeEvent`: type `dev.knative.sources.ping`, source
`/apis/v1/namespaces/<ns>/pingsources/<name>` (PingSourceSource), data from `spec.data` (or
`spec.dataBase64`) with `spec.contentType`, `spec.ceOverrides.extensions` copied as extensions.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from cloudevents.http import CloudEvent
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from localknative.broker import binary_request

log = logging.getLogger("vmevents.sim.sources")

# The plural the API server serves for a kind (the real adapter asks a RESTMapper).
PLURALS = {
    "VirtualMachineInstance": "virtualmachineinstances",
    "VirtualMachine": "virtualmachines",
    "VirtualMachineInstanceMigration": "virtualmachineinstancemigrations",
    "KubeVirt": "kubevirts",
    "MigrationPolicy": "migrationpolicies",
    "Volume": "volumes",
    "Engine": "engines",
    "Replica": "replicas",
    "Pod": "pods",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "PersistentVolume": "persistentvolumes",
    "Node": "nodes",
    "Event": "events",
    "Namespace": "namespaces",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Endpoints": "endpoints",
}
# Core kinds that are not namespaced.
CLUSTER_SCOPED_CORE = {"Node", "Namespace", "PersistentVolume"}

WATCH_SECONDS = 30      # server-side watch timeout; the loop re-watches from the last resourceVersion
RETRY_SECONDS = 0.5     # wait after a failed list/watch before listing again


def guess_plural(kind: str) -> str:
    """k8s.io/apimachinery meta.UnsafeGuessKindToResource, which createSelfLink uses."""
    singular = kind.lower()
    if not singular or singular.endswith("endpoints"):
        return singular
    if singular.endswith("s"):
        return singular + "es"
    if singular.endswith("y"):
        return singular[:-1] + "ies"
    return singular + "s"


def self_link(api_version: str, kind: str, namespace: str, name: str) -> str:
    """events.go createSelfLink: always /apis/..., plural guessed, namespace segment even if empty."""
    version = api_version
    if "." in version and "/" not in version:
        version += "/versionUnknown"
    return f"/apis/{version}/namespaces/{namespace}/{guess_plural(kind)}/{name}"


_TYPES = {
    ("Resource", "ADDED"): "dev.knative.apiserver.resource.add",
    ("Resource", "MODIFIED"): "dev.knative.apiserver.resource.update",
    ("Resource", "DELETED"): "dev.knative.apiserver.resource.delete",
    ("Reference", "ADDED"): "dev.knative.apiserver.ref.add",
    ("Reference", "MODIFIED"): "dev.knative.apiserver.ref.update",
    ("Reference", "DELETED"): "dev.knative.apiserver.ref.delete",
}


def make_apiserver_event(watch_type: str, obj: Mapping[str, Any], source: str, mode: str = "Resource") -> CloudEvent:
    """The CloudEvent the ApiServerSource adapter sends for one watch event."""
    meta = obj.get("metadata") or {}
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    name, namespace = meta.get("name", ""), meta.get("namespace", "") or ""
    if mode == "Resource":
        data: Any = obj
    else:
        data = {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace}
    attrs = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "type": _TYPES[(mode, watch_type)],
        "source": source,
        "subject": self_link(api_version, kind, namespace, name),
        "datacontenttype": "application/json",
        "kind": kind,
        "name": name,
        "namespace": namespace,
        "apiversion": api_version,
    }
    return CloudEvent(attrs, data)


def label_selector(selector: Mapping[str, Any] | None) -> str | None:
    """A metav1.LabelSelector as the string a list/watch call takes."""
    if not selector:
        return None
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ValueError(f"label selector operator {op!r} is not valid; use In, NotIn, Exists or DoesNotExist.")
    return ",".join(parts) or None


def send_event(url: str, event: CloudEvent, timeout: float = 10.0,
               extra_headers: Mapping[str, str] | None = None) -> int | None:
    """POST a binary-mode CloudEvent; the status code, or None on a network error."""
    headers, body = binary_request(event)
    headers.update(extra_headers or {})
    try:
        return requests.post(url, data=body, headers=headers, timeout=timeout).status_code
    except requests.RequestException as exc:
        log.error("failed to send cloudevent %s to %s: %s", event["id"], url, exc)
        return None


@dataclass(frozen=True)
class _Watched:
    api_version: str
    kind: str
    plural: str
    namespace: str | None     # None = all namespaces
    selector: str | None

    @property
    def group_version(self) -> tuple[str, str]:
        if "/" in self.api_version:
            group, version = self.api_version.split("/", 1)
            return group, version
        return "", self.api_version


class ApiServerSourceAdapter:
    """Lists then watches the source's resources with the given `kubernetes` ApiClient and sends
    CloudEvents to `sink_url`. `start()` returns once every initial list has been tried."""

    def __init__(
        self,
        manifest: Mapping[str, Any],
        api_client: k8s.ApiClient,
        sink_url: str,
        api_server_url: str,
        on_event: Callable[[CloudEvent, int | None], None] | None = None,
    ) -> None:
        self.manifest = manifest
        self.name = manifest["metadata"]["name"]
        self.namespace = manifest["metadata"].get("namespace") or "default"
        spec = manifest.get("spec") or {}
        self.mode = spec.get("mode") or "Reference"
        if self.mode not in ("Resource", "Reference"):
            raise ValueError(f"ApiServerSource {self.name}: mode {self.mode!r} is not valid; "
                             f"use Resource or Reference.")
        self.api_client = api_client
        self.sink_url = sink_url
        self.source = api_server_url
        self.on_event = on_event
        self.sent: list[tuple[CloudEvent, int | None]] = []
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[k8s_watch.Watch] = []
        self._listed = 0
        self.errors: list[str] = []
        self._targets = self._plan(spec, manifest["metadata"].get("namespace"))

    def _plan(self, spec: Mapping[str, Any], own_namespace: str | None) -> list[_Watched]:
        ns_selector = spec.get("namespaceSelector")
        if ns_selector is None:
            namespaces: list[str | None] = [own_namespace]
        elif not (ns_selector.get("matchLabels") or ns_selector.get("matchExpressions")):
            namespaces = [None]
        else:
            selected = k8s.CoreV1Api(self.api_client).list_namespace(label_selector=label_selector(ns_selector))
            namespaces = [n.metadata.name for n in selected.items]
        targets = []
        for res in spec.get("resources") or []:
            kind = res["kind"]
            plural = PLURALS.get(kind) or guess_plural(kind)
            for ns in namespaces:
                targets.append(_Watched(res["apiVersion"], kind, plural, ns, label_selector(res.get("selector"))))
        return targets

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> ApiServerSourceAdapter:
        for target in self._targets:
            thread = threading.Thread(target=self._run, args=(target,), daemon=True,
                                      name=f"apiserversource-{self.name}-{target.plural}")
            self._threads.append(thread)
            thread.start()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._listed < len(self._targets) and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            watches = list(self._watches)
        for w in watches:
            w.stop()
        # A watch wakes on its next event or at its server-side timeout; the threads are daemons, and one deadline
        # for all of them bounds the stop.
        deadline = time.monotonic() + 5
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def wait_for(self, predicate: Callable[[list[CloudEvent]], bool], timeout: float = 10.0) -> bool:
        """Block until `predicate(sent events)` holds; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate([e for e, _ in self.sent]):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    # -- list and watch -------------------------------------------------------------------

    def _list_call(self, target: _Watched) -> tuple[Callable[..., Any], tuple, dict]:
        group, version = target.group_version
        if group:
            api = k8s.CustomObjectsApi(self.api_client)
            if target.namespace is None:
                return api.list_cluster_custom_object, (group, version, target.plural), {}
            return api.list_namespaced_custom_object, (group, version, target.namespace, target.plural), {}
        api = k8s.CoreV1Api(self.api_client)
        singular = "_".join(_snake(target.kind))
        if target.kind in CLUSTER_SCOPED_CORE:
            return getattr(api, f"list_{singular}"), (), {}
        if target.namespace is None:
            return getattr(api, f"list_{singular}_for_all_namespaces"), (), {}
        return getattr(api, f"list_namespaced_{singular}"), (target.namespace,), {}

    def _mark_listed(self) -> None:
        with self._lock:
            self._listed += 1
            self._lock.notify_all()

    def _run(self, target: _Watched) -> None:
        func, args, kwargs = self._list_call(target)
        if target.selector:
            kwargs["label_selector"] = target.selector
        first = True
        while not self._stop.is_set():
            try:
                raw = func(*args, _preload_content=False, **kwargs)
                listing = json.loads(raw.data)
                version = (listing.get("metadata") or {}).get("resourceVersion")
                # Replace() of the delegate store is a no-op: listed objects send nothing.
                if first:
                    self._mark_listed()
                    first = False
                self._watch(target, func, args, kwargs, version)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s %s: watch expired (410 Gone); listing again", self.name, target.plural)
                    continue
                self._failed(target, f"{exc.status} {exc.reason}")
            except Exception as exc:  # dropped connection, API server gone, ...
                if self._stop.is_set():
                    break
                self._failed(target, f"{type(exc).__name__}: {exc}")
            if first:
                self._mark_listed()
                first = False
            self._stop.wait(RETRY_SECONDS)

    def _failed(self, target: _Watched, why: str) -> None:
        message = f"ApiServerSource {self.name}: list/watch {target.api_version} {target.plural} failed: {why}"
        log.warning(message)
        with self._lock:
            self.errors.append(message)

    def _watch(self, target: _Watched, func, args, kwargs, version: str | None) -> None:
        while not self._stop.is_set():
            w = k8s_watch.Watch()
            with self._lock:
                self._watches.append(w)
            try:
                for item in w.stream(func, *args, resource_version=version, timeout_seconds=WATCH_SECONDS,
                                     allow_watch_bookmarks=True, deserialize=False, **kwargs):
                    if self._stop.is_set():
                        return
                    obj = item.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if item.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._emit(item["type"], obj)
            finally:
                with self._lock:
                    self._watches.remove(w)

    def _emit(self, watch_type: str, obj: Mapping[str, Any]) -> None:
        event = make_apiserver_event(watch_type, obj, self.source, self.mode)
        # Knative's adapter names its own namespace in Kn-Namespace (pkg/adapter/v2/cloudevents.go).
        status = send_event(self.sink_url, event, extra_headers={"Kn-Namespace": self.namespace})
        if status is not None and not 200 <= status < 300:
            log.error("failed to send cloudevent %s (%s): HTTP %s", event["id"], event["subject"], status)
        with self._lock:
            self.sent.append((event, status))
            self._lock.notify_all()
        if self.on_event:
            self.on_event(event, status)


def _snake(kind: str) -> list[str]:
    words, current = [], ""
    for ch in kind:
        if ch.isupper() and current:
            words.append(current.lower())
            current = ch
        else:
            current += ch
    words.append(current.lower())
    return words


# ---------------------------------------------------------------------------------------------
# PingSource
# ---------------------------------------------------------------------------------------------


def schedule_seconds(schedule: str) -> float:
    """Seconds between ticks for the every-N-minutes cron forms (`* * * * *`, `*/5 * * * *`)."""
    fields = schedule.split()
    if len(fields) != 5 or any(f != "*" for f in fields[1:]):
        raise ValueError(f"cron schedule {schedule!r} is not supported locally; use '* * * * *' or '*/N * * * *'.")
    minute = fields[0]
    if minute == "*":
        return 60.0
    if minute.startswith("*/") and minute[2:].isdigit() and int(minute[2:]) > 0:
        return 60.0 * int(minute[2:])
    raise ValueError(f"cron schedule {schedule!r} is not supported locally; use '* * * * *' or '*/N * * * *'.")


def make_ping_event(manifest: Mapping[str, Any]) -> CloudEvent:
    meta, spec = manifest["metadata"], manifest.get("spec") or {}
    attrs: dict[str, Any] = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "type": "dev.knative.sources.ping",
        "source": f"/apis/v1/namespaces/{meta.get('namespace', 'default')}/pingsources/{meta['name']}",
    }
    for key, value in ((spec.get("ceOverrides") or {}).get("extensions") or {}).items():
        attrs[key] = value
    data: Any = None
    if spec.get("dataBase64"):
        data = base64.b64decode(spec["dataBase64"])
    elif spec.get("data"):
        data = spec["data"].encode()
    if data is not None and spec.get("contentType"):
        attrs["datacontenttype"] = spec["contentType"]
    return CloudEvent(attrs, data)


class PingSourceAdapter:
    """Sends the PingSource's event on its schedule (or every `interval` seconds), or on `tick()`."""

    def __init__(self, manifest: Mapping[str, Any], sink_url: str, interval: float | None = None,
                 on_event: Callable[[CloudEvent, int | None], None] | None = None) -> None:
        self.manifest = manifest
        self.name = manifest["metadata"]["name"]
        self.sink_url = sink_url
        schedule = (manifest.get("spec") or {}).get("schedule", "* * * * *")
        self.interval = interval if interval is not None else schedule_seconds(schedule)
        self.on_event = on_event
        self.sent: list[tuple[CloudEvent, int | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> CloudEvent:
        event = make_ping_event(self.manifest)
        status = send_event(self.sink_url, event)
        if status is not None and not 200 <= status < 300:
            log.error("failed to send ping %s: HTTP %s", event["id"], status)
        self.sent.append((event, status))
        if self.on_event:
            self.on_event(event, status)
        return event

    def start(self) -> PingSourceAdapter:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.tick()

        self._thread = threading.Thread(target=loop, name=f"pingsource-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

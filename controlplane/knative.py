"""Knative Eventing (MT channel-based broker, in-memory channel, PingSource, ApiServerSource) and Knative
Serving's webhook, installed from their release's own config/ and run against a real control plane.

`Knative(plane).start()` applies the release's manifests as a cluster operator would (vendored unchanged in
upstream/knative-eventing/v0.48.2/config and upstream/knative-serving/v0.48.2/config: CRDs, ConfigMaps, RBAC,
ServiceAccounts, Deployments, Services, webhook configurations), then runs every Deployment whose image is a
command built by controlplane/build.py through `kubelet.Kubelet` (each in a namespace of its own, with its
ServiceAccount's token). Two things differ from a cluster, each because the host has no cluster network:

- The webhooks' Services are ExternalName Services naming a loopback address of this host, where a listener
  carries the API server's calls into the webhook's pod. kube-apiserver resolves an ExternalName Service to
  `externalName:port` (k8s.io/apiserver pkg/util/proxy `ResolveCluster`) and checks the certificate against
  `<service>.<namespace>.svc`, so Knative's own webhook reconcilers (rules, caBundle, certificates) run unchanged.
- Knative Serving's controllers stay out (they need pods and a network layer). `serve()` stands in for them: it
  gives a Knative Service the status Serving would write (Ready, `status.address.url`
  `http://<name>.<namespace>.svc.cluster.local`) and routes that name, inside the pods, to the port on the
  host's loopback where the function runs. What a Trigger does with it (filter, delivery, dead letter) is
  Knative's.
"""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from controlplane import build
from controlplane.cluster import kubectl
from controlplane.kubelet import Kubelet
from controlplane.server import ControlPlane
from localknative.serving import free_port
from simcluster.paths import UPSTREAM_DIR

EVENTING_VERSION = SERVING_VERSION = "v0.48.2"   # Knative 1.21.2: minimum Kubernetes 1.33 (docs/facts.md §6)
EVENTING_CONFIG = UPSTREAM_DIR / "knative-eventing" / EVENTING_VERSION / "config"
SERVING_CONFIG = UPSTREAM_DIR / "knative-serving" / SERVING_VERSION / "config"
# What a cluster operator applies for the MT channel-based broker with the in-memory channel (the order of
# Knative's install docs; the release's eventing-core.yaml also carries the integrations' image ConfigMaps from
# third_party/, which the controller's environment names), and Serving's core, of which only the webhook runs.
MANIFESTS = (EVENTING_CONFIG / "core", EVENTING_CONFIG.parent / "third_party" / "eventing-integrations-latest",
             EVENTING_CONFIG / "channels" / "in-memory-channel",
             EVENTING_CONFIG / "brokers" / "mt-channel-broker", SERVING_CONFIG / "core")
# Serving's image cache and its internal TLS certificate: their CRDs (knative.dev/caching, knative.dev/networking)
# are not part of Serving's core, and nothing here uses either.
SKIPPED = {"999-cache.yaml", "300-knativecertificate.yaml"}
# The webhooks' Services (namespace, name), made ExternalName Services on a loopback address (see above).
WEBHOOK_SERVICES = {("knative-eventing", "eventing-webhook"), ("knative-eventing", "inmemorychannel-webhook"),
                    ("knative-serving", "webhook")}
# deploy/'s Knative objects, applied again once Knative runs (`apply_through_webhooks`).
DEPLOY_KNATIVE_KINDS = (("serving.knative.dev/v1", "Service"), ("eventing.knative.dev/v1", "Trigger"),
                        ("eventing.knative.dev/v1", "Broker"), ("sources.knative.dev/v1", "ApiServerSource"),
                        ("sources.knative.dev/v1", "PingSource"))
EVENTING_CONTROLLER = "system:serviceaccount:knative-eventing:eventing-controller"
WEBHOOK_CONFIGURATIONS = ("validation.webhook.eventing.knative.dev", "webhook.eventing.knative.dev",
                          "validation.webhook.serving.knative.dev", "webhook.serving.knative.dev")


class KnativeError(RuntimeError):
    """Knative did not come up: the message says what was missing and where the logs are."""


class Api:
    """The admin's JSON requests to the API server (the stand-ins' only client)."""

    def __init__(self, plane: ControlPlane):
        self.url, self._context = plane.url, plane.ssl_context()

    def request(self, method: str, path: str, body: Any = None, allow: tuple[int, ...] = (),
                content_type: str = "application/json", as_user: str | None = None) -> Any:
        """as_user: impersonate that user (the admin may), e.g. a controller's ServiceAccount."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if as_user:
            headers["Impersonate-User"] = as_user
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=30) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            if exc.code in allow:
                return None
            raise KnativeError(f"{method} {path}: {exc.code}: {exc.read()[:1000]!r}") from None
        return json.loads(text) if text else None

    def get(self, path: str, allow: tuple[int, ...] = ()) -> Any:
        return self.request("GET", path, allow=allow)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    @staticmethod
    def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        """The REST path of a kind (the plural is the lower-case kind plus "s": true of every kind used here)."""
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{base}{where}/{kind.lower()}s" + (f"/{name}" if name else "")

    def create(self, obj: dict) -> dict:
        return self.post(self.path(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace")), obj)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict]:
        return self.get(self.path(api_version, kind, namespace))["items"]

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        self.request("DELETE", self.path(api_version, kind, namespace, name), allow=(404,))


def release_documents() -> list[dict]:
    """Every object of MANIFESTS, in order, as upstream wrote it."""
    documents = []
    for folder in MANIFESTS:
        if not folder.is_dir():
            raise KnativeError(f"{folder}: the vendored Knative release is missing (see upstream/README.md)")
        for path in sorted(folder.rglob("*.yaml")):
            if path.name not in SKIPPED:
                documents += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind")]
    return documents


# The files of Knative Eventing's release, each from the folders of the vendored config it is made of (knative/eventing
# hack/release.sh: eventing-crds.yaml is config/core's CRDs, eventing-core.yaml the rest of config/core with the
# integrations' image ConfigMaps, then one file per channel and broker).
RELEASE_FILES = {"eventing-core.yaml": (EVENTING_CONFIG / "core", EVENTING_CONFIG.parent / "third_party" /
                                        "eventing-integrations-latest"),
                 "in-memory-channel.yaml": (EVENTING_CONFIG / "channels" / "in-memory-channel",),
                 "mt-channel-broker.yaml": (EVENTING_CONFIG / "brokers" / "mt-channel-broker",)}


def write_release(folder: Path) -> Path:
    """Knative Eventing 1.21.2's release files, written into `folder` from the vendored config (what `ko resolve`
    makes of it, but for the images: they stay `ko://…`, which the kubelet stand-in runs from the binaries
    build.py makes of the same Go modules; and job-sink's Deployment is left out: `_unbuilt`). `vmevents knative
    install --from <folder>` applies them."""
    folder.mkdir(parents=True, exist_ok=True)
    crds: list[dict] = []
    for name, parts in RELEASE_FILES.items():
        documents = []
        for part in parts:
            for path in sorted(part.rglob("*.yaml")):
                if path.name not in SKIPPED:
                    documents += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind")]
        crds += [d for d in documents if d["kind"] == "CustomResourceDefinition" and name == "eventing-core.yaml"]
        kept = [d for d in documents if not (d["kind"] == "CustomResourceDefinition" and name == "eventing-core.yaml")
                and not _unbuilt(d)]
        (folder / name).write_text(yaml.safe_dump_all(kept, sort_keys=False))
    (folder / "eventing-crds.yaml").write_text(yaml.safe_dump_all(crds, sort_keys=False))
    return folder


def _unbuilt(document: dict) -> bool:
    """A Deployment whose command build.py does not build (job-sink: JobSink, which nothing here uses): left out of
    the release files written here, which the kubelet stand-in could never run."""
    if document["kind"] != "Deployment":
        return False
    containers = ((document.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    image = str(containers[0].get("image") or "")
    commands = {f"ko://knative.dev/eventing/cmd/{c}" for c in build.KNATIVE_COMMANDS}
    return image.startswith("ko://knative.dev/eventing/") and image not in commands


def _loopback_address() -> str:
    """A loopback address of its own for one webhook (port 443 on it is then free)."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


class Knative:
    def __init__(self, plane: ControlPlane, workdir: Path | None = None, die_with_parent: bool = False):
        self.plane, self.api = plane, Api(plane)
        self.workdir = Path(workdir or plane.workdir / "knative")  # type: ignore[operator]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.die_with_parent = die_with_parent
        self.functions: dict[tuple[str, str], tuple[str, int]] = {}  # (namespace, name) → (address, port)
        self.kubelet: Kubelet | None = None
        self._ingress_port: int | None = None
        self._stop = threading.Event()
        self._serving = threading.Thread(target=self._serving_loop, name="Serving stand-in", daemon=True)

    # -- install -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0, say=lambda text: None) -> Knative:
        started = time.monotonic()
        binaries = build.ensure(build.KNATIVE, say)
        serving = build.ensure(build.SERVING, say)
        images = {f"ko://knative.dev/eventing/cmd/{c}": binaries / c.rsplit("/", 1)[-1]
                  for c in build.KNATIVE_COMMANDS}
        images["ko://knative.dev/serving/cmd/webhook"] = serving / "webhook"
        documents = release_documents()
        webhooks = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in documents
                    if d["kind"] == "Service" and (d["metadata"].get("namespace"), d["metadata"]["name"])
                    in WEBHOOK_SERVICES}
        rest = [d for d in documents if d["kind"] != "CustomResourceDefinition" and
                not (d["kind"] == "Service" and (d["metadata"].get("namespace"), d["metadata"]["name"]) in webhooks)]
        self._apply([d for d in documents if d["kind"] == "CustomResourceDefinition"])
        kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s",
                kubeconfig=self.plane.admin_kubeconfig)
        self.kubelet = Kubelet(self.plane, self.api, images, self.workdir, extra_hosts=self._function_hosts,
                               die_with_parent=self.die_with_parent)
        self._apply([d for d in rest if d["kind"] == "Namespace"])
        for (namespace, name), service in webhooks.items():
            self._webhook_service(namespace, name, service)
        self._apply(rest)
        self.kubelet.start()
        self._serving.start()
        try:
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_after = time.monotonic() - started
        return self

    def apply_through_webhooks(self, cluster, namespace: str = "vmevents") -> None:
        """deploy/ applied again, now through Knative's webhooks (a RealCluster applied it before Knative ran): its
        Knative objects are deleted (Knative's finalizers first) and made anew, so what the webhooks default is
        what runs, as on a cluster where Knative was installed first."""
        for api_version, kind in DEPLOY_KNATIVE_KINDS:
            for obj in self.api.list(api_version, kind, namespace):
                self.api.delete(api_version, kind, namespace, obj["metadata"]["name"])
            deadline = time.monotonic() + 60
            while self.api.list(api_version, kind, namespace) and time.monotonic() < deadline:
                time.sleep(0.2)
        cluster.apply_deploy()

    def drop_stale_subscribers(self, namespace: str, timeout: float = 30.0) -> int:
        """Until each InMemoryChannel of the namespace lists exactly its Subscriptions: an entry whose Subscription
        is gone is removed (how many were). A Trigger whose delivery changes gets a new Subscription, and the channel
        can keep the old one's entry, so every event reaches that Trigger twice (seen here on 1.21.2 after a
        Trigger's backoff was changed; knative/eventing#6356, #5961): what the old Subscription's finalizer should
        have done, and as that controller's ServiceAccount."""
        deadline, dropped = time.monotonic() + timeout, 0
        while True:
            found = self.api.list("messaging.knative.dev/v1", "Subscription", namespace)
            # one being deleted (a Trigger's old one, its finalizer still to run) counts as gone: its entry goes now
            subscriptions = {s["metadata"]["uid"]: s for s in found if not s["metadata"].get("deletionTimestamp")}
            settled = len(subscriptions) == len(found)
            for channel in self.api.list("messaging.knative.dev/v1", "InMemoryChannel", namespace):
                entries = (channel.get("spec") or {}).get("subscribers") or []
                stale = [i for i, e in enumerate(entries) if e.get("uid") not in subscriptions]
                listed = {e.get("uid") for e in entries}
                settled &= not stale and all(uid in listed for uid, s in subscriptions.items()
                                             if (s["spec"].get("channel") or {}).get("name") ==
                                             channel["metadata"]["name"])
                if stale:
                    patch = [{"op": "test", "path": "/metadata/resourceVersion",
                              "value": channel["metadata"]["resourceVersion"]}]
                    patch += [{"op": "remove", "path": f"/spec/subscribers/{i}"} for i in reversed(stale)]
                    path = self.api.path("messaging.knative.dev/v1", "InMemoryChannel", namespace,
                                         channel["metadata"]["name"])
                    # as the Subscription controller: the channel's webhook lets nobody else change its subscribers
                    if self.api.request("PATCH", path, patch, allow=(409, 422),
                                        content_type="application/json-patch+json", as_user=EVENTING_CONTROLLER) \
                            is not None:
                        dropped += len(stale)
            if settled or time.monotonic() > deadline:
                return dropped
            time.sleep(0.2)

    def _apply(self, documents: list[dict]) -> None:
        if documents:
            kubectl("apply", "-f", "-", kubeconfig=self.plane.admin_kubeconfig,
                    stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))

    def _webhook_service(self, namespace: str, name: str, service: dict) -> None:
        """The release's webhook Service as an ExternalName on a loopback address, and the listener there."""
        assert self.kubelet is not None
        # the port the API server calls: a webhook configuration's service port defaults to 443
        port = next(p for p in service["spec"]["ports"] if p["port"] == 443)
        for _ in range(20):
            address = _loopback_address()
            try:
                self.kubelet.proxy.listen(None, address, port["port"], self.kubelet.target(
                    namespace, service["spec"]["selector"], port.get("targetPort", port["port"])))
                break
            except OSError:
                continue
        else:
            raise KnativeError(f"no free loopback address for the {namespace}/{name} webhook")
        meta = {k: v for k, v in service["metadata"].items() if k in ("name", "namespace", "labels")}
        self._apply([{"apiVersion": "v1", "kind": "Service", "metadata": meta,
                      "spec": {"type": "ExternalName", "externalName": address, "ports": service["spec"]["ports"]}}])

    def _wait_ready(self, deadline: float) -> None:
        last = "nothing checked yet"
        while time.monotonic() < deadline:
            missing = [n for n in WEBHOOK_CONFIGURATIONS if not self._webhook_ready(n)]
            if not missing:
                return
            last = f"webhook configurations not yet reconciled by Knative: {', '.join(missing)}"
            time.sleep(0.5)
        errors = "; ".join(self.kubelet.errors[-5:]) if self.kubelet else ""
        raise KnativeError(f"Knative was not ready in time ({last}; stand-in errors: {errors or 'none'}); "
                           f"the pods' logs are in {self.workdir / 'pods'}")

    def _webhook_ready(self, name: str) -> bool:
        kind = "validatingwebhookconfigurations" if name.startswith("validation.") else "mutatingwebhookconfigurations"
        found = self.api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}", allow=(404,))
        hooks = (found or {}).get("webhooks") or []
        return bool(hooks) and all(h.get("rules") and h["clientConfig"].get("caBundle") for h in hooks)

    def wait_ready(self, api_version: str, kind: str, namespace: str, name: str, timeout: float = 60.0) -> dict:
        """The object once Knative says it is Ready (its Ready condition True)."""
        path = self.api.path(api_version, kind, namespace, name)
        deadline, found = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            found = self.api.get(path, allow=(404,))
            conditions = {c["type"]: c for c in ((found or {}).get("status") or {}).get("conditions") or []}
            if conditions.get("Ready", {}).get("status") == "True":
                return found
            time.sleep(0.2)
        raise KnativeError(f"{kind} {namespace}/{name} was not Ready within {timeout:.0f}s: "
                           f"{((found or {}).get('status') or {}).get('conditions')}")

    def ingress_url(self, namespace: str, broker: str = "default") -> str:
        """The broker's ingress as reached from the host: a loopback port carried to the ingress pod."""
        assert self.kubelet is not None
        if self._ingress_port is None:
            service = self.api.get("/api/v1/namespaces/knative-eventing/services/broker-ingress")
            port = next(p for p in service["spec"]["ports"] if p["port"] == 80)
            self._ingress_port = free_port()
            self.kubelet.proxy.listen(None, "127.0.0.1", self._ingress_port, self.kubelet.target(
                "knative-eventing", service["spec"]["selector"], port.get("targetPort", 80)))
        return f"http://127.0.0.1:{self._ingress_port}/{namespace}/{broker}"

    # -- the Serving stand-in ----------------------------------------------------------------------------

    def serve(self, namespace: str, name: str, port: int) -> str:
        """The Knative Service namespace/name is the function on 127.0.0.1:port; its cluster URL."""
        assert self.kubelet is not None
        if (namespace, name) not in self.functions:
            address = f"10.0.1.{len(self.functions) + 2}"
            self.functions[(namespace, name)] = (address, port)
            self.kubelet.route(address, 80, lambda: (None, "127.0.0.1", self.functions[(namespace, name)][1]))
        else:
            self.functions[(namespace, name)] = (self.functions[(namespace, name)][0], port)
        return f"http://{name}.{namespace}.svc.cluster.local"

    def _function_hosts(self) -> dict[str, str]:
        return {f"{name}.{namespace}.svc.cluster.local": address
                for (namespace, name), (address, _) in self.functions.items()}

    def _serving_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._write_service_status()
            except Exception as exc:  # noqa: BLE001 - reported with the kubelet's
                if self.kubelet:
                    self.kubelet.note(f"Serving stand-in: {exc}")
            self._stop.wait(0.25)

    def _write_service_status(self) -> None:
        items = self.api.get("/apis/serving.knative.dev/v1/services")["items"]
        for service in items:
            meta = service["metadata"]
            if (meta["namespace"], meta["name"]) not in self.functions:
                continue
            status = service_status(service)
            if {k: service.get("status", {}).get(k) for k in status} != status:
                self.api.put(f"/apis/serving.knative.dev/v1/namespaces/{meta['namespace']}/services/"
                             f"{meta['name']}/status", {**service, "status": status})

    # -- the end -----------------------------------------------------------------------------------------

    def rss_mib(self) -> dict[str, float]:
        return self.kubelet.rss_mib() if self.kubelet else {}

    def stop(self) -> None:
        self._stop.set()
        if self._serving.is_alive():
            self._serving.join(timeout=5)
        if self.kubelet is not None:
            self.kubelet.stop()


def service_status(service: dict) -> dict:
    """What Serving's controllers write on a Ready Service (knative/serving pkg/apis/serving/v1
    service_lifecycle.go), with the one revision and route they would make; the URL is cluster-local."""
    meta = service["metadata"]
    url = f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local"
    revision = f"{meta['name']}-00001"
    now = "1970-01-01T00:00:00Z"
    return {"observedGeneration": meta.get("generation", 1), "url": url, "address": {"url": url},
            "latestCreatedRevisionName": revision, "latestReadyRevisionName": revision,
            "traffic": [{"revisionName": revision, "latestRevision": True, "percent": 100}],
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                           for t in ("ConfigurationsReady", "Ready", "RoutesReady")]}

"""Stands in for the parts of a node Knative relies on: the kubelet, kube-proxy, cluster DNS and the endpoints
and deployment controllers, for the Deployments whose image is a Knative command built here.

On a cluster, Knative's controllers write Deployments (the release's, `pingsource-mt-adapter`, one per
ApiServerSource) and the node runs them. Here `Kubelet` watches the Deployments (a LIST every quarter second)
and runs each one whose image is `ko://knative.dev/<eventing|serving>/cmd/<command>` as a `pods.Pod`, with the
container's environment as Kubernetes resolves it (values, fieldRef, configMapKeyRef, secretKeyRef) and a
token of the Deployment's ServiceAccount from the TokenRequest API; a changed pod template restarts it, an
exit restarts it after a second. It then writes what the controllers of a node would: the Deployment's status
(Available) and each selected Service's Endpoints (an address per pod that no traffic uses). Service names
resolve through the hosts file to their ClusterIP, and `pods.Proxy` carries a connection to a ClusterIP:port
to the selected pod's target port. Nothing else of Kubernetes is imitated: no Pod objects, probes or limits.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.pods import Pod, PodError, Proxy, Target
from controlplane.server import ControlPlane

IMAGE_PREFIX = "ko://knative.dev/"


class Kubelet:
    def __init__(self, plane: ControlPlane, api, images: dict[str, Path], workdir: Path,
                 extra_hosts: Callable[[], dict[str, str]] = dict, die_with_parent: bool = False):
        """images: `ko://…` image → binary. extra_hosts: more name → address lines for the hosts file."""
        self.plane, self.api, self.images, self.workdir = plane, api, images, workdir
        self.extra_hosts, self.die_with_parent = extra_hosts, die_with_parent
        self.hosts_file = workdir / "hosts"
        self.hosts_file.write_text("127.0.0.1 localhost\n")
        self.proxy = Proxy()
        self.pods: dict[str, Pod] = {}          # "namespace/deployment" → its one pod
        self._templates: dict[str, str] = {}    # the template hash each pod was started from
        self._exited: dict[str, float] = {}
        self._routes: dict[tuple[str, int], Callable[[], Target | None]] = {}
        self._services: list[dict] = []
        self._endpoints: dict[str, Any] = {}
        self._available: dict[str, int] = {}
        self._tokens: dict[str, Path] = {}
        self._next_ip = 1
        self.hosts_changed = time.monotonic()
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="kubelet stand-in", daemon=True)

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # A sync may be starting a pod (up to 10 s for its namespace, more on a loaded machine): wait for it, so that
        # no pod it starts is left running with nobody to stop it (its Popen collected while the process runs).
        self._thread.join(timeout=60)
        for pod in list(self.pods.values()):
            pod.stop()
        self.proxy.stop()

    def route(self, address: str, port: int, target: Callable[[], Target | None]) -> None:
        """Make address:port reach target from inside every pod (e.g. a function on the host's loopback)."""
        self._routes[(address, port)] = target
        for pod in list(self.pods.values()):
            if pod.netns is not None:
                self._listen(pod, address, port, target)

    def _listen(self, pod: Pod, address: str, port: int, target: Callable[[], Target | None]) -> None:
        try:
            self.proxy.listen(pod.netns, address, port, target)
        except OSError as exc:
            self.note(f"pod {pod.name}: no listener on {address}:{port}: {exc}")

    def pod_for(self, namespace: str, selector: dict[str, str]) -> Pod | None:
        for key, pod in list(self.pods.items()):  # the sync loop replaces pods meanwhile
            if key.startswith(namespace + "/") and pod.running and selector and \
                    all(pod.labels.get(k) == v for k, v in selector.items()):
                return pod
        return None

    def target(self, namespace: str, selector: dict[str, str], target_port: Any) -> Callable[[], Target | None]:
        def choose() -> Target | None:
            pod = self.pod_for(namespace, selector)
            if pod is None or pod.netns is None:
                return None
            port = pod.ports.get(target_port) if isinstance(target_port, str) else target_port
            return (pod.netns, "127.0.0.1", int(port)) if port else None
        return choose

    # -- the loop ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the stand-in keeps going; the errors are reported
                self.note(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.25)

    def kill(self, key: str, timeout: float = 30.0) -> float:
        """SIGKILL the pod of Deployment `key` ("namespace/name"), as an OOM kill or a lost node does, and wait until
        this kubelet has started it again (its restart loop, after its back-off); the seconds that took."""
        pod, started = self.pods[key], time.monotonic()
        if pod.process is not None and pod.process.poll() is None:
            try:
                os.killpg(pod.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pod.process.wait(timeout=10)
        while time.monotonic() - started < timeout:
            again = self.pods.get(key)
            if again is not None and again is not pod and again.running:
                return time.monotonic() - started
            time.sleep(0.1)
        raise PodError(f"pod {key} was not started again within {timeout:.0f} s; errors: {self.errors[-3:]}")

    def note(self, error: str) -> None:
        if error not in self.errors:
            self.errors.append(error)
            del self.errors[:-20]
            with open(self.workdir / "kubelet.log", "a") as log:
                log.write(f"{time.strftime('%H:%M:%S')} {error}\n")

    def sync(self) -> None:
        deployments = self.api.get("/apis/apps/v1/deployments")["items"]
        self._services = self.api.get("/api/v1/services")["items"]
        wanted = {}
        for deployment in deployments:
            image = _container(deployment).get("image", "")
            if image.startswith(IMAGE_PREFIX) and image in self.images and \
                    deployment["spec"].get("replicas", 1) != 0:
                wanted[_key(deployment)] = deployment
        for key in [k for k in self.pods if k not in wanted]:
            self._remove(key)
        for key, deployment in wanted.items():
            try:
                self._run(key, deployment)
            except (PodError, OSError, RuntimeError) as exc:  # one pod's trouble holds up no other
                self.note(f"pod {key}: {exc}")
        self._sync_routes()
        self._write_hosts()
        self._sync_endpoints()
        for key, deployment in wanted.items():
            self._write_status(key, deployment)
        for deployment in deployments:  # scaled to 0 (pingsource-mt-adapter until a PingSource exists): no pod
            if deployment["spec"].get("replicas", 1) == 0 and _container(deployment).get("image", "") in self.images:
                self._write_scaled_to_zero(deployment)

    def _run(self, key: str, deployment: dict) -> None:
        template = json.dumps(deployment["spec"]["template"], sort_keys=True)
        pod = self.pods.get(key)
        if pod is not None and pod.running and self._templates.get(key) == template:
            return
        if pod is not None and not pod.running:
            exited = self._exited.setdefault(key, time.monotonic())
            if time.monotonic() - exited < 1:
                return  # a crash loop's back-off
            self.note(f"pod {key} exited with {pod.process.returncode if pod.process else '?'}: restarting it")
        # A changed template rolls as a Deployment's default RollingUpdate does with one replica (maxSurge 25% →
        # 1, maxUnavailable 25% → 0): the new pod starts before the old one stops. An exited pod goes first.
        old = pod if pod is not None and pod.running else None
        if pod is not None and old is None:
            self._remove(key)
        pod = self._make_pod(key, deployment, hashlib.sha256(template.encode()).hexdigest()[:10])
        try:
            pod.start(self.die_with_parent)
            self.proxy.listen(pod.netns, "127.0.0.1", self.plane.port, lambda: (None, "127.0.0.1", self.plane.port))
            for (address, port), choose in self._routes.items():
                self._listen(pod, address, port, choose)
            pod.release()
        except (PodError, OSError) as exc:
            self.note(f"pod {key}: {exc}")
            pod.stop()
            self._exited[key] = time.monotonic()
            return  # the old pod, if any, runs on
        if self._stop.is_set():  # stopped while this pod started: stop() may have run its course already
            self.proxy.forget(pod.netns)
            pod.stop()
            return
        self.pods[key], self._templates[key] = pod, template
        if old is not None:
            self.proxy.forget(old.netns)
            old.stop()

    def _remove(self, key: str) -> None:
        pod = self.pods.pop(key)
        self.proxy.forget(pod.netns)
        pod.stop()
        self._exited[key] = time.monotonic()
        self._available.pop(key, None)

    def _make_pod(self, key: str, deployment: dict, suffix: str) -> Pod:
        namespace, name = key.split("/")
        spec = deployment["spec"]["template"]["spec"]
        container = _container(deployment)
        pod_name = f"{name}-{suffix}"
        account = spec.get("serviceAccountName") or "default"
        self._next_ip += 1
        ip = f"10.0.2.{self._next_ip % 250 + 2}"
        facts = {"metadata.name": pod_name, "metadata.namespace": namespace, "spec.serviceAccountName": account,
                 "spec.nodeName": "vmevents", "status.podIP": ip, "status.hostIP": ip}
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp",
               "KUBECONFIG": str(self._token(namespace, account))}
        for item in container.get("env", []):
            env[item["name"]] = self._value(namespace, item, facts)
        argv = [str(self.images[container["image"]]), *container.get("command", [])[1:], *container.get("args", [])]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if p.get("name")}
        return Pod(pod_name, argv, env, self.workdir / "pods", self.hosts_file,
                   labels=deployment["spec"]["template"]["metadata"].get("labels", {}), ports=ports, ip=ip)

    def _value(self, namespace: str, item: dict, facts: dict[str, str]) -> str:
        if "valueFrom" not in item:
            return str(item.get("value", ""))
        source = item["valueFrom"]
        if "fieldRef" in source:
            return facts[source["fieldRef"]["fieldPath"]]
        for kind, ref in (("configmaps", source.get("configMapKeyRef")), ("secrets", source.get("secretKeyRef"))):
            if ref:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{ref['name']}", allow=(404,))
                data = (found or {}).get("data") or {}
                if ref["key"] in data:
                    return data[ref["key"]] if kind == "configmaps" else _b64(data[ref["key"]])
                if ref.get("optional"):
                    return ""
                raise PodError(f"{item['name']}: {kind} {namespace}/{ref['name']} has no key {ref['key']}")
        raise PodError(f"{item['name']}: a valueFrom this stand-in does not resolve: {source}")

    def _token(self, namespace: str, account: str) -> Path:
        key = f"{namespace}/{account}"
        if key not in self._tokens:
            answer = self.api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                                   {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 86400}})
            self._tokens[key] = self.plane.write_kubeconfig(f"pod-{namespace}-{account}",
                                                            {"token": answer["status"]["token"]}, namespace)
        return self._tokens[key]

    # -- what kube-proxy, DNS and the controllers of a node do -------------------------------------------

    def _sync_routes(self) -> None:
        for service in self._services:
            spec, meta = service["spec"], service["metadata"]
            if (meta["namespace"], meta["name"]) == ("default", "kubernetes") and (spec["clusterIP"], 443) \
                    not in self._routes:  # its Endpoints are the API server's own address
                self.route(spec["clusterIP"], 443, lambda: (None, "127.0.0.1", self.plane.port))
            ip = spec.get("clusterIP")
            if not ip or ip == "None" or not spec.get("selector"):
                continue
            for port in spec.get("ports", []):
                # Only the ports below 1024 (80, 443): every Knative component binds its own ports (8080, 8443,
                # 9090, 9092, …) on all its interfaces, so a listener on one of those in its namespace would clash.
                if port["port"] < 1024 and (ip, port["port"]) not in self._routes:
                    self.route(ip, port["port"], self.target(meta["namespace"], spec["selector"],
                                                             port.get("targetPort", port["port"])))

    def hosts(self) -> dict[str, str]:
        """name → address, as cluster DNS would answer (an ExternalName follows its target)."""
        names = {}
        for service in self._services:
            meta, spec = service["metadata"], service["spec"]
            ip = spec.get("clusterIP")
            if ip and ip != "None":
                names[f"{meta['name']}.{meta['namespace']}.svc.cluster.local"] = ip
        names.update(self.extra_hosts())
        for service in self._services:
            meta, spec = service["metadata"], service["spec"]
            if spec.get("type") == "ExternalName" and spec.get("externalName") in names:
                names[f"{meta['name']}.{meta['namespace']}.svc.cluster.local"] = names[spec["externalName"]]
        return names

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"]
        for name, ip in sorted(self.hosts().items()):
            lines.append(f"{ip} {name} {name.removesuffix('.cluster.local')}")
        text = "\n".join(lines) + "\n"
        if self.hosts_file.read_text() != text:
            with open(self.hosts_file, "w") as out:  # in place: the pods' bind mounts hold this inode
                out.write(text)
            self.hosts_changed = time.monotonic()

    def wait_names(self, timeout: float = 30.0) -> None:
        """Until every pod sees the hosts file as it is now: Go's resolver re-reads it at most every 5 s
        (net/hosts.go cacheMaxAge), a name cluster DNS would answer at once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self.hosts_changed < 5.5:
            time.sleep(0.1)

    def _sync_endpoints(self) -> None:
        for service in self._services:
            meta, spec = service["metadata"], service["spec"]
            if not spec.get("selector") or not any(k.startswith(meta["namespace"] + "/") for k in self.pods):
                continue
            pod = self.pod_for(meta["namespace"], spec["selector"])
            subsets = []
            if pod is not None:
                ports = [{"name": p.get("name", ""), "port": int(pod.ports.get(p.get("targetPort"), 0)
                                                              if isinstance(p.get("targetPort"), str)
                                                              else p.get("targetPort", p["port"])),
                          "protocol": p.get("protocol", "TCP")} for p in spec.get("ports", [])]
                subsets = [{"addresses": [{"ip": pod.ip}], "ports": ports}]
            key = f"{meta['namespace']}/{meta['name']}"
            if self._endpoints.get(key) == subsets:
                continue
            path = f"/api/v1/namespaces/{meta['namespace']}/endpoints"
            body = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": meta["name"]}, "subsets": subsets}
            if self.api.get(f"{path}/{meta['name']}", allow=(404,)) is None:
                self.api.post(path, body)
            else:
                self.api.put(f"{path}/{meta['name']}", body)
            self._endpoints[key] = subsets

    def _write_status(self, key: str, deployment: dict) -> None:
        pod = self.pods.get(key)
        generation = deployment["metadata"].get("generation", 1)
        if pod is None or not pod.running or self._available.get(key) == generation:
            return
        namespace, name = key.split("/")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                  "availableReplicas": 1, "conditions": [
                      {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                       "lastUpdateTime": now, "lastTransitionTime": now},
                      {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                       "lastUpdateTime": now, "lastTransitionTime": now}]}
        self.api.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status", {"status": status})
        self._available[key] = generation

    def _write_scaled_to_zero(self, deployment: dict) -> None:
        """What kube-controller-manager's deployment controller writes for a Deployment of 0 replicas: Available, its
        minimum of 0 met (pkg/controller/deployment/sync.go syncDeploymentStatus; util.DeploymentComplete)."""
        key, generation = _key(deployment), deployment["metadata"].get("generation", 1)
        if self._available.get(key) == generation:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        namespace, name = key.split("/")
        self.api.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status", {"status": {
            "observedGeneration": generation, "replicas": 0, "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "lastUpdateTime": now, "lastTransitionTime": now}]}})
        self._available[key] = generation

    def rss_mib(self) -> dict[str, float]:
        return {key: pod.rss_mib() for key, pod in self.pods.items() if pod.running}


def _container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"].get("containers") or [{}]
    return containers[0]


def _key(obj: dict) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _b64(value: str) -> str:
    import base64

    return base64.b64decode(value).decode()

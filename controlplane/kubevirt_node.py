"""KubeVirt on the real node, as an operator installs it: virt-operator from the release's own manifest (rendered by
KubeVirt's generators at the node's version: `kubevirt-manifests operator`), then a KubeVirt CR; virt-operator then
installs the rest itself (CRDs, RBAC, certificates, virt-api and its webhooks and aggregated API, virt-controller,
virt-handler). Every image is built here (controlplane/images.py) and imported into the node's containerd.

The KubeVirt CR says what this machine needs: `developerConfiguration.useEmulation` (its /dev/kvm cannot run a
guest: docs/control-plane.md, "The real node"), one replica of virt-api and virt-controller (`infra.replicas`: one
node), and the images pulled only if missing (none is pullable).
"""
from __future__ import annotations

import subprocess
import time
from typing import Any

import yaml

from controlplane import build, images

NAMESPACE = "kubevirt"
KUBEVIRT_CR = {
    "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": NAMESPACE},
    "spec": {
        "imagePullPolicy": "IfNotPresent",
        "infra": {"replicas": 1},
        "configuration": {"developerConfiguration": {"useEmulation": True}},
    },
}


class KubeVirtNodeError(RuntimeError):
    """KubeVirt did not come up on the node: the message says what was last seen."""


def operator_manifest(registry: str, tag: str) -> list[dict]:
    """The release's kubevirt-operator.yaml at the node's version, from KubeVirt's own generators."""
    binary = build.ensure(build.KUBEVIRT_NODE) / "kubevirt-manifests"
    done = subprocess.run([str(binary), "operator", NAMESPACE, registry, tag], capture_output=True, text=True,
                          check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


class KubeVirtNode:
    def __init__(self, plane: Any, node: Any):
        self.plane, self.node = plane, node
        self.images: images.KubeVirtImages | None = None
        self.guest: images.Image | None = None
        self.started_after = 0.0

    def start(self, timeout: float = 600.0, say=lambda text: None) -> KubeVirtNode:
        from controlplane.cluster import kubectl

        started = time.monotonic()
        self.images = images.kubevirt(say)
        self.guest = images.guest(say)   # the guests' image (controlplane/guest/), for the VMs a person or test makes
        for archive in (*self.images.archives, self.guest.archive):
            self.node.import_image(archive)
        manifest = operator_manifest(self.images.registry, self.images.tag)
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", kubeconfig=self.plane.admin_kubeconfig,
                stdin="\n---\n".join(yaml.safe_dump(d) for d in manifest))
        self._wait(lambda: self._established("kubevirts.kubevirt.io"), "the KubeVirt CRD", time.monotonic() + 60)
        kubectl("apply", "--server-side", "-f", "-", kubeconfig=self.plane.admin_kubeconfig,
                stdin=yaml.safe_dump(KUBEVIRT_CR))
        self._wait(self._deployed, "KubeVirt Deployed", time.monotonic() + timeout)
        self._wait(self._schedulable, f"node {self.node.name} labelled kubevirt.io/schedulable=true by virt-handler",
                   time.monotonic() + 120)
        self.started_after = time.monotonic() - started
        say(f"KubeVirt {self.images.tag} deployed on the node in {self.started_after:.0f}s; the guests' image: "
            f"{self.guest.name}")
        return self

    # -- waiting -----------------------------------------------------------------------------------------

    def _get(self, path: str) -> dict | None:
        import json
        import ssl
        import urllib.error
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.plane.pki.ca_cert))
        context.load_cert_chain(str(self.plane.pki.admin_cert), str(self.plane.pki.admin_key))
        try:
            with urllib.request.urlopen(f"{self.plane.url}{path}", context=context, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _established(self, name: str) -> str | None:
        crd = self._get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
        conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        return None if conditions.get("Established") == "True" else f"conditions {conditions}"

    def _deployed(self) -> str | None:
        kv = self._get(f"/apis/kubevirt.io/v1/namespaces/{NAMESPACE}/kubevirts/kubevirt") or {}
        status = kv.get("status") or {}
        if status.get("phase") == "Deployed":
            return None
        pods = self._get(f"/api/v1/namespaces/{NAMESPACE}/pods") or {}
        summary = ", ".join(pod_summary(p) for p in pods.get("items") or [])
        return f"phase {status.get('phase')!r}; pods: {summary or 'none'}"

    def _schedulable(self) -> str | None:
        node = self._get(f"/api/v1/nodes/{self.node.name}") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        return None if labels.get("kubevirt.io/schedulable") == "true" else f"labels {sorted(labels)}"

    def _wait(self, check, what: str, deadline: float) -> None:
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last is None:
                return
            time.sleep(1)
        raise KubeVirtNodeError(f"timed out waiting for {what}: {last}")


def pod_summary(pod: dict) -> str:
    """`name Phase container:state[/reason]…`, for a message saying where a start stands."""
    parts = [pod["metadata"]["name"], str(pod.get("status", {}).get("phase"))]
    status_of = pod.get("status", {})
    for status in (status_of.get("initContainerStatuses") or []) + (status_of.get("containerStatuses") or []):
        state = status.get("state") or {}
        kind = next(iter(state), "?")
        reason = (state.get(kind) or {}).get("reason")
        parts.append(f"{status['name']}:{kind}{'/' + reason if reason else ''}")
    return " ".join(parts)

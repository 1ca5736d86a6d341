"""Stands in for client-go as virt-controller, virt-handler, the kubelet and the scheduler use it: every API call
the simulated KubeVirt makes, with the real `kubernetes` client, answering plain dicts and counting writes, and
Events recorded best effort as client-go's recorder (and its EventCorrelator) does.
"""
from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from simcluster.kubevirt.objects import API_VERSION, GROUP, meta_of, rfc3339

log = logging.getLogger(__name__)


MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class Kube:
    """Thin wrapper over the real `kubernetes` client; answers plain dicts and counts writes."""

    def __init__(self, api_client: Any, on_write: Callable[[], None]):
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._on_write = on_write

    # -- KubeVirt objects
    def get(self, plural: str, ns: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, API_VERSION, ns, plural, name)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer, the rest propagates
            if http_status(exc) == 404:
                return None
            raise

    def list(self, plural: str) -> list[dict]:
        return self.custom.list_cluster_custom_object(GROUP, API_VERSION, plural).get("items") or []

    def get_object(self, group: str, version: str, plural: str, ns: str | None, name: str) -> dict | None:
        """Any other group's object (instancetypes, ControllerRevisions); None when it does not exist."""
        try:
            if ns is None:
                return self.custom.get_cluster_custom_object(group, version, plural, name)
            return self.custom.get_namespaced_custom_object(group, version, ns, plural, name)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer, the rest propagates
            if http_status(exc) == 404:
                return None
            raise

    def create_object(self, group: str, version: str, plural: str, ns: str, body: dict) -> dict | None:
        self._on_write()
        try:
            return self.custom.create_namespaced_custom_object(group, version, ns, plural, body)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 409:
                return None  # already there (storeRevision then compares and reuses it)
            raise

    def create(self, plural: str, ns: str, body: dict) -> dict | None:
        self._on_write()
        try:
            return self.custom.create_namespaced_custom_object(GROUP, API_VERSION, ns, plural, body)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 409:
                return None  # already there: the next sync sees it
            raise

    def patch(self, plural: str, ns: str, name: str, body: Any, *, status: bool = False) -> dict | None:
        self._on_write()
        ctype = JSON_PATCH if isinstance(body, list) else MERGE_PATCH
        fn = self.custom.patch_namespaced_custom_object_status if status else self.custom.patch_namespaced_custom_object
        try:
            return fn(GROUP, API_VERSION, ns, plural, name, body, _content_type=ctype)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) in (404, 409, 422):  # gone, or a precondition (test op) failed
                log.debug("patch %s %s/%s not applied: %s", plural, ns, name, exc)
                return None
            raise

    def delete(self, plural: str, ns: str, name: str, uid: str | None = None) -> bool:
        from kubernetes import client

        self._on_write()
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
        try:
            self.custom.delete_namespaced_custom_object(GROUP, API_VERSION, ns, plural, name, body=body)
            return True
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) in (404, 409):  # gone already, or a different object by now
                return False
            raise

    # -- what the scheduler and the kubelet stand-ins read
    def nodes(self) -> list[dict]:
        resp = self.core.list_node(_preload_content=False)
        return json.loads(resp.data).get("items") or []

    def pvc(self, ns: str, name: str) -> dict | None:
        try:
            return json.loads(self.core.read_namespaced_persistent_volume_claim(name, ns, _preload_content=False).data)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 404:
                return None
            raise

    def pv(self, name: str) -> dict | None:
        try:
            return json.loads(self.core.read_persistent_volume(name, _preload_content=False).data)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 404:
                return None
            raise

    def nad(self, ns: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object("k8s.cni.cncf.io", "v1", ns,
                                                            "network-attachment-definitions", name)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 404:
                return None
            raise

    def longhorn_volume(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object("longhorn.io", "v1beta2", "longhorn-system", "volumes",
                                                            name)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) == 404:
                return None
            raise

    # -- launcher pods
    def pods(self, ns: str | None = None, selector: str = "kubevirt.io=virt-launcher") -> list[dict]:
        if ns is None:
            resp = self.core.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
        else:
            resp = self.core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def create_pod(self, ns: str, body: dict) -> None:
        self._on_write()
        self.core.create_namespaced_pod(ns, body)

    def bind_pod(self, ns: str, name: str, node: str) -> None:
        """What the scheduler does: POST the pod's binding subresource (spec.nodeName cannot be patched)."""
        self._on_write()
        answer = self.api_client.call_api(*self.api_client.param_serialize(
            method="POST", resource_path=f"/api/v1/namespaces/{ns}/pods/{name}/binding",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
            auth_settings=["BearerToken"]))
        answer.read()
        if answer.status >= 300:
            raise RuntimeError(f"binding pod {ns}/{name} to {node}: HTTP {answer.status}: {answer.data[:300]!r}")

    def patch_pod(self, ns: str, name: str, body: dict, *, status: bool = False) -> None:
        self._on_write()
        fn = self.core.patch_namespaced_pod_status if status else self.core.patch_namespaced_pod
        try:
            fn(name, ns, body, _content_type=MERGE_PATCH)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) != 404:
                raise

    def delete_pod(self, ns: str, name: str, uid: str | None = None) -> None:
        from kubernetes import client

        self._on_write()
        body = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            self.core.delete_namespaced_pod(name, ns, body=body)
        except Exception as exc:  # noqa: BLE001
            if http_status(exc) not in (404, 409):
                raise

    # -- Events (best effort, as the real recorder: a failure is logged, never fatal)
    def record(self, obj: Mapping, etype: str, reason: str, message: str, component: str, now: datetime) -> None:
        meta = meta_of(obj)
        stamp = rfc3339(now)
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": etype, "reason": reason, "message": message,
            "source": {"component": component},
            "reportingComponent": component, "reportingInstance": f"{component}-sim",
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not record Event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)

    def record_counted(self, obj: Mapping, etype: str, reason: str, message: str, component: str,
                       now: datetime, field_path: str | None = None) -> None:
        """client-go's EventCorrelator: the same Event again raises `count` on the existing object. `field_path`:
        the part of the object it is about (the kubelet's `spec.initContainers{name}`)."""
        import hashlib

        meta = meta_of(obj)
        key = "\x00".join((meta.get("uid") or "", reason, message, field_path or ""))
        name = f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        stamp = rfc3339(now)
        try:
            existing = self.core.read_namespaced_event(name, meta["namespace"], _preload_content=False)
            current = json.loads(existing.data)
        except Exception as exc:  # noqa: BLE001 - 404: the first time
            if http_status(exc) != 404:
                log.warning("could not read Event %s: %s", name, exc)
                return
            current = None
        try:
            if current is None:
                self.core.create_namespaced_event(meta["namespace"], {
                    "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": meta["namespace"]},
                    "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                                       "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                                       **({"fieldPath": field_path} if field_path else {})},
                    "type": etype, "reason": reason, "message": message, "source": {"component": component},
                    "reportingComponent": component, "reportingInstance": f"{component}-sim",
                    "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})
            else:
                self.core.patch_namespaced_event(name, meta["namespace"], {
                    "count": int(current.get("count") or 1) + 1, "lastTimestamp": stamp})
        except Exception as exc:  # noqa: BLE001 - best effort, as the real recorder
            log.warning("could not record Event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


    def record_series(self, obj: Mapping, etype: str, reason: str, message: str, component: str, action: str,
                      now: datetime) -> None:
        """client-go's events.k8s.io recorder (tools/events, kube-scheduler's), as a core/v1 read shows its Events:
        the first is created with `eventTime`, `action` and no series, `count`, timestamps or `source`; a repeat of the
        same type, action, reason and object — whatever its message — raises `series.count` (2, 3, …) and
        `series.lastObservedTime`, and the message stays the first one's (event_broadcaster.go recordToSink,
        getKey; pkg/apis/events/v1/conversion.go). docs/facts.md §7."""
        import hashlib

        meta = meta_of(obj)
        key = "\x00".join((meta.get("uid") or "", etype, reason, action))
        name = f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        micro = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            existing = self.core.read_namespaced_event(name, meta["namespace"], _preload_content=False)
            current = json.loads(existing.data)
        except Exception as exc:  # noqa: BLE001 - 404: the first time
            if http_status(exc) != 404:
                log.warning("could not read Event %s: %s", name, exc)
                return
            current = None
        try:
            if current is None:
                self.core.create_namespaced_event(meta["namespace"], {
                    "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": meta["namespace"]},
                    "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                                       "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
                    "type": etype, "reason": reason, "message": message, "action": action, "eventTime": micro,
                    "reportingComponent": component, "reportingInstance": f"{component}-sim"})
            else:
                count = int(((current.get("series") or {}).get("count")) or 1) + 1
                self.core.patch_namespaced_event(name, meta["namespace"], {
                    "series": {"count": count, "lastObservedTime": micro}})
        except Exception as exc:  # noqa: BLE001 - best effort, as the real recorder
            log.warning("could not record Event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


def http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None

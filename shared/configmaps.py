"""The state vmevents keeps besides its Events: a ConfigMap in its own namespace, named by a setting
("namespace/name"), read with its resourceVersion and written back at exactly that version.

Two functions keep one: device-conflict its parameter object (which VM each device is assigned to), and
migration-report its re-scan's cursor (how far it has read the VMIMs' changes). A write names the version it
read, so two writers can never both win: the second gets Conflict (409) and reads again, or gives way.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.kinds import Kind
from shared.kube import Kube

CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")


@dataclass(frozen=True)
class Stored:
    """A ConfigMap as read: its data, its annotations and the resourceVersion a write must name."""

    data: dict[str, str]
    resource_version: str
    annotations: dict[str, str] = field(default_factory=dict)


def read(kube: Kube, where: tuple[str, str]) -> Stored | None:
    """The ConfigMap, or None when it does not exist."""
    found = kube.get(CONFIG_MAP, *where)
    if found is None:
        return None
    meta = found.get("metadata") or {}
    return Stored(dict(found.get("data") or {}), str(meta.get("resourceVersion") or ""),
                  dict(meta.get("annotations") or {}))


def put(kube: Kube, where: tuple[str, str], stored: Stored | None, data: Mapping[str, str],
        annotations: Mapping[str, str], managed_by: str) -> None:
    """Create the ConfigMap (`stored` None), or replace it at exactly the version read. Conflict when it changed
    meanwhile, or was created by someone else first."""
    namespace, name = where
    metadata: dict = {"name": name, "namespace": namespace, "labels": {
        "app.kubernetes.io/part-of": "vmevents", "app.kubernetes.io/managed-by": managed_by}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}
    if stored is None:
        kube.create(CONFIG_MAP, namespace, body)
    else:
        metadata["resourceVersion"] = stored.resource_version  # a replace at exactly this version, or 409
        kube.request("PUT", CONFIG_MAP.path(namespace, name), body=body)

"""The cheap forms of a LIST, as kube-apiserver answers them: Table and PartialObjectMetadataList.

kube-apiserver picks the form from the Accept header (k8s.io/apiserver endpoints/handlers/response.go,
`transformObject`; rest.go `negotiation`): `application/json;as=Table;v=v1;g=meta.k8s.io` answers a
meta.k8s.io/v1 Table whose columns are, for a custom resource, "Name" then the CRD version's
additionalPrinterColumns (apiextensions-apiserver registry/customresource/tableconvertor), each row's
`object` the PartialObjectMetadata of the object (includeObject=Metadata, the default), the full object
(Object) or nothing (None); `...;as=PartialObjectMetadataList;...` answers the items' metadata only. A
server that cannot give any form the Accept header names answers 406. The printer columns are KubeVirt's
(PRINTER_COLUMNS below, from virt-operator's crds.go; controlplane/crds.py installs the same on a real
server). Other custom resources get Name and Age, the default: Longhorn's and the other vendored CRDs'
columns are not read (nothing lists them as a Table). Built-in kinds (Pods, Events) have their own printers
in kube-apiserver, which the simulator does not reproduce: a Table of them is a 406 here.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from simcluster.store import ApiError, ResourceType

META = "meta.k8s.io"
_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name",
                "description": "Name must be unique within a namespace. Is required when creating resources, "
                               "although some resources may allow a client to request the generation of an "
                               "appropriate name automatically. Name is primarily intended for creation "
                               "idempotence and configuration definition. Cannot be updated. More info: "
                               "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
                "priority": 0}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_PHASE = {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}

# KubeVirt's additionalPrinterColumns, per plural of group kubevirt.io (migrationpolicies:
# migrations.kubevirt.io), copied from virt-operator's pkg/virt-operator/resource/generate/components/crds.go;
# controlplane/crds.py installs them in the CRDs of a real server.
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "virtualmachineinstances": [
        _AGE, _PHASE,
        {"name": "IP", "type": "string", "jsonPath": ".status.interfaces[0].ipAddress"},
        {"name": "NodeName", "type": "string", "jsonPath": ".status.nodeName"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Ready')].status"},
        {"name": "Live-Migratable", "type": "string", "priority": 1,
         "jsonPath": ".status.conditions[?(@.type=='LiveMigratable')].status"},
        {"name": "Paused", "type": "string", "priority": 1,
         "jsonPath": ".status.conditions[?(@.type=='Paused')].status"}],
    "virtualmachines": [
        _AGE, {"name": "Status", "description": "Human Readable Status", "type": "string",
               "jsonPath": ".status.printableStatus"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Ready')].status"}],
    "virtualmachineinstancemigrations": [
        {**_PHASE, "description": "The current phase of VM instance migration"},
        {"name": "VMI", "type": "string", "jsonPath": ".spec.vmiName",
         "description": "The name of the VMI to perform the migration on"}],
    "kubevirts": [_AGE, _PHASE],
    "migrationpolicies": [],
}
_KUBEVIRT_GROUPS = ("kubevirt.io", "migrations.kubevirt.io")


def wanted_form(accept: str | None) -> str | None:
    """"Table", "PartialObjectMetadataList" / "PartialObjectMetadata", or None for the plain object form.
    Raises 406 when Accept names only forms the server does not have."""
    plain = not accept
    for part in (accept or "").split(","):
        media, *params = [p.strip() for p in part.split(";")]
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if media not in ("application/json", "*/*", "application/*"):
            continue
        if "as" not in options:
            plain = True
            continue
        if options.get("g") == META and options.get("v") in ("v1", "v1beta1") and \
                options["as"] in ("Table", "PartialObjectMetadataList", "PartialObjectMetadata"):
            return options["as"]
    if plain:
        return None
    raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: application/json, "
                                         f"application/yaml, application/vnd.kubernetes.protobuf (asked: {accept})")


def partial(obj: dict) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": f"{META}/v1", "metadata": obj.get("metadata") or {}}


def metadata_list(items: list[dict], metadata: dict) -> dict:
    return {"kind": "PartialObjectMetadataList", "apiVersion": f"{META}/v1", "metadata": metadata,
            "items": [partial(item) for item in items]}


def table(rt: ResourceType, items: list[dict], metadata: dict, include: str, now: datetime | None = None) -> dict:
    if not rt.group:
        raise ApiError(406, "NotAcceptable", f"the vmevents simulator has no Table printer for built-in "
                                             f"{rt.plural} (kube-apiserver does)")
    if include not in ("Metadata", "None", "Object"):
        raise ApiError(400, "BadRequest", f'includeObject: Unsupported value: "{include}": supported values: '
                                          f'"Metadata", "None", "Object"')
    columns = printer_columns(rt)
    now = now or datetime.now(UTC)
    rows = []
    for item in items:
        row: dict[str, Any] = {"cells": [(item.get("metadata") or {}).get("name")]
                               + [_cell(column, item, now) for column in columns]}
        row["object"] = None if include == "None" else item if include == "Object" else partial(item)
        rows.append(row)
    definitions = [_NAME_COLUMN] + [{"name": c["name"], "type": c["type"], "format": c.get("format", ""),
                                     "description": c.get("description", ""), "priority": c.get("priority", 0)}
                                    for c in columns]
    return {"kind": "Table", "apiVersion": f"{META}/v1", "metadata": metadata, "columnDefinitions": definitions,
            "rows": rows}


def printer_columns(rt: ResourceType) -> list[dict]:
    """A custom resource's columns after Name: its additionalPrinterColumns, else Age (the default)."""
    if rt.group in _KUBEVIRT_GROUPS:
        return list(PRINTER_COLUMNS.get(rt.plural) or ()) or [_AGE]
    return [_AGE]


def _cell(column: dict, obj: dict, now: datetime) -> Any:
    """tableconvertor: the first result of the column's JSONPath; a string column printed, a date as an age."""
    value = json_path(obj, column["jsonPath"])
    if value is None:
        return None
    if column["type"] == "date":
        try:
            when = datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return None
        return human_duration((now - when).total_seconds())
    if column["type"] == "string":
        return value if isinstance(value, str) else _printed(value)
    return value


def _printed(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\?\(@\.([\w-]+)==['\"]([^'\"]*)['\"]\)\]")


def json_path(obj: Any, path: str) -> Any:
    """The first value of the simple JSONPaths printer columns use (`.a.b`, `[0]`, `[?(@.type=='Ready')]`)."""
    values = [obj]
    at = 0
    for match in _SEGMENT.finditer(path):
        if match.start() != at:
            return None
        at = match.end()
        key, index, field, wanted = match.groups()
        found: list = []
        for value in values:
            if key is not None and isinstance(value, dict) and key in value:
                found.append(value[key])
            elif index is not None and isinstance(value, list) and int(index) < len(value):
                found.append(value[int(index)])
            elif field is not None and isinstance(value, list):
                found += [v for v in value if isinstance(v, dict) and str(v.get(field)) == wanted]
        values = found
    if at != len(path) or not values:
        return None
    return values[0]


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"

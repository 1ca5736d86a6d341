"""The resource types the functions read and write, and where each lives in the API: no client in here."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    """One resource type: where it lives in the API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The request path. Every caller-given segment is percent-escaped (no `/`, `?`, `#` or `..` survives),
        so a name can never turn a GET into another resource's GET, a WATCH or a query: at worst it names
        an object that does not exist."""
        root = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(_segment(name))
        if subresource:
            parts.append(_segment(subresource))
        return "/".join(parts)


def _segment(text: str) -> str:
    """One path segment, escaped; `.` and `..` (which a URL resolver would collapse) are escaped too."""
    escaped = quote(str(text), safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


VMI = Kind("kubevirt.io/v1", "VirtualMachineInstance", "virtualmachineinstances")
VM = Kind("kubevirt.io/v1", "VirtualMachine", "virtualmachines")
VMIM = Kind("kubevirt.io/v1", "VirtualMachineInstanceMigration", "virtualmachineinstancemigrations")
KUBEVIRT = Kind("kubevirt.io/v1", "KubeVirt", "kubevirts")
MIGRATION_POLICY = Kind("migrations.kubevirt.io/v1alpha1", "MigrationPolicy", "migrationpolicies", namespaced=False)
POD = Kind("v1", "Pod", "pods")
EVENT = Kind("v1", "Event", "events")
NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
PVC = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
PV = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
LONGHORN_VOLUME = Kind("longhorn.io/v1beta2", "Volume", "volumes")
LONGHORN_ENGINE = Kind("longhorn.io/v1beta2", "Engine", "engines")
NODE = Kind("v1", "Node", "nodes", namespaced=False)
VOLUME_ATTACHMENT = Kind("storage.k8s.io/v1", "VolumeAttachment", "volumeattachments", namespaced=False)
HARVESTER_SETTING = Kind("harvesterhci.io/v1beta1", "Setting", "settings", namespaced=False)
HARVESTER_UPGRADE = Kind("harvesterhci.io/v1beta1", "Upgrade", "upgrades")
KINDS = {k.kind: k for k in (VMI, VM, VMIM, KUBEVIRT, MIGRATION_POLICY, POD, EVENT, NAMESPACE, PVC, PV)}


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def api_verb(method: str, path: str, query: dict | None = None) -> tuple[str, str]:
    """The Kubernetes verb and resource of a request, as the API server's audit and metrics name them (get, list,
    watch, create, ...; `virtualmachines`, `virtualmachines/start`): the labels of vmevents_api_requests_total."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = (rest[0] if rest else "") + (f"/{rest[2]}" if len(rest) >= 3 else "")
    if method != "GET":
        verb = _VERBS.get(method, method.lower())
        return ("deletecollection" if verb == "delete" and len(rest) < 2 else verb), resource
    if query and query.get("watch") not in (None, "", "0", "false"):
        return "watch", resource
    return ("get" if len(rest) >= 2 else "list"), resource

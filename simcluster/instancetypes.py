"""What KubeVirt's VM controller does with a VM's instancetype (spec.instancetype), for
simcluster/kubevirt/vm_controller.py.

On every sync of a VM that names one, whatever its run strategy (a Halted VM too), the controller copies the
instancetype into a ControllerRevision in the VM's namespace, owned by the VM, once, and records its name:
- v1.1.1 and v1.3.1: `spec.instancetype.revisionName`, by a JSON patch of the VM (a spec change: the VM's
  generation rises); pkg/instancetype/instancetype.go StoreControllerRevisions, GenerateRevisionNamePatch, called
  from pkg/virt-controller/watch/vm.go sync before the run strategy is looked at.
- v1.5 on (v1.8.3): `status.instancetypeRef` {name, kind, controllerRevisionRef.name}, by a status patch;
  pkg/instancetype/revision/store.go Store, patch.go patchVM, called from pkg/instancetype/controller/vm Sync, which
  first requires the instancetype to exist (checkResourcesExist: a sync error otherwise).
The revision is named <vm>-<instancetype>-<uid>-<generation> (v1.1.1 GetRevisionName) and, from v1.3, with the
instancetype's API version after its name (GetRevisionName / revision.GenerateName); it carries the object-* labels
and the instancetype itself as `data`, its labels, annotations, finalizers and owners dropped
(CreateControllerRevision). At start the spec it holds (else the object's, while none is recorded) is applied to
the VMI: its gpus[] and hostDevices[] become the VMI's (pkg/instancetype ApplyToVmi, applyGPUs, applyHostDevices).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("simcluster.instancetypes")

GROUP, VERSION = "instancetype.kubevirt.io", "v1beta1"
NAMESPACED = ("virtualmachineinstancetype", "virtualmachineinstancetypes")
CLUSTER = ("virtualmachineclusterinstancetype", "virtualmachineclusterinstancetypes", "")
STATUS_REF_FROM = (1, 5, 0)  # the first release that records the revision in status.instancetypeRef


def _matcher(vm: Mapping) -> dict:
    found = (vm.get("spec") or {}).get("instancetype")
    return found if isinstance(found, dict) else {}


def recorded(vm: Mapping) -> str:
    """The revision name the VM records (spec first, as KubeVirt reads it), or ""."""
    matcher = _matcher(vm)
    if matcher.get("revisionName"):
        return str(matcher["revisionName"])
    ref = ((vm.get("status") or {}).get("instancetypeRef") or {}).get("controllerRevisionRef") or {}
    return str(ref.get("name") or "")


def revision_name(vm_name: str, obj: Mapping, version: tuple[int, int, int]) -> str:
    meta = obj.get("metadata") or {}
    parts = [vm_name, str(meta.get("name"))] + ([VERSION] if version >= (1, 3, 0) else [])
    return "-".join([*parts, str(meta.get("uid")), str(meta.get("generation") or 1)])


def revision_of(vm: Mapping, obj: Mapping, version: tuple[int, int, int]) -> dict:
    """CreateControllerRevision."""
    vm_meta, meta = vm.get("metadata") or {}, obj.get("metadata") or {}
    data = copy.deepcopy(dict(obj))
    for key in ("labels", "annotations", "finalizers", "ownerReferences", "managedFields"):
        data.get("metadata", {}).pop(key, None)
    return {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(str(vm_meta.get("name")), obj, version), "namespace": vm_meta.get("namespace"),
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm_meta.get("name"),
                                 "uid": vm_meta.get("uid"), "controller": True, "blockOwnerDeletion": True}],
            "labels": {f"{GROUP}/object-generation": str(meta.get("generation") or 1),
                       f"{GROUP}/object-kind": str(obj.get("kind")), f"{GROUP}/object-name": str(meta.get("name")),
                       f"{GROUP}/object-uid": str(meta.get("uid")), f"{GROUP}/object-version": VERSION},
        },
        "data": data,
        "revision": 0,
    }


class Instancetypes:
    """The VM controller's instancetype steps, over the simulator's API client (`get(group, version, plural,
    namespace, name)`, `create(...)`, `patch(plural, ns, name, body, status=)`, as
    simcluster.kubevirt.client.Kube offers them)."""

    def __init__(self, kube: Any, version: tuple[int, int, int]) -> None:
        self.kube, self.version = kube, version

    def find(self, vm: Mapping) -> dict | None:
        """The instancetype object the VM names, or None (missing, or a kind KubeVirt refuses)."""
        matcher = _matcher(vm)
        kind, name = str(matcher.get("kind") or "").lower(), str(matcher.get("name") or "")
        if not name:
            return None
        if kind in NAMESPACED:
            namespace = (vm.get("metadata") or {}).get("namespace")
            return self.kube.get_object(GROUP, VERSION, "virtualmachineinstancetypes", namespace, name)
        if kind in CLUSTER:
            return self.kube.get_object(GROUP, VERSION, "virtualmachineclusterinstancetypes", None, name)
        return None

    def store(self, vm: dict) -> dict | None:
        """StoreControllerRevisions: the revision created (or found) and its name recorded; the VM as written, or
        None when nothing was written (none named, already recorded, or the instancetype is missing)."""
        matcher = _matcher(vm)
        if not matcher or recorded(vm):
            return None
        obj = self.find(vm)
        if obj is None:
            log.debug("%s: instancetype %s not found", (vm.get("metadata") or {}).get("name"), matcher.get("name"))
            return None
        revision = revision_of(vm, obj, self.version)
        meta = vm.get("metadata") or {}
        self.kube.create_object("apps", "v1", "controllerrevisions", meta.get("namespace"), revision)
        name = revision["metadata"]["name"]
        if self.version < STATUS_REF_FROM:
            body = [{"op": "test", "path": "/spec/instancetype/revisionName", "value": None},
                    {"op": "add", "path": "/spec/instancetype/revisionName", "value": name}]
            return self.kube.patch("virtualmachines", meta.get("namespace"), meta.get("name"), body)
        ref = {"name": matcher.get("name"), "controllerRevisionRef": {"name": name}}
        if matcher.get("kind"):
            ref["kind"] = matcher["kind"]
        return self.kube.patch("virtualmachines", meta.get("namespace"), meta.get("name"),
                               {"status": {"instancetypeRef": ref}}, status=True)

    def spec(self, vm: Mapping) -> Mapping | None:
        """The instancetype spec KubeVirt applies at start: the recorded revision's, else the object's."""
        name = recorded(vm)
        if name:
            revision = self.kube.get_object("apps", "v1", "controllerrevisions",
                                            (vm.get("metadata") or {}).get("namespace"), name)
            if revision is not None:
                return (revision.get("data") or {}).get("spec") or {}
        obj = self.find(vm)
        return (obj or {}).get("spec") if obj is not None else None


def apply_to_vmi(vmi: dict, spec: Mapping | None) -> dict:
    """applyGPUs / applyHostDevices: the instancetype's lists become the VMI's (KubeVirt refuses a VM whose own
    template has one of them too: a conflict; here the template's list is kept)."""
    if not spec:
        return vmi
    devices = vmi.setdefault("spec", {}).setdefault("domain", {}).setdefault("devices", {})
    for key in ("gpus", "hostDevices"):
        if spec.get(key) and not devices.get(key):
            devices[key] = copy.deepcopy(spec[key])
    return vmi

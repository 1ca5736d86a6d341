"""The simulated API server's object store: one table of resource kinds, one lock, one history of changes.

Everything that writes (HTTP handlers, `SimCluster` direct access, the KubeVirt start/stop subresources)
goes through `Store`, so resourceVersion, uid, generateName, finalizers, validation and watch events
behave the same whichever way an object was written. Behaviour follows k8s.io/apiserver
pkg/registry/generic/registry/store.go unless a comment says otherwise.
"""
from __future__ import annotations

import base64
import bisect
import copy
import json
import random
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from simcluster import patches, selectors

# ---------------------------------------------------------------------------------------------------------------
# Errors: the Status bodies of k8s.io/apimachinery/pkg/api/errors/errors.go (NewNotFound, NewConflict, ...).


class ApiError(Exception):
    """A failed request, carried to the HTTP layer as a `kind: Status` body with the real reason and code."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str, **extra) -> dict:
    # StatusDetails.kind holds the *resource* (plural) for these errors, as in errors.NewNotFound.
    details = {"name": name, "group": rt.group, "kind": rt.plural} if name else {"group": rt.group, "kind": rt.plural}
    details.update(extra)
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(qualified: str, group: str, kind: str, name: str, why: str) -> ApiError:
    # errors.NewConflict: "Operation cannot be fulfilled on %s %q: %v".
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
                    {"name": name, "group": group, "kind": kind})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def internal_error(why: str) -> ApiError:
    # errors.NewInternalError.
    return ApiError(500, "InternalError", f"Internal error occurred: {why}", {"causes": [{"message": why}]})


def invalid(rt: ResourceType, name: str, causes: list[dict]) -> ApiError:
    """errors.NewInvalid: `<Kind>.<group> "<name>" is invalid: <field errors>` with one cause per field."""
    rendered = [f'{c["field"]}: {c["message"]}' for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    qualified_kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    return ApiError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {summary}',
                    {"name": name, "group": rt.group, "kind": rt.kind, "causes": causes})


# ---------------------------------------------------------------------------------------------------------------
# The kinds the simulator serves. Adding a kind is one line.

POD_FIELDS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
              "status.phase", "status.podIP", "status.nominatedNodeName")  # pkg/registry/core/pod/strategy.go
EVENT_FIELDS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
                "reason", "reportingComponent", "source", "type")  # pkg/apis/core/v1/conversion.go (Event)
KEEP, DROP = "keep", "drop"


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    # A `status` subresource: writes to the main resource keep the stored status and vice versa.
    status_subresource: bool = False
    # What create does with a posted status (the kind's PrepareForCreate): KEEP, DROP, or a fresh status dict.
    create_status: Any = field(default=KEEP, compare=False)
    field_labels: tuple = ()
    # Pods and custom resources answer DELETE with the object; other built-ins with a Success Status.
    returns_deleted_object: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """GroupResource.String(): "pods", "virtualmachines.kubevirt.io"."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(plural, kind, namespaced, **kw):
    return ResourceType("", "v1", plural, kind, namespaced, **kw)


def _custom(group, version, plural, kind, namespaced, status=True):
    # CRDs with a status subresource drop a posted status on create
    # (apiextensions-apiserver pkg/registry/customresource/strategy.go PrepareForCreate).
    return ResourceType(group, version, plural, kind, namespaced, status_subresource=status,
                        create_status=DROP if status else KEEP, returns_deleted_object=True)


# Status subresources: KubeVirt pkg/virt-operator/resource/generate/components/crds.go (VM, VMIM, KubeVirt,
# MigrationPolicy have one, the VMI has none); Longhorn k8s/crds.yaml and harvester/pcidevices charts crds.yaml.
RESOURCES: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", False, status_subresource=True, create_status={"phase": "Active"}),
    _core("pods", "Pod", True, status_subresource=True, create_status={"phase": "Pending"},
          field_labels=POD_FIELDS, returns_deleted_object=True),
    _core("events", "Event", True, field_labels=EVENT_FIELDS),
    _core("configmaps", "ConfigMap", True),  # device-conflict's parameter object
    _core("persistentvolumeclaims", "PersistentVolumeClaim", True, status_subresource=True,
          create_status={"phase": "Pending"}),
    _core("persistentvolumes", "PersistentVolume", False, status_subresource=True, create_status={"phase": "Pending"}),
    _core("nodes", "Node", False, status_subresource=True),  # nodes may set status on create (node strategy)
    # vm-stuck-report's facts. ResourceQuota: PrepareForCreate clears the status (kube-controller-manager's
    # resourcequota controller keeps it); pkg/registry/core/resourcequota/strategy.go.
    _core("resourcequotas", "ResourceQuota", True, status_subresource=True, create_status=DROP),
    ResourceType("storage.k8s.io", "v1", "storageclasses", "StorageClass", False),
    _custom("kubevirt.io", "v1", "virtualmachines", "VirtualMachine", True),
    _custom("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, status=False),
    _custom("kubevirt.io", "v1", "virtualmachineinstancemigrations", "VirtualMachineInstanceMigration", True),
    _custom("kubevirt.io", "v1", "kubevirts", "KubeVirt", True),
    _custom("migrations.kubevirt.io", "v1alpha1", "migrationpolicies", "MigrationPolicy", False),
    # CDI's DataVolume (upstream/cdi/): vm-stuck-report times Provisioning and DataVolumeError from it
    _custom("cdi.kubevirt.io", "v1beta1", "datavolumes", "DataVolume", True),
    _custom("longhorn.io", "v1beta2", "volumes", "Volume", True),
    _custom("longhorn.io", "v1beta2", "engines", "Engine", True),
    _custom("longhorn.io", "v1beta2", "replicas", "Replica", True),
    _custom("devices.harvesterhci.io", "v1beta1", "pcidevices", "PCIDevice", False),
    _custom("devices.harvesterhci.io", "v1beta1", "vgpudevices", "VGPUDevice", False),  # device-conflict's vGPU names
    # evacuation-report's facts: Harvester's settings (vm-force-reset-policy, server-version; no status subresource)
    # and Upgrades (upstream/harvester/v1.7.0), and the attach/detach controller's VolumeAttachments (built-in,
    # status subresource: pkg/registry/storage/volumeattachment/storage)
    _custom("harvesterhci.io", "v1beta1", "settings", "Setting", False, status=False),
    _custom("harvesterhci.io", "v1beta1", "upgrades", "Upgrade", True, status=False),
    ResourceType("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False, status_subresource=True),
    # The devices an instancetype gives a VM (simcluster/instancetypes.py): KubeVirt's CRDs have no status
    # subresource for them; ControllerRevision is a built-in without status (apps/v1).
    _custom("instancetype.kubevirt.io", "v1beta1", "virtualmachineinstancetypes", "VirtualMachineInstancetype", True,
            status=False),
    _custom("instancetype.kubevirt.io", "v1beta1", "virtualmachineclusterinstancetypes",
            "VirtualMachineClusterInstancetype", False, status=False),
    ResourceType("apps", "v1", "controllerrevisions", "ControllerRevision", True),
    # Multus (upstream/multus/networks-crd.yaml, no status): KubeVirt renders no launcher pod without the NAD
    _custom("k8s.cni.cncf.io", "v1", "network-attachment-definitions", "NetworkAttachmentDefinition", True,
            status=False),
)


def find_type(group: str, version: str, plural: str) -> ResourceType | None:
    return next((rt for rt in RESOURCES if (rt.group, rt.version, rt.plural) == (group, version, plural)), None)


def type_for_kind(api_version: str, kind: str) -> ResourceType:
    found = next((rt for rt in RESOURCES if (rt.api_version, rt.kind) == (api_version, kind)), None)
    if found is None:
        raise KeyError(f"the simulator does not serve {kind} in {api_version}; add it to store.RESOURCES")
    return found


def _taint_not_ready(node: dict) -> None:
    """The TaintNodesByCondition admission plugin (on by default): a new Node gets node.kubernetes.io/not-ready
    NoSchedule, which the node lifecycle controller removes once the kubelet reports Ready
    (kubernetes plugin/pkg/admission/nodetaint/admission.go, addNotReadyTaint)."""
    spec = node.setdefault("spec", {})
    taints = spec["taints"] = spec.get("taints") or []  # a posted null is an empty list to the server
    if not any(t.get("key") == "node.kubernetes.io/not-ready" and t.get("effect") == "NoSchedule" for t in taints):
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.

# names.SimpleNameGenerator: 5 characters from an alphabet without vowels or confusable digits.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# validation.IsDNS1123Subdomain.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def now_rfc3339() -> str:
    """metav1.Time serialises in RFC 3339 UTC with second precision."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clone(obj):
    """A deep copy of a stored object. Objects are JSON values: dicts and lists are copied, strings, numbers, booleans
    and None shared (immutable); anything else goes through copy.deepcopy. copy.deepcopy itself took 1.1 ms per
    finding Event, which made a LIST of 50,000 a minute of the simulator's time."""
    kind = type(obj)
    if kind is dict:
        return {key: clone(value) for key, value in obj.items()}
    if kind is list:
        return [clone(value) for value in obj]
    if kind in _IMMUTABLE or obj is None:
        return obj
    return copy.deepcopy(obj)


_IMMUTABLE = frozenset({str, int, float, bool})


def _content(obj: dict, rt: ResourceType) -> dict:
    """What counts for metadata.generation: everything but metadata (and status when it is a subresource)."""
    skip = {"metadata", "status"} if rt.status_subresource else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


@dataclass
class WatchEvent:
    rv: int
    type: str            # ADDED, MODIFIED, DELETED
    rt: ResourceType
    namespace: str | None
    obj: dict
    prev: dict | None    # the object before the change (watch cache's PrevObject), for selector transitions


@dataclass
class Page:
    items: list[dict]
    resource_version: str
    continue_token: str | None = None
    remaining: int | None = None


Validator = Callable[[ResourceType, dict], dict]  # returns the (pruned) object or raises ApiError


@dataclass
class Store:
    """All objects, keyed by kind then (namespace, name), behind one lock that watchers also wait on."""

    validate: Validator = lambda rt, obj: obj
    history_size: int = 2000
    event_ttl: float | None = None   # seconds, as kube-apiserver --event-ttl (None: Events never expire)
    cond: threading.Condition = field(default_factory=lambda: threading.Condition(threading.RLock()))
    closed: bool = False

    def __post_init__(self):
        self._objects: dict[ResourceType, dict[tuple, dict]] = {rt: {} for rt in RESOURCES}
        self._sorted: dict[ResourceType, list[tuple] | None] = {}
        self._event_written: dict[tuple, float] = {}
        self._expiry_checked = 0.0
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=self.history_size)
        self._floor = 0   # every change after this resourceVersion is still in the history

    # -- reads ---------------------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict:
        with self.cond:
            self._expire_events()
            return clone(self._stored(rt, namespace, name))

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> dict | None:
        with self.cond:
            self._expire_events()
            obj = self._objects[rt].get((self._ns(rt, namespace), name))
            return clone(obj) if obj is not None else None

    def list(self, rt: ResourceType, namespace: str | None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None) -> Page:
        try:
            match = selectors.matcher(label_selector, field_selector, rt.field_labels)
        except ValueError as err:
            raise bad_request(str(err)) from None
        start, snapshot = _decode_continue(continue_token) if continue_token else (None, None)
        with self.cond:
            self._expire_events()
            # A continued list reads the snapshot its first page was read at (etcd reads at that revision).
            objects, keys = (self._objects[rt], self._keys(rt)) if snapshot is None else self._objects_at(rt, snapshot)
            if namespace is not None:  # keys sort by (namespace, name): one namespace is one run of them
                keys = keys[bisect.bisect_left(keys, (namespace,)):bisect.bisect_left(keys, (namespace + "\0",))]
            first = bisect.bisect_right(keys, start) if start is not None else 0
            rv = str(self._rv if snapshot is None else snapshot)
            # As etcd3's GetList (k8s.io/apiserver pkg/storage/etcd3/store.go): keys are read in order until `limit`
            # match; a key left after the last one read means more (a continue token), whether or not it matches;
            # remainingItemCount only without a selector (storage/continue.go PrepareContinueToken: etcd's count
            # includes what a selector would not match).
            matching, index = [], first
            while index < len(keys) and not (limit and len(matching) >= limit):
                if match(objects[keys[index]]):
                    matching.append(objects[keys[index]])
                index += 1
            more = bool(limit) and len(matching) >= limit and index < len(keys)
        if more:
            last = matching[-1]["metadata"]
            token = _encode_continue((last.get("namespace", ""), last["name"]), rv)
            selected = bool(label_selector) or bool(field_selector)
            return Page(clone(matching), rv, token, None if selected else len(keys) - index)
        return Page(clone(matching), rv)

    def _keys(self, rt: ResourceType) -> list[tuple]:
        """The keys of one kind, sorted (as etcd's), kept until one is added or removed."""
        keys = self._sorted.get(rt)
        if keys is None:
            keys = self._sorted[rt] = sorted(self._objects[rt])
        return keys

    def _objects_at(self, rt: ResourceType, rv: int) -> tuple[dict[tuple, dict], list[tuple]]:
        """The objects of one kind as they were at resourceVersion `rv`, and their keys sorted: today's, with every
        later change undone."""
        if rv < self._floor:
            # etcd compacted that revision: the continue token has expired (storage.ErrCodeResourceVersionTooLarge's
            # sibling, "The provided continue parameter is too old").
            raise ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                                           "list result. You can start a new list without the continue parameter.")
        undone: dict[tuple, dict | None] = {}
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.rt == rt:  # the earliest change after `rv` is seen last: its `prev` is the object at `rv`
                undone[(event.namespace or "", event.obj["metadata"]["name"])] = event.prev
        if not undone:
            return self._objects[rt], self._keys(rt)
        objects = dict(self._objects[rt])
        for key, prev in undone.items():
            if prev is None:
                objects.pop(key, None)
            else:
                objects[key] = prev
        return objects, sorted(objects)

    # -- Event expiry ----------------------------------------------------------------------------------------------

    def _expire_events(self) -> None:
        """kube-apiserver stores Events with an etcd lease of --event-ttl, renewed by every write: an Event is
        gone event_ttl after it was last written (pkg/registry/core/event/storage: TTLFunc)."""
        if self.event_ttl is None:
            return
        now = time.monotonic()
        if now - self._expiry_checked < EXPIRY_CHECK_INTERVAL:  # reads are many; expiry needs no finer grain
            return
        self._expiry_checked = now
        rt = type_for_kind("v1", "Event")
        for key, written in list(self._event_written.items()):
            if now - written < self.event_ttl:
                continue
            del self._event_written[key]
            if key in self._objects[rt]:  # not deleted by hand meanwhile
                self._remove(rt, self._objects[rt][key])

    # -- writes --------------------------------------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str | None, obj: dict, keep_status: bool = False,
               refuse_resource_version: bool = False) -> dict:
        """refuse_resource_version: a posted metadata.resourceVersion is an error (HTTP), not dropped (set-up)."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        with self.cond:
            self._check_namespace(rt, namespace, meta)
            # NamespaceLifecycle is admission (Lifecycle.Admit): it answers before the object's own validation.
            self._check_namespace_lifecycle(rt, meta)
            if rt.kind == "Event" and rt.group == "":
                _check_event_namespace(rt, obj)
            if rt.kind == "Node" and rt.group == "":
                _taint_not_ready(obj)
            given_version = meta.get("resourceVersion")
            self._prepare_create(rt, obj, keep_status)
            obj = self.validate(rt, obj)
            if refuse_resource_version and given_version:
                # etcd3 store.Create, after admission and validation; kube-apiserver answers 500 (seen on v1.33).
                raise ApiError(500, "InternalError", "resourceVersion should not be set on objects to be created")
            meta = obj["metadata"]
            if not meta.get("name"):
                meta["name"] = self._generated_name(rt, meta)
            self._check_name(rt, meta["name"])
            key = (meta.get("namespace", ""), meta["name"])
            if key in self._objects[rt]:
                raise already_exists(rt, meta["name"])
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            self._commit(rt, key, obj, "ADDED", None)
            return clone(obj)

    def update(self, rt: ResourceType, namespace: str | None, name: str, obj: dict,
               subresource: str | None = None) -> dict:
        with self.cond:
            return self._update(rt, namespace, name, clone(obj), subresource)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, patch: Any,
              subresource: str | None = None) -> dict:
        """Apply a merge or JSON patch to the stored object and write it as an update would."""
        with self.cond:
            current = self._stored(rt, namespace, name)
            patched = _apply_patch(patch_type, clone(current), patch)
            meta = patched.setdefault("metadata", {})
            # A patch cannot rename the object. A resourceVersion the patch wrote is a precondition (optimistic
            # concurrency, handlers/patch.go); otherwise the patch applies to whatever version is stored.
            meta["name"] = name
            meta["resourceVersion"] = meta.get("resourceVersion") or current["metadata"]["resourceVersion"]
            return self._update(rt, namespace, name, patched, subresource)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, preconditions: dict | None = None
               ) -> tuple[dict, bool]:
        """Delete, or mark for deletion while finalizers remain. Returns (object, deleted_now)."""
        with self.cond:
            stored = self._stored(rt, namespace, name)
            _check_preconditions(rt, stored, preconditions or {})
            if rt.kind == "Namespace":
                return self._delete_namespace(rt, stored)
            meta = stored["metadata"]
            if not meta.get("finalizers"):
                return clone(self._remove(rt, stored)), True
            if meta.get("deletionTimestamp"):
                return clone(stored), False  # graceful deletion already pending: nothing changes
            marked = clone(stored)
            # rest.BeforeDelete: deletionTimestamp, grace period 0 for objects without a grace period, generation+1.
            marked["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0,
                                      generation=meta.get("generation", 0) + 1)
            self._commit(rt, self._key(rt, stored), marked, "MODIFIED", stored)
            return clone(marked), False

    def delete_collection(self, rt: ResourceType, namespace: str | None, label_selector: str | None,
                          field_selector: str | None) -> list[dict]:
        with self.cond:
            page = self.list(rt, namespace, label_selector, field_selector)
            return [self.delete(rt, o["metadata"].get("namespace"), o["metadata"]["name"])[0] for o in page.items]

    def compact(self) -> int:
        """Forget the change history, as etcd compaction does: watches from an older resourceVersion get 410."""
        with self.cond:
            self._history.clear()
            self._floor = self._rv
            return self._rv

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # -- watch support -------------------------------------------------------------------------------------------

    def events_after(self, rv: int, rt: ResourceType, namespace: str | None) -> list[WatchEvent] | None:
        """Changes of one kind after `rv`, or None when that point is no longer in the history (410 Gone)."""
        if rv < self._floor:
            return None
        return [e for e in self._history
                if e.rv > rv and e.rt == rt and (namespace is None or e.namespace == namespace)]

    @property
    def floor(self) -> int:
        return self._floor

    # -- internals -----------------------------------------------------------------------------------------------

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def _key(self, rt: ResourceType, obj: dict) -> tuple:
        return (self._ns(rt, obj["metadata"].get("namespace")), obj["metadata"]["name"])

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> dict:
        obj = self._objects[rt].get((self._ns(rt, namespace), name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def _check_namespace(self, rt: ResourceType, namespace: str | None, meta: dict):
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        given = meta.get("namespace")
        if namespace and given and given != namespace:
            # rest.EnsureObjectNamespaceMatchesRequestNamespace.
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace or given or "default"

    def _check_namespace_lifecycle(self, rt: ResourceType, meta: dict) -> None:
        """The NamespaceLifecycle admission plugin: nothing is created in a namespace that does not exist
        (404) or is being deleted (403)."""
        if not rt.namespaced:
            return
        name = meta["namespace"]
        namespace = self._objects[type_for_kind("v1", "Namespace")].get(("", name))
        if namespace is None:
            raise ApiError(404, "NotFound", f'namespaces "{name}" not found',
                           {"name": name, "kind": "namespaces"})
        if namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f"{rt.plural} \"{meta.get('name') or meta.get('generateName', '')}\" "
                           f"is forbidden: unable to create new content in namespace {name} because it is being "
                           "terminated", {"name": meta.get("name", ""), "kind": rt.plural})

    def _delete_namespace(self, rt: ResourceType, stored: dict) -> tuple[dict, bool]:
        """What kube-apiserver and the namespace controller do together: the namespace turns Terminating, its
        content is deleted (objects with finalizers wait for them), and it goes once it is empty."""
        name = stored["metadata"]["name"]
        if name in UNDELETABLE_NAMESPACES:  # plugin/pkg/admission/namespace/lifecycle immortalNamespaces
            raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                           {"name": name, "kind": "namespaces"})
        if not stored["metadata"].get("deletionTimestamp"):
            marked = clone(stored)
            marked["metadata"]["deletionTimestamp"] = now_rfc3339()
            marked.setdefault("status", {})["phase"] = "Terminating"
            self._commit(rt, self._key(rt, stored), marked, "MODIFIED", stored)
            stored = marked
        for kind in RESOURCES:
            if kind.namespaced:
                for key in [k for k in self._objects[kind] if k[0] == name]:
                    obj = self._objects[kind][key]
                    self.delete(kind, name, obj["metadata"]["name"])
        return self._maybe_remove_namespace(name) or clone(stored), False

    def _maybe_remove_namespace(self, name: str) -> dict | None:
        ns_type = type_for_kind("v1", "Namespace")
        namespace = self._objects[ns_type].get(("", name))
        if namespace is None or not namespace["metadata"].get("deletionTimestamp"):
            return None
        if any(k[0] == name for kind in RESOURCES if kind.namespaced for k in self._objects[kind]):
            return None
        return clone(self._remove(ns_type, namespace))

    @staticmethod
    def _prepare_create(rt: ResourceType, obj: dict, keep_status: bool):
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj["metadata"]
        for system_field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "generation"):
            meta.pop(system_field, None)
        if keep_status or rt.create_status == KEEP:
            return
        obj.pop("status", None)
        if isinstance(rt.create_status, dict):
            obj["status"] = clone(rt.create_status)

    def _generated_name(self, rt: ResourceType, meta: dict) -> str:
        base = meta.get("generateName")
        if not base:
            raise invalid(rt, "", [{"reason": "FieldValueRequired", "field": "metadata.name",
                                    "message": "Required value: name or generateName is required"}])
        namespace = meta.get("namespace", "")
        while True:
            candidate = base + "".join(random.choice(_NAME_ALPHABET) for _ in range(5))
            if (namespace, candidate) not in self._objects[rt]:
                return candidate

    @staticmethod
    def _check_name(rt: ResourceType, name: str):
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            raise invalid(rt, name, [{
                "reason": "FieldValueInvalid", "field": "metadata.name",
                "message": f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                           "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                           "character"}])

    def _update(self, rt: ResourceType, namespace: str | None, name: str, obj: dict, subresource: str | None) -> dict:
        current = self._stored(rt, namespace, name)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        expected = meta.get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise conflict(rt.qualified, rt.group, rt.plural, name, "the object has been modified; please apply "
                           "your changes to the latest version and try again")
        new = self._merge_for_update(rt, current, obj, subresource)
        _check_finalizers(rt, current, new)
        if rt.kind == "Pod" and subresource is None:
            _check_pod_update(rt, current, new)
        new = self.validate(rt, new)
        if _unchanged(new, current):
            # A write that changes nothing is not written (registry Store.Update / etcd3 GuaranteedUpdate):
            # the resourceVersion stays and no watch event is sent.
            return clone(current)
        if _content(new, rt) != _content(current, rt):
            new["metadata"]["generation"] = current["metadata"].get("generation", 0) + 1
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            # registry Store.Update: emptied finalizers on a deleting object delete it (one DELETED event).
            self._remove(rt, current)
            return clone(new)
        self._commit(rt, self._key(rt, current), new, "MODIFIED", current)
        return clone(new)

    @staticmethod
    def _merge_for_update(rt: ResourceType, current: dict, obj: dict, subresource: str | None) -> dict:
        if subresource == "status":
            # customResourceStatusStrategy.PrepareForUpdate: only status is taken from the request.
            new = clone(current)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            return new
        new = obj
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        if rt.status_subresource:
            new.pop("status", None)
            if "status" in current:
                new["status"] = clone(current["status"])
        # rest.BeforeUpdate / FillObjectMetaSystemFields: system fields cannot be changed by a write.
        meta, old = new["metadata"], current["metadata"]
        for system_field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                             "generation", "namespace", "name"):
            if system_field in old:
                meta[system_field] = old[system_field]
            else:
                meta.pop(system_field, None)
        return new

    def bind(self, rt: ResourceType, namespace: str, name: str, node: str) -> None:
        """POST pods/<name>/binding, as the scheduler does: sets spec.nodeName once (pkg/registry/core/pod/
        storage BindingREST.setPodNodeAndMetadata: an assigned pod answers 409)."""
        with self.cond:
            current = self._stored(rt, namespace, name)
            if (current.get("spec") or {}).get("nodeName"):
                raise conflict(rt.qualified, rt.group, rt.plural, name,
                               f"pod {name} is already assigned to node \"{current['spec']['nodeName']}\"")
            new = clone(current)
            new.setdefault("spec", {})["nodeName"] = node
            self._commit(rt, self._key(rt, current), new, "MODIFIED", current)

    def _remove(self, rt: ResourceType, stored: dict) -> dict:
        key = self._key(rt, stored)
        del self._objects[rt][key]
        self._sorted[rt] = None
        self._rv += 1
        gone = clone(stored)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(WatchEvent(self._rv, "DELETED", rt, key[0] or None, gone, stored))
        if rt.namespaced and key[0]:
            self._maybe_remove_namespace(key[0])
        return gone

    def _commit(self, rt: ResourceType, key: tuple, obj: dict, event_type: str, prev: dict | None):
        if rt.kind == "Event" and rt.group == "":
            self._event_written[key] = time.monotonic()
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if key not in self._objects[rt]:
            self._sorted[rt] = None
        self._objects[rt][key] = obj
        self._record(WatchEvent(self._rv, event_type, rt, key[0] or None, clone(obj), prev))

    def _record(self, event: WatchEvent):
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(event)
        self.cond.notify_all()


# The fields of a Pod's spec an update may change (pkg/apis/core/validation ValidatePodUpdate).
_POD_MUTABLE = ("containers", "initContainers", "activeDeadlineSeconds", "tolerations",
                "terminationGracePeriodSeconds")


def _check_pod_update(rt: ResourceType, current: dict, new: dict) -> None:
    def fixed(pod: dict) -> dict:
        spec = dict(pod.get("spec") or {})
        for name in _POD_MUTABLE:
            spec.pop(name, None)
        return spec
    if fixed(current) != fixed(new):
        raise invalid(rt, current["metadata"]["name"], [{
            "reason": "FieldValueForbidden", "field": "spec",
            "message": "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                       "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
                       "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
                       "set to 1 if it was previously negative)"}])


UNDELETABLE_NAMESPACES = ("default", "kube-system", "kube-public")
EXPIRY_CHECK_INTERVAL = 0.25  # seconds between two looks for expired Events


def _check_event_namespace(rt: ResourceType, event: dict) -> None:
    """pkg/apis/core/validation ValidateEvent: a namespaced object's Event lives in that object's namespace."""
    involved = (event.get("involvedObject") or {}).get("namespace")
    own = event["metadata"]["namespace"]
    if involved and involved != own:
        raise invalid(rt, event["metadata"].get("name", ""), [{
            "reason": "FieldValueInvalid", "field": "involvedObject.namespace",
            "message": f'Invalid value: "{involved}": does not match event.namespace'}])


def _unchanged(new: dict, current: dict) -> bool:
    def comparable(obj: dict) -> dict:
        meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
        return {**obj, "metadata": meta}
    return comparable(new) == comparable(current)


def _check_preconditions(rt: ResourceType, stored: dict, preconditions: dict):
    """storage.Preconditions.Check, surfaced as a Conflict by storeerr.InterpretDeleteError."""
    meta = stored["metadata"]
    failures = (("uid", "UID"), ("resourceVersion", "ResourceVersion"))
    for key, label in failures:
        wanted = preconditions.get(key)
        if wanted is not None and wanted != meta.get(key):
            storage_key = "/".join(p for p in ("/registry", rt.group or "core", rt.plural,
                                               meta.get("namespace", ""), meta["name"]) if p)
            why = (f"StorageError: invalid object, Code: 4, Key: {storage_key}, ResourceVersion: 0, "
                   f"AdditionalErrorMsg: Precondition failed: {label} in precondition: {wanted}, "
                   f"{label} in object meta: {meta.get(key)}")
            raise conflict(rt.qualified, rt.group, rt.plural, meta["name"], why)


def _check_finalizers(rt: ResourceType, current: dict, new: dict):
    """ObjectMeta validation: no new finalizers once deletion has started."""
    if not current["metadata"].get("deletionTimestamp"):
        return
    added = sorted(set(new["metadata"].get("finalizers") or []) - set(current["metadata"].get("finalizers") or []))
    if added:
        raise invalid(rt, current["metadata"]["name"], [{
            "reason": "FieldValueForbidden", "field": "metadata.finalizers",
            "message": f"Forbidden: no new finalizers can be added if the object is being deleted, "
                       f"found new finalizers {json.dumps(added)}"}])


def _apply_patch(patch_type: str, current: dict, patch: Any) -> dict:
    try:
        patched = patches.apply(patch_type, current, patch)
    except patches.MalformedPatch as err:
        raise bad_request(str(err)) from None
    except patches.PatchFailed:
        # handlers/patch.go applyJSPatch: a JSON patch that does not apply (a failed `test`, a missing path) is
        # errors.NewGenericServerResponse(http.StatusUnprocessableEntity, ...): 422 Invalid, generic message,
        # no causes (the json-patch error text is not passed on).
        raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request", {}) from None
    if not isinstance(patched, dict):
        raise bad_request("the patch did not produce an object")
    return patched


def _encode_continue(last_key: tuple, rv: str) -> str:
    raw = json.dumps({"v": "sim/1", "rv": rv, "start": list(last_key)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[tuple, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return tuple(data["start"]), int(data["rv"])
    except (ValueError, KeyError, TypeError):
        # storage.ErrCodeInvalidObj path in the real server: a malformed continue is a 400.
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion (version sim/1)") \
            from None

"""The devices an instancetype gives a VM (docs/facts.md §3, Instancetypes): pure; reads.py loads the objects.

A VM's `spec.instancetype` names a VirtualMachineInstancetype (its namespace) or a VirtualMachineClusterInstancetype
(`kind` empty or the cluster kind). KubeVirt's VM controller copies that object, once, into a ControllerRevision in
the VM's namespace and records its name: `spec.instancetype.revisionName` up to v1.4, `status.instancetypeRef.
controllerRevisionRef.name` from v1.5 (whose revision counts only while its `instancetype.kubevirt.io/object-name`
label is the matcher's name, pkg/instancetype/find/revision.go). At start it applies the revision's spec to the VMI
(the instancetype's `gpus[]` and `hostDevices[]` become the VMI's), and the object only while no revision is
recorded. So a VM's named devices are its template's plus its revision's, else its instancetype object's.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shared import objects as o

PURE = True
GROUP = "instancetype.kubevirt.io"
_NAMESPACED = ("virtualmachineinstancetype", "virtualmachineinstancetypes")
_CLUSTER = ("virtualmachineclusterinstancetype", "virtualmachineclusterinstancetypes", "")
KINDS = ("VirtualMachineInstancetype", "VirtualMachineClusterInstancetype")  # what a revision's data holds
OBJECT_KIND_LABEL = f"{GROUP}/object-kind"  # on every revision KubeVirt stores of one (CreateControllerRevision)
OBJECT_NAME_LABEL = f"{GROUP}/object-name"
REVISION, NAMESPACED, CLUSTER = "revision", "instancetype", "cluster"


@dataclass(frozen=True, order=True)
class Source:
    """One object that may hold a VM's instancetype spec: a ControllerRevision or an instancetype object."""

    kind: str               # REVISION, NAMESPACED or CLUSTER
    namespace: str | None   # None for CLUSTER
    name: str


@dataclass(frozen=True)
class Matcher:
    """A VM's spec.instancetype, and the revision KubeVirt recorded for it (if any)."""

    namespace: str
    name: str
    cluster: bool
    revision: str | None = None
    check_label: bool = False  # the revision came from status (v1.5+): it counts only if it is of this name

    @property
    def object(self) -> Source:
        return Source(CLUSTER, None, self.name) if self.cluster else Source(NAMESPACED, self.namespace, self.name)

    def sources(self) -> tuple[Source, ...]:
        """Where KubeVirt would read the spec it applies, in its order: the revision, else the object."""
        first = (Source(REVISION, self.namespace, self.revision),) if self.revision else ()
        return (*first, self.object)


def matcher(vm: Mapping) -> Matcher | None:
    """The VM's instancetype matcher; None when it names none (or a kind KubeVirt refuses)."""
    spec = o.mapping(vm, "spec", "instancetype")
    name = o.string(spec, "name")
    kind = o.string(spec, "kind").lower()
    if not name or kind not in _NAMESPACED + _CLUSTER:
        return None
    namespace = o.string(o.mapping(vm, "metadata"), "namespace") or "default"
    revision = o.string(spec, "revisionName")
    if revision:
        return Matcher(namespace, name, kind in _CLUSTER, revision)
    status_ref = o.mapping(vm, "status", "instancetypeRef")
    revision = o.string(o.mapping(status_ref, "controllerRevisionRef"), "name")
    return Matcher(namespace, name, kind in _CLUSTER, revision or None, check_label=bool(revision))


def spec_of(found: Mapping | None, source: Source, wanted: Matcher) -> Mapping | None:
    """The instancetype spec `found` (the object at `source`) holds for this matcher, else None."""
    if found is None:
        return None
    if source.kind != REVISION:
        return o.mapping(found, "spec")
    if wanted.check_label and o.string(o.mapping(found, "metadata", "labels"), OBJECT_NAME_LABEL) != wanted.name:
        return None  # a revision of another instancetype: KubeVirt would not apply it either
    data = o.mapping(found, "data")
    if str(data.get("kind")) not in KINDS or not str(data.get("apiVersion", "")).startswith(f"{GROUP}/"):
        return None  # an older revision format (a spec revision) or no instancetype at all
    return o.mapping(data, "spec")


def devices_spec(spec: Mapping | None) -> dict:
    """An instancetype spec's gpus[] and hostDevices[], shaped as a VMI spec for index.spec_devices."""
    devices = {key: spec[key] for key in ("gpus", "hostDevices") if spec and isinstance(spec.get(key), list)}
    return {"domain": {"devices": devices}}


def trimmed(found: Mapping) -> dict:
    """What spec_of reads of an object or revision: its labels, its data's kind and its devices. A LIST keeps
    only this of each item, so memory follows the instancetypes' devices, not their specs."""
    data = o.mapping(found, "data")
    keep = {"metadata": {"labels": dict(o.mapping(found, "metadata", "labels"))},
            "spec": devices_spec(o.mapping(found, "spec"))["domain"]["devices"]}
    if data:
        keep["data"] = {"apiVersion": data.get("apiVersion"), "kind": data.get("kind"),
                        "spec": devices_spec(o.mapping(data, "spec"))["domain"]["devices"]}
    return keep


Loader = Callable[[Iterable[Source]], Mapping[Source, Mapping | None]]


class Given:
    """The instancetype specs of the VMs one request looks at, each object read at most once. `load` answers
    the objects of a batch of sources (None for one that does not exist); reads.py supplies it."""

    def __init__(self, load: Loader) -> None:
        self._load = load
        self._seen: dict[Source, Mapping | None] = {}
        self.reads = 0  # sources asked of `load`

    def prefetch(self, vms: Iterable[Mapping]) -> None:
        """Load, in one batch, the first source of every VM here that names an instancetype."""
        self._fetch(m.sources()[0] for vm in vms if (m := matcher(vm)) is not None)

    def spec_for(self, vm: Mapping) -> Mapping | None:
        """The instancetype spec KubeVirt would apply to this VM, or None (it names none, or none is found)."""
        wanted = matcher(vm)
        if wanted is None:
            return None
        for source in wanted.sources():
            self._fetch((source,))
            spec = spec_of(self._seen.get(source), source, wanted)
            if spec is not None:
                return spec
        return None

    def _fetch(self, sources: Iterable[Source]) -> None:
        missing = sorted({s for s in sources if s not in self._seen})
        if missing:
            self.reads += len(missing)
            found = self._load(missing)
            self._seen.update({s: found.get(s) for s in missing})

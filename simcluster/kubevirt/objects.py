"""Stands in for KubeVirt's API types (kubevirt.io/v1, staging/src/kubevirt.io/api/core/v1/types.go) as every
simulated component reads and writes them: names, labels, finalizers, phases, conditions and timestamps. It decides
nothing; the components in this package do.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

GROUP, API_VERSION = "kubevirt.io", "v1"
KUBEVIRT_API = f"{GROUP}/{API_VERSION}"
VMS, VMIS = "virtualmachines", "virtualmachineinstances"

# staging/src/kubevirt.io/api/core/v1/types.go: the VM controller puts this finalizer on the VM and
# on every VMI it creates (and removes it from a VMI once the VMI is final, vm.go updateStatus);
# the VMI controller puts VirtualMachineInstanceFinalizer on every VMI.
VM_CONTROLLER_FINALIZER = "kubevirt.io/virtualMachineControllerFinalize"
VMI_FINALIZER = "foregroundDeleteVirtualMachine"
# The event source of the VM controller, as `kubectl describe vm` shows it ("From" column).
VM_CONTROLLER_COMPONENT = "virtualmachine-controller"

FINAL_PHASES = ("Succeeded", "Failed")
FINAL_POD_PHASES = ("Succeeded", "Failed")
LAUNCHER_LABELS = {"kubevirt.io": "virt-launcher"}
CREATED_BY_LABEL = "kubevirt.io/created-by"
VM_NAME_LABEL = "vm.kubevirt.io/name"
NODE_NAME_LABEL = "kubevirt.io/nodeName"
MIGRATION_JOB_LABEL = "kubevirt.io/migrationJobUID"  # on a migration's target launcher pod
VIRT_HANDLER_COMPONENT = "virt-handler"

Key = tuple[str, str]  # (namespace, name) of a VM and of its VMI (same name)


def parse_version(version: str) -> tuple[int, int, int]:
    """'v1.3.1' / '1.3.1' / '1.4.0-rc.1' -> (1, 3, 1); numeric, so '1.10.0' > '1.9.0'."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not match:
        raise ValueError(f"KubeVirt version {version!r} is not a version; use one like 1.3.1.")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def rfc3339(when: datetime) -> str:
    """KubeVirt's timestamps: RFC 3339, UTC, second precision (metav1.Time)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A KubeVirt timestamp (RFC 3339, UTC, whole seconds) as a datetime; None when absent or unreadable."""
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def meta_of(obj: Mapping | None) -> Mapping:
    return (obj or {}).get("metadata") or {}


def status_of(obj: Mapping | None) -> Mapping:
    return (obj or {}).get("status") or {}


def is_deleting(obj: Mapping | None) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))


def has_finalizer(obj: Mapping | None, finalizer: str) -> bool:
    return finalizer in (meta_of(obj).get("finalizers") or [])


def vmi_phase(vmi: Mapping | None) -> str:
    return status_of(vmi).get("phase") or ""


def run_strategy(vm: Mapping) -> str:
    """VirtualMachine.RunStrategy(): spec.runStrategy, else legacy spec.running, else Halted."""
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        return spec["runStrategy"]
    if spec.get("running") is True:
        return "Always"
    return "Halted"


def condition_of(obj: Mapping | None, ctype: str) -> Mapping | None:
    for cond in status_of(obj).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def condition_is(obj: Mapping | None, ctype: str, status: str, reason: str | None = None) -> bool:
    cond = condition_of(obj, ctype)
    return bool(cond and cond.get("status") == status and (reason is None or cond.get("reason") == reason))


def as_pod(pod: Mapping) -> dict:
    """A pod from a LIST, whose items carry no kind: as an Event's involvedObject names it."""
    return {**pod, "apiVersion": "v1", "kind": "Pod"}


def with_phase(vmi: Mapping, phase: str, now: datetime) -> dict:
    """The status patch that moves a VMI to `phase`, recording the transition time."""
    stamps = [dict(s) for s in status_of(vmi).get("phaseTransitionTimestamps") or []]
    stamps.append({"phase": phase, "phaseTransitionTimestamp": rfc3339(now)})
    return {"phase": phase, "phaseTransitionTimestamps": stamps}


def set_condition(conditions: list, cond: Mapping, now: datetime) -> list:
    """Replace the condition of that type; keep lastTransitionTime when the status is unchanged."""
    out, prev = [], None
    for c in conditions or []:
        if c.get("type") == cond["type"]:
            prev = c
        else:
            out.append(c)
    keep = prev and prev.get("status") == cond.get("status")
    out.append(dict(cond, lastTransitionTime=prev.get("lastTransitionTime") if keep else rfc3339(now)))
    return out


def drop_condition(conditions: list, ctype: str) -> list:
    return [c for c in conditions or [] if c.get("type") != ctype]


def merge_patch_for(old: Mapping, new: Mapping) -> dict:
    """Top-level JSON merge patch turning `old` into `new` (removed keys become null)."""
    patch = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


def owner_name(obj: Mapping, kind: str) -> str | None:
    for ref in meta_of(obj).get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return ref.get("name")
    return None


def finalizer_patch(obj: Mapping, finalizers: list[str]) -> list[dict]:
    """JSON patch replacing the finalizers, guarded by a test of the old list (as KubeVirt does)."""
    old = meta_of(obj).get("finalizers")
    ops: list[dict] = []
    if old is None:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": finalizers})
    else:
        ops.append({"op": "test", "path": "/metadata/finalizers", "value": old})
        ops.append({"op": "replace", "path": "/metadata/finalizers", "value": finalizers})
    return ops

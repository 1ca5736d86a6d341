"""Reading KubeVirt objects: phases, owners, run strategies and versions (docs/facts.md §1–2).

Pure functions over the dicts the API returns (and events carry); no I/O. Every read goes through
shared.objects, so a field of the wrong type is absent, never an exception.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from shared import objects as o

FINAL_PHASES = ("Succeeded", "Failed")
RUN_STRATEGIES = ("Always", "RerunOnFailure", "Manual", "Once", "Halted")
# On a VMIM KubeVirt's evacuation controller creates for a drained node: that node's name (types.go
# EvacuationMigrationAnnotation, docs/facts.md §10). evacuation-report speaks for these migrations.
EVACUATION_MIGRATION = "kubevirt.io/evacuationMigration"


def meta(obj: Any) -> dict:
    """metadata, or {} when absent or not an object."""
    return o.mapping(obj, "metadata")


def annotations_of(obj: Any) -> dict[str, str]:
    """The annotations whose values are strings (a Kubernetes annotation always is)."""
    return o.strings(obj, "metadata", "annotations")


def labels_of(obj: Any) -> dict[str, str]:
    return o.strings(obj, "metadata", "labels")


def api_path(obj: dict) -> str:
    """The object's API path, as ApiServerSource puts it in `subject`."""
    api_version, kind = o.text(obj, "apiVersion", default="v1"), o.string(obj, "kind")
    plural = {"VirtualMachineInstance": "virtualmachineinstances", "VirtualMachine": "virtualmachines",
              "VirtualMachineInstanceMigration": "virtualmachineinstancemigrations",
              "Pod": "pods"}.get(kind, kind.lower() + "s")
    namespace = o.string(obj, "metadata", "namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{api_version}{where}/{plural}/{o.text(obj, 'metadata', 'name')}"


def parse_time(text: Any) -> datetime | None:
    """RFC 3339 as Kubernetes writes it ('2024-02-21T03:56:46Z'); None when absent or unreadable."""
    if not text or not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def conditions_of(obj: Any) -> list[dict]:
    """status.conditions: the entries that are objects."""
    return list(o.objects(obj, "status", "conditions"))


def phase(vmi: Any) -> str:
    return o.string(vmi, "status", "phase")


def phase_since(vmi: dict, which: str) -> datetime | None:
    """When the VMI entered phase `which`, from status.phaseTransitionTimestamps (the last entry wins)."""
    found = None
    for entry in o.objects(vmi, "status", "phaseTransitionTimestamps"):
        if entry.get("phase") == which:
            found = parse_time(entry.get("phaseTransitionTimestamp")) or found
    return found


def controller_owner(obj: Any, kind: str) -> dict | None:
    """The controller ownerReference of that kind, if any (one with a string name: a reference is read by it)."""
    for ref in o.objects(obj, "metadata", "ownerReferences"):
        if ref.get("kind") == kind and ref.get("controller") is True and o.text(ref, "name"):
            return ref
    return None


def run_strategy(vm: Any) -> str | None:
    """spec.runStrategy, or the legacy spec.running (true = Always, false = Halted); KubeVirt's
    default when neither is set is Halted."""
    spec = o.mapping(vm, "spec")
    strategy = o.text(spec, "runStrategy")
    if strategy:
        return strategy
    if o.flag(spec, "running") is not None:
        return "Always" if spec["running"] else "Halted"
    return "Halted"


def migration_in_flight(vmi: Any) -> bool:
    """A migration of this VMI has started and has not finished (status.migrationState)."""
    state = o.mapping(vmi, "status", "migrationState")
    return bool(state.get("startTimestamp")) and not (state.get("completed") or state.get("failed")
                                                       or state.get("endTimestamp"))


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: Any) -> tuple[int, int, int] | None:
    """'v1.1.1' → (1, 1, 1); 'v1.3.0-rc.1-15-gabc' → (1, 3, 0); None when unreadable."""
    match = _VERSION.match(text if isinstance(text, str) else "")
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)

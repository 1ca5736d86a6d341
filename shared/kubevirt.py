"""Reading KubeVirt objects: phases, owners, run strategies and versions (docs/facts.md §1–2).

Pure functions over the dicts the API returns; no I/O.
"""
from __future__ import annotations

import re
from datetime import UTC, datetime

FINAL_PHASES = ("Succeeded", "Failed")
RUN_STRATEGIES = ("Always", "RerunOnFailure", "Manual", "Once", "Halted")


def meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def annotations_of(obj: dict | None) -> dict:
    return (meta(obj).get("annotations") or {}) if obj else {}


def api_path(obj: dict) -> str:
    """The object's API path, as ApiServerSource puts it in `subject`."""
    m = meta(obj)
    api_version = obj.get("apiVersion", "v1")
    plural = {"VirtualMachineInstance": "virtualmachineinstances", "VirtualMachine": "virtualmachines",
              "VirtualMachineInstanceMigration": "virtualmachineinstancemigrations",
              "Pod": "pods"}.get(obj.get("kind", ""), obj.get("kind", "").lower() + "s")
    namespace = f"/namespaces/{m['namespace']}" if m.get("namespace") else ""
    return f"/apis/{api_version}{namespace}/{plural}/{m.get('name')}"


def parse_time(text: str | None) -> datetime | None:
    """RFC 3339 as Kubernetes writes it ('2024-02-21T03:56:46Z'); None when absent or unreadable."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def phase(vmi: dict) -> str:
    return (vmi.get("status") or {}).get("phase") or ""


def phase_since(vmi: dict, which: str) -> datetime | None:
    """When the VMI entered phase `which`, from status.phaseTransitionTimestamps (the last entry wins)."""
    found = None
    for entry in (vmi.get("status") or {}).get("phaseTransitionTimestamps") or ():
        if entry.get("phase") == which:
            found = parse_time(entry.get("phaseTransitionTimestamp")) or found
    return found


def controller_owner(obj: dict, kind: str) -> dict | None:
    """The controller ownerReference of that kind, if any."""
    ref: dict
    for ref in meta(obj).get("ownerReferences") or ():
        if ref.get("kind") == kind and ref.get("controller"):
            return ref
    return None


def run_strategy(vm: dict) -> str | None:
    """spec.runStrategy, or the legacy spec.running (true = Always, false = Halted); KubeVirt's
    default when neither is set is Halted."""
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        strategy: str = spec["runStrategy"]
        return strategy
    if "running" in spec and spec["running"] is not None:
        return "Always" if spec["running"] else "Halted"
    return "Halted"


def migration_in_flight(vmi: dict) -> bool:
    """A migration of this VMI has started and has not finished (status.migrationState)."""
    state = (vmi.get("status") or {}).get("migrationState") or {}
    return bool(state.get("startTimestamp")) and not (state.get("completed") or state.get("failed")
                                                       or state.get("endTimestamp"))


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """'v1.1.1' → (1, 1, 1); 'v1.3.0-rc.1-15-gabc' → (1, 3, 0); None when unreadable."""
    match = _VERSION.match(text or "")
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)

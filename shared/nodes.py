"""Reading a Node the way KubeVirt and Harvester read it: readiness, cordon, taints, and Harvester's maintenance
annotations (docs/facts.md §10). Pure: functions over the dicts the API returns; no I/O.

evacuation-report decides from these which nodes are being emptied or have stopped answering; vm-stuck-report
uses the same words to leave a VM on such a node to evacuation-report (docs/vm-stuck-report.md, who speaks).
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from shared import kubevirt as kv
from shared import objects as o

PURE = True

DRAIN_TAINT = "kubevirt.io/drain"                     # KubeVirt's nodeDrainTaintKey default (pkg/virt-config)
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"  # Kubernetes' non-graceful node shutdown
MAINTAIN_STATUS = "harvesterhci.io/maintain-status"   # running | completed (maintain_controller.go)
DRAIN_REQUESTED = "harvesterhci.io/drain-requested"   # the UI's "Enable Maintenance Mode" (formatter.go)
DRAIN_FORCED = "harvesterhci.io/drain-forced"         # ... with "Force"
HEARTBEAT = "kubevirt.io/heartbeat"                   # virt-handler's, read by virt-controller's node controller
SCHEDULABLE = "kubevirt.io/schedulable"               # virt-handler's label; "false" once unresponsive
HARVESTER_DRAINED = "Drained"                         # Harvester ≥ 1.7's node condition (node_down_controller.go)


def ready(node: Any) -> tuple[str, str, datetime | None]:
    """The Ready condition: (status "True" | "False" | "Unknown" | "", reason, since its last transition)."""
    found = next((c for c in kv.conditions_of(node) if c.get("type") == "Ready"), {})
    return (str(found.get("status") or ""), str(found.get("reason") or ""),
            kv.parse_time(found.get("lastTransitionTime")))


def condition(node: Any, kind: str) -> tuple[str, str, datetime | None] | None:
    found = next((c for c in kv.conditions_of(node) if c.get("type") == kind), None)
    if found is None:
        return None
    return (str(found.get("status") or ""), str(found.get("reason") or ""),
            kv.parse_time(found.get("lastTransitionTime")))


def taints(node: Any) -> tuple[tuple[str, str, str], ...]:
    """(key, value, effect) of each taint."""
    return tuple((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
                 for t in o.objects(node, "spec", "taints"))


def has_taint(node: Any, key: str, effect: str | None = None) -> bool:
    return any(k == key and (effect is None or e == effect) for k, _, e in taints(node))


def cordoned(node: Any) -> bool:
    return o.flag(node, "spec", "unschedulable") is True


def down(node: Any) -> bool:
    """The node has stopped answering, as the node lifecycle controller or its kubelet says: Ready is not True."""
    return ready(node)[0] != "True"


def draining(node: Any, drain_key: str = DRAIN_TAINT) -> tuple[str, ...]:
    """Why the node is being emptied, in the words of what does it; () when it is not. KubeVirt's drain taint
    (NoSchedule, evacuation.go), Harvester's maintenance annotations, or a cordon (kubectl drain cordons first)."""
    notes: Mapping[str, str] = kv.annotations_of(node)
    why = []
    if notes.get(DRAIN_REQUESTED) or notes.get(MAINTAIN_STATUS):
        forced = " (forced)" if notes.get(DRAIN_FORCED) else ""
        why.append(f"Harvester maintenance mode{forced}" + (f": {notes[MAINTAIN_STATUS]}" if notes.get(MAINTAIN_STATUS)
                                                             else ": requested"))
    if has_taint(node, drain_key, "NoSchedule"):
        why.append(f"taint {drain_key}:NoSchedule")
    if cordoned(node):
        why.append("cordoned")
    return tuple(why)

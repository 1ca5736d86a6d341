"""What people read about a device conflict: the finding (its Event message and reply data), and why a
conflict ended. The messages are stable for the same conflict."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from functions.device_conflict.decide import Category, DeviceConflict, Workload
from functions.device_conflict.settings import FUNCTION
from shared.finding import Finding


def finding(conflict: DeviceConflict) -> Finding:
    """The conflict as a finding (docs/findings.md): its identity labels are the alert's labels of old
    (namespace and name of the holder, else of the first named VM; the device; the category)."""
    who = conflict.holder or conflict.blocked[0]
    return Finding(FUNCTION, conflict.category.value, conflict.blocked[0].api_path(), conflict.key,
                   {"namespace": who.namespace, "vm": who.name, "device": conflict.device,
                    "conflict": conflict.category.value},
                   conflict.severity, conflict_message(conflict), details=details(conflict))


def details(conflict: DeviceConflict) -> dict:
    """The finding's details. `kind` is the category, as the Events on record of earlier versions named it."""
    return {"kind": conflict.category.value, "device": conflict.device, "resourceName": conflict.resource,
            "node": conflict.node, "holder": conflict.holder.id if conflict.holder else None,
            "blocked": [b.id for b in conflict.blocked]}


def conflict_message(conflict: DeviceConflict) -> str:
    """The HostDeviceConflict Event's message: one sentence per category."""
    c = conflict
    on = f" on {c.node}" if c.node else ""
    device = f"{c.device} ({c.resource}){on}"
    if c.holder is None:  # double-assigned: nobody holds it yet
        names = [b.id for b in c.blocked]
        both = "both" if len(names) == 2 else "all"
        listed = ", ".join(names[:-1]) + f" and {names[-1]}"
        return (f"{listed} {both} name {device} and none of them runs yet: only one can run at a time. "
                f"Edit the others to name another {c.resource} device.")
    holder, other = c.holder.id, c.blocked[0].id
    if c.category is Category.BLOCKED:
        return (f"{other} cannot start (Insufficient {c.resource}): {holder} holds {device}, which "
                f"{other} names too. Stop {holder}, or edit {other} to name another free "
                f"{c.resource} device, and {other} can start.")
    return f"{holder} holds {device}; stopped VM {other} names it too and cannot start while {holder} runs."


def resolved_message(data: Mapping, because: str) -> str:
    """The HostDeviceConflictResolved Event's message (and the resolved finding's summary), from its details."""
    return f"No longer in conflict over {data['device']} ({data['kind']}): {because}."


def why_resolved(data: Mapping, current: Iterable[DeviceConflict], workloads: Mapping[str, Workload]) -> str:
    """A short reason a recorded conflict ended, from what the re-scan sees now."""
    device, holder, blocked = data.get("device"), data.get("holder"), list(data.get("blocked") or ())
    people = set(blocked) | ({holder} if holder else set())
    for c in current:
        if c.device == device and {r.id for r in c.involved} == people:
            return f"it is now {c.category}"
    for vm in sorted(people):
        w = workloads.get(vm)
        if w is None or not any(d.name == device for d in w.devices | w.named):
            return f"{vm} no longer names or holds {device}"
    if holder and not workloads[holder].active:
        return f"{holder} no longer runs"
    started = [b for b in blocked if workloads[b].active]
    if started:
        return f"{started[0]} runs now"
    return "the conflict is no longer seen"

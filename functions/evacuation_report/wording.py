"""What people read about a node's evacuation: the Event's sentence, the finding (a line per VM: what happens to
it, why, when, what blocks it, the next step) and the end of an episode."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from functions.evacuation_report.decide import Category, Line, Verdict
from functions.evacuation_report.lines import TROUBLE, stamp
from shared.finding import Finding
from shared.ledger import Record

FUNCTION = "evacuation-report"
REASONS = {Category.DRAIN: "NodeEvacuation", Category.DOWN: "NodeDown"}
RESOLVED_REASONS = {Category.DRAIN: "NodeEvacuationResolved", Category.DOWN: "NodeDownResolved"}  # the end's Event
SEVERITY = {Category.DRAIN: "warning", Category.DOWN: "critical"}
MESSAGE_LIMIT = 1000  # an Event's message is cut by some clients past 1 kB; the finding holds every line


def subject(node: str) -> str:
    return f"/api/v1/nodes/{node}"


def line_data(line: Line) -> dict[str, Any]:
    data: dict[str, Any] = {"vm": line.vm, "outcome": line.outcome.value, "why": line.why,
                            "nextStep": line.next_step or None, "when": stamp(line.when) if line.when else None,
                            "blockers": list(line.blockers)}
    m = line.migration
    if m is not None:
        data["migration"] = {"name": m.name, "uid": m.uid, "phase": m.phase, "evacuation": bool(m.evacuation_of),
                             "targetNode": m.target_node or None, "failureReason": m.failure_reason or None,
                             "started": stamp(m.started) if m.started else None,
                             "ended": stamp(m.ended) if m.ended else None,
                             "conditions": [list(c) for c in m.conditions],
                             "budget": {"completionTimeoutPerGiB": m.per_gib, "gigabytes": m.gigabytes,
                                        "completionTimeoutSeconds": m.budget, "source": m.budget_source or None,
                                        "usedRatio": line.budget_used}}
    return data


def event_message(verdict: Verdict, node: str) -> str:
    """One paragraph: the node, what empties it (or why it is down), each VM in trouble with why, the rest counted,
    and the next step. Stable while the lines are: recording it again only raises the count."""
    assert verdict.category is not None
    head = (f"Node {node} is being emptied ({verdict.drainer})" if verdict.category is Category.DRAIN
            else f"Node {node} stopped answering ({verdict.drainer})")
    counted: dict[str, int] = {}
    for line in verdict.lines:
        counted[line.outcome.value] = counted.get(line.outcome.value, 0) + 1
    parts = [f"{head}: {len(verdict.lines)} VM(s): " + ", ".join(f"{n} {k}" for k, n in counted.items()) + "."]
    for line in verdict.trouble:
        parts.append(f"{line.vm} {line.outcome.value}: {line.why}" + (f" [{'; '.join(line.blockers)}]"
                                                                      if line.blockers else "") + ".")
    text = " ".join(parts) + f" Next: {verdict.next_step}"
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 40] + " … (every VM in the finding)"


def finding(verdict: Verdict, node: Mapping[str, Any]) -> Finding:
    """A node's episode as a finding (docs/findings.md): its identity is the category and the node's uid (a node
    registered again is another finding); its lines change as the VMs move, its identity does not."""
    assert verdict.category is not None
    meta = node.get("metadata") or {}
    name = str(meta.get("name"))
    details = {"node": name, "category": verdict.category.value, "cause": verdict.drainer,
               "since": stamp(verdict.since) if verdict.since else None, "reason": verdict.reason,
               "vms": [line_data(line) for line in verdict.lines],
               "trouble": [line.vm for line in verdict.lines if line.outcome in TROUBLE], "nextStep": verdict.next_step}
    return Finding(FUNCTION, verdict.category.value, subject(name), str(meta.get("uid") or name),
                   {"node": name, "state": verdict.category.value}, SEVERITY[verdict.category],
                   event_message(verdict, name), (verdict.next_step,), details)


def outcomes(details: Mapping[str, Any]) -> dict[str, str]:
    """vm → outcome of a finding's lines: what tells a change worth writing from a sighting."""
    return {str(v.get("vm")): str(v.get("outcome")) for v in details.get("vms") or () if isinstance(v, Mapping)}


def resolved_message(record: Record, because: str) -> str:
    d = record.finding.details
    what = "being emptied" if d.get("category") == Category.DRAIN.value else "down"
    return f"Node {d.get('node')} is no longer {what} ({d.get('cause')}): {because}."

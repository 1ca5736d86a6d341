"""evacuation-report's pure part: for a node being emptied or one that stopped answering, what happens to each VM
on it, why, and when — from facts read fresh (facts.py). No I/O, no clock, no environment.

Every outcome rests on what KubeVirt and Harvester do, per version (docs/facts.md §10): KubeVirt's evacuation
controller and eviction webhook (eviction strategy, LiveMigratable), Harvester's maintenance mode and its VM
labels, the upgrade's pre-drain, and the node-down controller with vm-force-reset-policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from functions.evacuation_report.down import down_line, down_next, down_words
from functions.evacuation_report.drain import drain_line, drain_next, drain_since, drainer
from functions.evacuation_report.facts import Facts, VMFacts
from functions.evacuation_report.lines import TROUBLE, Line, Outcome, counts, span, stamp
from functions.evacuation_report.settings import Settings

PURE = True
__all__ = ["Action", "Category", "Line", "Outcome", "Verdict", "decide"]


class Action(StrEnum):
    REPORT = "report"      # the node is draining or down with VMs on it: open, update, or keep its finding
    SETTLED = "settled"    # back in service, drained clean, or nothing on it: any open finding ends
    WAIT = "wait"          # down for less than EVACUATION_DOWN_AFTER
    SKIP = "skip"          # opted out


class Category(StrEnum):
    DRAIN = "node-drain"
    DOWN = "node-down"


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    category: Category | None = None
    drainer: str = ""                    # what empties the node, or why it is down
    since: datetime | None = None
    lines: tuple[Line, ...] = ()
    next_step: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def trouble(self) -> tuple[Line, ...]:
        return tuple(line for line in self.lines if line.outcome in TROUBLE)


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """What this node's finding says now: its category, what empties it, and a line per VM."""
    node = facts.node
    if node.opted_out:
        return Verdict(Action.SKIP, f"node {node.name} opted out")
    if node.ready != "True":
        since = node.ready_since
        if since is not None and now - since < settings.down_after:
            return Verdict(Action.WAIT, f"node {node.name} is Ready={node.ready} since {stamp(since)}, not yet "
                                        f"{span(settings.down_after)}")
        lines = tuple(down_line(vm, facts, now) for vm in _in_scope(facts, settings))
        if not any(line.outcome not in (Outcome.RECOVERED, Outcome.LEFT) for line in lines):
            return Verdict(Action.SETTLED, f"node {node.name} is Ready={node.ready}, and no VM is left on it"
                                           + (f" ({counts(lines)})" if lines else ""), lines=lines)
        return Verdict(Action.REPORT, f"node {node.name} is Ready={node.ready}: {counts(lines)}", Category.DOWN,
                       down_words(node), since, lines, down_next(lines))
    what = drainer(node, facts.cluster)
    if not what:
        return Verdict(Action.SETTLED, f"node {node.name} is back in service (Ready, schedulable, no drain taint)")
    lines = tuple(drain_line(vm, facts, settings, now) for vm in _in_scope(facts, settings))
    staying = [line for line in lines if line.outcome not in (Outcome.MIGRATED, Outcome.LEFT)]
    if not staying:
        return Verdict(Action.SETTLED, f"node {node.name} is drained clean" + (f" ({counts(lines)})" if lines else
                                                                             ": no VM on it"), lines=lines)
    return Verdict(Action.REPORT, f"node {node.name} is being emptied ({what}): {counts(lines)}", Category.DRAIN,
                   what, drain_since(node), lines, drain_next(lines))


def _in_scope(facts: Facts, settings: Settings) -> list[VMFacts]:
    return sorted((vm for vm in facts.vms if settings.in_scope(vm.namespace)), key=lambda vm: vm.key)



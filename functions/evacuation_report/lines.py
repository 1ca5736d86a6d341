"""One VM's line in a node's finding: what happens to it (the outcome), why, when, what blocks it and the next
step; and the small words every part of decide uses. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from functions.evacuation_report.facts import MigrationFacts

PURE = True
HEARTBEAT_TIMEOUT = timedelta(minutes=5)  # virt-controller's node controller (docs/facts.md §10)
RESTARTS = ("Always", "RerunOnFailure")   # run strategies under which KubeVirt starts a failed VMI again (§2)


class Outcome(StrEnum):
    MIGRATE = "will-migrate"            # KubeVirt will live-migrate it (no migration yet)
    MIGRATING = "migrating"             # its migration runs
    MIGRATED = "migrated"               # it left by live migration
    MIGRATION_FAILED = "migration-failed"
    SHUT_DOWN = "will-shut-down"        # the drain (or Harvester) shuts it down
    STOPPING = "stopping"               # its VMI is being deleted / has ended
    BLOCKS = "blocks-drain"             # nothing moves it: the drain cannot finish while it runs
    LEFT = "left"                       # no longer on the node (stopped, deleted, or moved without a migration seen)
    RESTARTS = "restarts-elsewhere"     # down node: KubeVirt starts it again on another node once it is failed
    STAYS_OFF = "stays-off"             # down node: failed, and its run strategy does not start it again
    STUCK = "stuck"                     # down node: nothing will move it
    RECOVERED = "recovered"             # down node: it runs on another node now


TROUBLE = (Outcome.MIGRATION_FAILED, Outcome.SHUT_DOWN, Outcome.BLOCKS, Outcome.STAYS_OFF, Outcome.STUCK)


@dataclass(frozen=True)
class Line:
    """One VM of the node: what happens to it, why, when, what blocks it, and the next step."""

    vm: str
    outcome: Outcome
    why: str
    next_step: str = ""
    when: datetime | None = None
    blockers: tuple[str, ...] = ()
    migration: MigrationFacts | None = None
    budget_used: float | None = None


# -- words ------------------------------------------------------------------------------------------
def counts(lines: tuple[Line, ...]) -> str:
    if not lines:
        return "no VM on it"
    counted: dict[str, int] = {}
    for line in lines:
        counted[line.outcome.value] = counted.get(line.outcome.value, 0) + 1
    return f"{len(lines)} VM(s): " + ", ".join(f"{n} {what}" for what, n in counted.items())


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"

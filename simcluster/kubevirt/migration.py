"""Stands in for virt-handler and virt-launcher in a live migration: virt-launcher's migration monitor decides
how a migration ends, and virt-handler reports it on the VMI.

The node stand-in (simcluster.kubevirt.sim.KubeVirtSim, node_only) plays the source and target virt-handler while
KubeVirt's own migration controller runs the VMIM. How a migration ends is the monitor's arithmetic, with the
numbers virt-controller handed to the VMI (`status.migrationState.migrationConfiguration`, written at the
target pod's hand-off for every version, pkg/virt-controller/watch/migration/migration.go):

- the completion budget: `completionTimeoutPerGiB × getVMIMigrationDataSize(vmi)` — the memory request,
  overridden by `memory.guest`, rounded up to whole decimal gigabytes (`ScaledValue(resource.Giga)`,
  pkg/virt-launcher/virtwrap/manager.go); the monitor aborts once the elapsed whole seconds exceed it:
  "Live migration is not completed after <budget> seconds and has been aborted";
- the progress timeout: aborted once no data moved for more than `progressTimeout` whole seconds, so the first
  check that trips sees one second more: "Live migration stuck for <progressTimeout + 1> seconds and has been
  aborted" (pkg/virt-launcher/virtwrap/live-migration-source.go, v1.1.1 to v1.8.3).

Either abort ends with `abortStatus: Succeeded`. virt-handler copies the result onto the VMI
(pkg/virt-handler/vm.go ≤ v1.3, migration-source.go v1.8): `failed`, `endTimestamp`, `failureReason` (from
v1.3.0; v1.1.1 has the field in no status), `completed` (the source virt-handler copies the launcher's, set with
the end, up to v1.5; from v1.6.0 the target virt-handler sets it with `failed` once it sees the aborted migration,
v1.8.3 migration-target.go), and records the Warning Event `Migrated` "VirtualMachineInstance migration uid <uid>
failed. reason:<failureReason>" on the VMI.

Time is compressed: a migration that would run for an hour ends within the stand-in's next steps, its
startTimestamp written that many seconds before its endTimestamp (both virt-handler's to write).
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from simcluster.kubevirt.objects import (
    CREATED_BY_LABEL,
    FINAL_POD_PHASES,
    MIGRATION_JOB_LABEL,
    NODE_NAME_LABEL,
    VIRT_HANDLER_COMPONENT,
    VMIS,
    Key,
    is_deleting,
    meta_of,
    parse_time,
    rfc3339,
    status_of,
)

COMPLETE, COMPLETION_TIMEOUT, PROGRESS_STALL = "complete", "completion-timeout", "progress-stall"
OUTCOMES = (COMPLETE, COMPLETION_TIMEOUT, PROGRESS_STALL)
NOT_COMPLETED = "Live migration is not completed after {} seconds and has been aborted"
STUCK = "Live migration stuck for {} seconds and has been aborted"
MIGRATED_FAILED = "VirtualMachineInstance migration uid {} failed. reason:{}"
# pkg/virt-config/virt-config.go: MigrationCompletionTimeoutPerGiB 800 up to v1.3.x, 150 from v1.4.0;
# MigrationProgressTimeout 150 throughout. Only used when the VMI carries no migrationConfiguration.
PROGRESS_TIMEOUT = 150

_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50}
_DECIMAL = {"": 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15}


@dataclass
class Plan:
    """How the next migration of one VMI goes on its nodes. `took`: the seconds a completing one runs."""

    outcome: str = COMPLETE
    took: int = 1

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r}: one of {', '.join(OUTCOMES)}")


@dataclass(frozen=True)
class Run:
    """A migration under way on the stand-in: its uid, how long it runs, and the launcher's failure reason."""

    uid: str
    seconds: int
    failure: str | None = None


def per_gib_default(version: tuple[int, int, int]) -> int:
    return 800 if version < (1, 4, 0) else 150


def data_gigabytes(vmi: Mapping) -> int:
    """getVMIMigrationDataSize without block migration: the memory, in whole decimal gigabytes rounded up."""
    domain = ((vmi.get("spec") or {}).get("domain") or {})
    text = ((domain.get("memory") or {}).get("guest")
            or ((domain.get("resources") or {}).get("requests") or {}).get("memory"))
    match = re.fullmatch(r"([0-9]+)([A-Za-z]*)", str(text or "").strip())
    if not match or match.group(2) not in {**_BINARY, **_DECIMAL}:
        return 0
    size = int(match.group(1)) * {**_BINARY, **_DECIMAL}[match.group(2)]
    return math.ceil(size / 10 ** 9)


def run_for(plan: Plan, vmi: Mapping, state: Mapping, version: tuple[int, int, int]) -> Run:
    """How long the monitor lets this migration run, and how it ends, with the numbers virt-controller wrote."""
    config = state.get("migrationConfiguration") or {}
    per_gib = int(config.get("completionTimeoutPerGiB") or per_gib_default(version))
    progress = int(config.get("progressTimeout") or PROGRESS_TIMEOUT)
    uid = str(state.get("migrationUid") or "")
    if plan.outcome == COMPLETION_TIMEOUT:
        budget = per_gib * data_gigabytes(vmi)
        return Run(uid, budget + 1, NOT_COMPLETED.format(budget))
    if plan.outcome == PROGRESS_STALL:
        return Run(uid, progress + 1, STUCK.format(progress + 1))
    return Run(uid, max(0, int(plan.took)))


def failed_state(state: Mapping, run: Run, start: datetime, version: tuple[int, int, int]) -> dict:
    """The VMI's migrationState once virt-handler reported the launcher's abort."""
    new = dict(state, failed=True, completed=True, abortStatus="Succeeded",
               endTimestamp=_stamp(start + timedelta(seconds=run.seconds)))
    if version >= (1, 3, 0):
        new["failureReason"] = run.failure
    return new


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def migrating(vmi: Mapping) -> bool:
    """The migration controller handed a migration to the VMI (target node set) and it has not ended."""
    state = status_of(vmi).get("migrationState") or {}
    return bool(state.get("targetNode") and state.get("migrationUid")) and not (state.get("completed")
                                                                                 or state.get("failed"))


class Migrations:
    """virt-handler's part of live migrations, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py); the plans
    and runs are its `_plans`, `_runs` and `_aborted_at`."""

    def plan_migration(self, namespace: str, vmi_name: str, outcome: str = COMPLETE, took: int = 1) -> None:
        """node_only: how the next live migration of this VMI goes on its nodes (simcluster/kubevirt/migration.py):
        it completes after `took` seconds, or virt-launcher aborts it on its completion budget or its progress
        timeout, with the numbers KubeVirt's migration controller handed to the VMI. Time is compressed."""
        self._plans[(namespace, vmi_name)] = Plan(outcome, took)

    def _failed_target(self, vmi: Mapping, pod: Mapping) -> bool:
        """The target pod of this VMI's migration, which virt-launcher aborted a moment ago: once KubeVirt has
        seen the failure (a second later), the target virt-handler tears the target domain down."""
        state = status_of(vmi).get("migrationState") or {}
        job = (meta_of(pod).get("labels") or {}).get(MIGRATION_JOB_LABEL)
        if not state.get("failed") or job != state.get("migrationUid"):
            return False
        return time.monotonic() - self._aborted_at.get(str(job), 0.0) >= 1.0

    def _failed_target_pending(self, vmi: Mapping) -> bool:
        state = status_of(vmi).get("migrationState") or {}
        if not state.get("failed"):
            return False
        return any(status_of(p).get("phase") not in FINAL_POD_PHASES and not is_deleting(p)
                   for p in self._kube.pods(meta_of(vmi)["namespace"],
                                            f"{MIGRATION_JOB_LABEL}={state['migrationUid']}"))

    def _migration_step(self, key: Key, vmi: dict) -> bool:
        """virt-handler's part of a live migration the migration controller handed to the VMI (its
        migrationState names the target node): the target prepares (targetNodeAddress), the source starts
        (startTimestamp), then it completes: the VMI runs on the target node, the source launcher exits; or,
        as planned (`plan_migration`), virt-launcher aborts it (simcluster/kubevirt/migration.py)."""
        if not migrating(vmi):
            return False
        meta, state = meta_of(vmi), dict(status_of(vmi)["migrationState"])
        now = self.clock()
        patch: dict = {}
        uid = str(state["migrationUid"])
        if not state.get("targetNodeAddress"):
            state.update(targetNodeAddress="10.0.0.2", targetNodeDomainDetected=True)
        elif not state.get("startTimestamp"):
            run = run_for(self._plans.pop(key, Plan()), vmi, state, self.version)
            self._runs[uid] = run
            state.update(startTimestamp=rfc3339(now - timedelta(seconds=run.seconds)), mode="PreCopy")
        else:
            run = self._runs.get(uid) or Run(uid, 0)
            start = parse_time(state["startTimestamp"]) or now
            if run.failure is not None:
                state = failed_state(state, run, start, self.version)
                self._aborted_at[uid] = time.monotonic()
                self._kube.record(vmi, "Warning", "Migrated", MIGRATED_FAILED.format(uid, run.failure),
                                  VIRT_HANDLER_COMPONENT, now)
                self._kube.patch(VMIS, meta["namespace"], meta["name"], {"status": {"migrationState": state}})
                return True
            end = rfc3339(min(now, start + timedelta(seconds=run.seconds)))
            state.update(completed=True, endTimestamp=end, targetNodeDomainReadyTimestamp=end)
            patch = {"metadata": {"labels": {NODE_NAME_LABEL: state["targetNode"]}}}
            self._kube.record(vmi, "Normal", "Migrated", f"The VirtualMachineInstance migrated to node "
                              f"{state['targetNode']}.", VIRT_HANDLER_COMPONENT, now)
            for pod in self._kube.pods(meta["namespace"], f"{CREATED_BY_LABEL}={meta['uid']}"):
                if (pod.get("spec") or {}).get("nodeName") != state["targetNode"]:
                    self._finish_pod(pod, "Succeeded")  # the source launcher exits once the guest left
        status: dict = {"migrationState": state}
        if state.get("completed"):
            status["nodeName"] = state["targetNode"]
            if not state.get("failed"):  # the hand-off clears the eviction mark (v1.3.0 pkg/virt-handler/vm.go)
                status["evacuationNodeName"] = None
        self._kube.patch(VMIS, meta["namespace"], meta["name"], {**patch, "status": status})
        return True

"""A node being emptied — a cordon and kubectl drain, KubeVirt's drain taint, Harvester's maintenance mode or an
upgrade's pre-drain — and what that does to one VM on it (docs/facts.md §10). Pure."""
from __future__ import annotations

from datetime import datetime, timedelta

from functions.evacuation_report.facts import (
    DRAINING_STEPS,
    SHUTDOWN_STRATEGIES,
    ClusterFacts,
    Facts,
    MigrationFacts,
    NodeFacts,
    VMFacts,
)
from functions.evacuation_report.lines import RESTARTS, Line, Outcome
from functions.evacuation_report.settings import Settings
from shared import nodes

PURE = True


# -- what empties it --------------------------------------------------------------------------------------
def drainer(node: NodeFacts, cluster: ClusterFacts) -> str:
    upgrade = cluster.upgrade
    if upgrade is not None and upgrade.node_state in DRAINING_STEPS:
        return f"Harvester upgrade {upgrade.name}: {upgrade.node_state}"
    if node.maintenance:
        status = node.annotations.get(nodes.MAINTAIN_STATUS) or "requested"
        return f"Harvester maintenance mode{' (forced)' if node.forced else ''}: {status}"
    if node.has_taint(cluster.drain_taint_key):
        return f"taint {cluster.drain_taint_key}:NoSchedule"
    if node.unschedulable:
        return "cordoned"
    return ""


def drain_since(node: NodeFacts) -> datetime | None:
    return None  # a cordon or a taint carries no time; the finding's openedAt says when it was first seen


def _evicts(node: NodeFacts, cluster: ClusterFacts) -> bool:
    """Whether pods are evicted (kubectl drain, Harvester's drain helper), as opposed to the drain taint alone."""
    upgrade = cluster.upgrade
    if upgrade is not None and upgrade.node_state in DRAINING_STEPS:
        return upgrade.node_state != "Pre-draining"  # the pre-drain taints; RKE2's drain evicts after it
    return node.maintenance or (node.unschedulable and not node.has_taint(cluster.drain_taint_key))


def drain_line(vm: VMFacts, facts: Facts, settings: Settings, now: datetime) -> Line:
    node, cluster = facts.node, facts.cluster
    m = vm.migration
    if vm.node != node.name or vm.phase in ("Succeeded", "Failed"):
        if m is not None and m.phase == "Succeeded" and vm.node and vm.node != node.name:
            return Line(vm.key, Outcome.MIGRATED, f"live-migrated to {vm.node} by {m.name}", migration=m)
        where = f"now on {vm.node}" if vm.node and vm.node != node.name else f"its VMI is {vm.phase or 'gone'}"
        return Line(vm.key, Outcome.LEFT, f"left the node ({where})", migration=m)
    if vm.deleting:
        return Line(vm.key, Outcome.STOPPING, "its VMI is being deleted: the guest is shutting down")
    upgrade = cluster.upgrade
    upgrading = upgrade is not None and upgrade.node_state in DRAINING_STEPS
    if node.maintenance and not node.forced and not upgrading and vm.maintain_strategy in SHUTDOWN_STRATEGIES:
        after = {"Shutdown": "it stays off", "ShutdownAndRestartAfterEnable":
                 "Harvester starts it again once the node is in maintenance (on another node)",
                 "ShutdownAndRestartAfterDisable": "Harvester starts it again when maintenance mode is disabled"}
        return Line(vm.key, Outcome.SHUT_DOWN, f"its label harvesterhci.io/maintain-mode-strategy="
                    f"{vm.maintain_strategy}: Harvester's maintenance mode stops it; "
                    f"{after[vm.maintain_strategy]}", "Nothing to do if that is intended; otherwise set the label "
                    "to Migrate before enabling maintenance mode.")
    if node.maintenance and node.forced and not upgrading and _harvester_non_migratable(vm):
        return Line(vm.key, Outcome.SHUT_DOWN, f"forced maintenance mode stops every VM Harvester finds not "
                    f"migratable, and this one is ({_non_migratable_words(vm)}); it stays off",
                    "Start it again once the node is back, or beforehand on another node if it can run there.")
    if upgrading and _upgrade_non_migratable(vm, cluster):
        return Line(vm.key, Outcome.SHUT_DOWN, f"the upgrade's pre-drain stops the VMs it finds not live-migratable "
                    f"({_upgrade_words(vm, cluster)}); Harvester restores them after the node's upgrade",
                    "Nothing to do if a planned shutdown is acceptable; otherwise schedule the upgrade when it may "
                    "be down, or remove what pins it.")
    if m is not None and not m.final:
        return _migrating(vm, m, settings, now)
    strategy = vm.eviction_strategy or cluster.eviction_default or "None"
    source = "its" if vm.eviction_strategy else ("the cluster's" if cluster.eviction_default else "KubeVirt's default")
    migratable = vm.migratable is not None and vm.migratable[0] == "True"
    not_why = _not_migratable_words(vm)
    if m is not None and m.phase == "Failed" and m.evacuation_of == node.name:
        return _failed(vm, m, facts, upgrading)
    evicts = _evicts(node, cluster) or vm.evacuation_node == node.name
    if strategy in ("LiveMigrate", "LiveMigrateIfPossible") and migratable:
        return Line(vm.key, Outcome.MIGRATE, f"evictionStrategy {strategy} ({source}) and LiveMigratable=True: "
                    f"KubeVirt's evacuation controller creates its migration (at most "
                    f"{_limit(cluster, 'parallelOutboundMigrationsPerNode', 2)} at once from this node)")
    if strategy == "LiveMigrate":
        return Line(vm.key, Outcome.BLOCKS, f"evictionStrategy LiveMigrate ({source}) but {not_why}: KubeVirt refuses "
                    f"its eviction and creates no migration, so the drain cannot finish while it runs",
                    "Stop it (a planned shutdown) or remove what keeps it from migrating; the drain then goes on.")
    if strategy == "External":
        return Line(vm.key, Outcome.BLOCKS, f"evictionStrategy External ({source}): KubeVirt marks it for eviction "
                    f"and waits for an outside controller to move it", "Make sure the controller that owns it "
                    "(e.g. cluster-api-provider-kubevirt) acts, or stop it.")
    what = f"evictionStrategy {strategy} ({source})" + (f" and {not_why}" if strategy != "None" else "")
    if evicts:
        restart = "KubeVirt starts it again elsewhere" if vm.run_strategy in RESTARTS else "it stays off"
        return Line(vm.key, Outcome.SHUT_DOWN, f"{what}: the drain evicts its launcher pod and the guest is shut "
                    f"down; then its run strategy {vm.run_strategy or '(no VM)'} decides: {restart}",
                    "Stop it yourself at a time that suits it, or make it migratable (shared storage, no host "
                    "devices) and set evictionStrategy LiveMigrate.")
    return Line(vm.key, Outcome.BLOCKS, f"{what}: the drain taint moves only VMs that migrate on eviction, so "
                f"nothing moves this one and the node is not emptied while it runs",
                "Stop it (a planned shutdown), or make it migratable and set evictionStrategy LiveMigrate.")


def _migrating(vm: VMFacts, m: MigrationFacts, settings: Settings, now: datetime) -> Line:
    budget = m.budget
    if m.started is None:
        return Line(vm.key, Outcome.MIGRATING, f"migration {m.name} is {m.phase or 'Pending'} (its target pod is not "
                    f"running yet)", migration=m)
    took = int((now - m.started).total_seconds())
    used = round(took / budget, 3) if budget else None
    words = f"migration {m.name} to {m.target_node or '?'} has run {took} s"
    if budget:
        words += f" of a {budget} s completion budget ({m.per_gib} s/GiB × {m.gigabytes} GB, {m.budget_source})"
        if used is not None and used >= settings.warn_ratio:
            words += f": {used:.0%} used, KubeVirt aborts it at the budget unless it converges"
            return Line(vm.key, Outcome.MIGRATING, words, "A MigrationPolicy with allowAutoConverge (or "
                        "allowPostCopy) for it, or a larger completionTimeoutPerGiB, before the next drain.",
                        m.started + timedelta(seconds=budget), migration=m, budget_used=used)
    return Line(vm.key, Outcome.MIGRATING, words, when=m.started + timedelta(seconds=budget) if budget else None,
                migration=m, budget_used=used)


def _failed(vm: VMFacts, m: MigrationFacts, facts: Facts, upgrading: bool) -> Line:
    cluster = facts.cluster
    reason = m.failure_reason or "no failureReason recorded"
    budget = f"; its completion budget was {m.budget} s ({m.per_gib} s/GiB × {m.gigabytes} GB)" if m.budget else ""
    took = f", after {int((m.ended - m.started).total_seconds())} s" if m.ended and m.started else ""
    words = f"its evacuation migration {m.name} failed{took}: {reason}{budget}"
    if upgrading and (cluster.harvester_version is None or cluster.harvester_version >= (1, 7, 0)):
        return Line(vm.key, Outcome.MIGRATION_FAILED, f"{words}; Harvester's upgrade stops a VM whose evacuation "
                    f"failed (upgrade_node.sh, 1.7 on)", "Find why it failed before upgrading the next node "
                    "(migration-report's advice: a MigrationPolicy, a migration network); start it again after.",
                    migration=m)
    return Line(vm.key, Outcome.MIGRATION_FAILED, f"{words}; KubeVirt creates another evacuation migration while "
                f"the drain lasts", "Find why it failed (failureReason above): a MigrationPolicy with "
                "allowAutoConverge or a larger completionTimeoutPerGiB for a timeout, room on the other nodes for an "
                "unschedulable target; or stop it for the maintenance.", migration=m)


def _harvester_non_migratable(vm: VMFacts) -> bool:
    """nodedrain_controller.go FindNonMigratableVMS, as far as the VMI shows it (the last healthy Longhorn replica
    and the nodes' affinity checks are not read)."""
    return vm.cdrom_or_container_disk or (vm.migratable is not None and vm.migratable[0] == "False")


def _upgrade_non_migratable(vm: VMFacts, cluster: ClusterFacts) -> bool:
    """virtualmachineinstance.GetAllNonLiveMigratableVMINames: any nodeSelector, host devices, a CD-ROM or
    container disk up to 1.7 (not in 1.8). It does not read LiveMigratable."""
    old = cluster.harvester_version is not None and cluster.harvester_version < (1, 8, 0)
    return vm.node_selector or vm.host_devices or (old and vm.cdrom_or_container_disk)


def _upgrade_words(vm: VMFacts, cluster: ClusterFacts) -> str:
    if vm.node_selector:
        return "it has a nodeSelector"
    if vm.host_devices:
        return "it uses host devices or GPUs"
    return "it has a CD-ROM or container disk"


def _non_migratable_words(vm: VMFacts) -> str:
    if vm.cdrom_or_container_disk:
        return "a CD-ROM or container disk"
    return _not_migratable_words(vm)


def _not_migratable_words(vm: VMFacts) -> str:
    if vm.migratable is None:
        return "no LiveMigratable condition (virt-handler has not judged it)"
    status, reason, message = vm.migratable
    return f"LiveMigratable={status}" + (f" ({reason}: {message})" if reason or message else "")


def _limit(cluster: ClusterFacts, key: str, default: int) -> int:
    value = cluster.migrations.get(key)
    return value if isinstance(value, int) else default


def drain_next(lines: tuple[Line, ...]) -> str:
    for outcome in (Outcome.BLOCKS, Outcome.MIGRATION_FAILED, Outcome.SHUT_DOWN):
        found = [line for line in lines if line.outcome is outcome]
        if found:
            return f"{', '.join(line.vm for line in found)}: {found[0].next_step}"
    return "Nothing: every VM on it live-migrates; this finding ends once the node is empty or back in service."



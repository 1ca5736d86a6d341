"""What evacuation-report reads about one node and the VMs on it, as values, and how each is read from the objects
KubeVirt, Harvester, Longhorn and Kubernetes write (docs/facts.md §4, §10). Pure (decide.py's rules apply): the
handler's reads (reads.py) hand the objects over, these functions turn them into facts."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import kubevirt as kv
from shared import migrations as mig
from shared import nodes
from shared import objects as o

PURE = True

EVACUATION_ANNOTATION = kv.EVACUATION_MIGRATION  # the node being emptied
EVACUATION_PREFIX = "kubevirt-evacuation-"                  # evacuation.go GenerateNewMigration's generateName
MAINTAIN_STRATEGY = "harvesterhci.io/maintain-mode-strategy"  # a VM's label, copied to its VMI (Harvester ≥ 1.4)
SHUTDOWN_STRATEGIES = ("Shutdown", "ShutdownAndRestartAfterEnable", "ShutdownAndRestartAfterDisable")
UPGRADE_STATE = "harvesterhci.io/upgradeState"              # the Upgrade's label; Succeeded / Failed when over
DRAINING_STEPS = ("Pre-draining", "Pre-drained", "Post-draining")  # an Upgrade's nodeStatuses[node].state


@dataclass(frozen=True)
class NodeFacts:
    name: str
    uid: str = ""
    ready: str = "True"                     # the Ready condition's status: True, False, Unknown
    ready_reason: str = ""
    ready_since: datetime | None = None
    unschedulable: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()       # (key, value, effect)
    annotations: Mapping[str, str] = field(default_factory=dict)  # Harvester's maintenance annotations only
    drained: tuple[str, str, datetime | None] | None = None  # Harvester ≥ 1.7's Drained condition
    opted_out: bool = False

    def has_taint(self, key: str) -> bool:
        return any(k == key for k, _, _ in self.taints)

    @property
    def maintenance(self) -> bool:
        return bool(self.annotations.get(nodes.DRAIN_REQUESTED) or self.annotations.get(nodes.MAINTAIN_STATUS))

    @property
    def forced(self) -> bool:
        return bool(self.annotations.get(nodes.DRAIN_FORCED))


@dataclass(frozen=True)
class ResetPolicy:
    """Harvester's vm-force-reset-policy setting (docs/facts.md §10)."""

    enable: bool
    period: int                         # seconds after Ready left True
    vm_migration_timeout: int | None    # ≥ 1.7: seconds after the drain taint until the out-of-service taint
    source: str                         # "the setting's value", "the setting's default", "Harvester <v>'s default"


@dataclass(frozen=True)
class UpgradeFacts:
    name: str
    node_state: str = ""                # status.nodeStatuses[<node>].state
    node_message: str = ""


@dataclass(frozen=True)
class ClusterFacts:
    kubevirt_version: tuple[int, int, int] | None = None
    eviction_default: str | None = None   # the KubeVirt CR's spec.configuration.evictionStrategy
    drain_taint_key: str = nodes.DRAIN_TAINT
    migrations: Mapping[str, Any] = field(default_factory=dict)   # spec.configuration.migrations
    harvester_version: tuple[int, int, int] | None = None  # None: not Harvester (no server-version Setting)
    reset_policy: ResetPolicy | None = None
    upgrade: UpgradeFacts | None = None   # an Upgrade not yet Succeeded or Failed, with this node's step


@dataclass(frozen=True)
class MigrationFacts:
    """A VMI's latest migration: its VMIM (by name) and what KubeVirt recorded of it, with its completion budget."""

    name: str
    uid: str = ""
    phase: str = ""
    evacuation_of: str = ""             # the node of kubevirt.io/evacuationMigration ("" for another migration)
    created: datetime | None = None
    source_node: str = ""
    target_node: str = ""
    started: datetime | None = None
    ended: datetime | None = None
    failure_reason: str = ""
    conditions: tuple[tuple[str, str, str], ...] = ()   # (type, status, reason)
    per_gib: int | None = None
    gigabytes: int | None = None
    budget_source: str = ""

    @property
    def budget(self) -> int | None:
        return self.per_gib * self.gigabytes if self.per_gib is not None and self.gigabytes is not None else None

    @property
    def final(self) -> bool:
        return self.phase in kv.FINAL_PHASES


@dataclass(frozen=True)
class VolumeFacts:
    claim: str
    volume: str = ""                    # the PV
    attached_to: tuple[str, ...] = ()   # nodes with a VolumeAttachment of it
    longhorn: str = ""
    longhorn_state: str = ""
    longhorn_node: str = ""             # status.currentNodeID


@dataclass(frozen=True)
class VMFacts:
    namespace: str
    name: str                           # the VMI's (and its VM's) name
    uid: str = ""
    phase: str = "Running"
    node: str = ""                      # status.nodeName
    deleting: bool = False
    has_vm: bool = True
    run_strategy: str | None = None     # the VM's
    eviction_strategy: str | None = None  # the VMI's own spec.evictionStrategy
    migratable: tuple[str, str, str] | None = None  # LiveMigratable (status, reason, message)
    evacuation_node: str = ""           # status.evacuationNodeName
    maintain_strategy: str = ""         # label harvesterhci.io/maintain-mode-strategy
    host_devices: bool = False
    cdrom_or_container_disk: bool = False
    node_selector: bool = False
    pod_alive: bool | None = None       # the launcher pod on the node is still in the API, not final
    migration: MigrationFacts | None = None
    volumes: tuple[VolumeFacts, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Facts:
    node: NodeFacts
    vms: tuple[VMFacts, ...] = ()         # the VMIs on the node, and those the open finding named that left it
    cluster: ClusterFacts = ClusterFacts()
    earlier: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # the open finding's lines, by VM


# -- reading the objects --------------------------------------------------------------------------
def node_facts(node: Mapping, opt_out: str) -> NodeFacts:
    status, reason, since = nodes.ready(node)
    notes = kv.annotations_of(node)
    kept = {k: v for k, v in notes.items() if k in (nodes.DRAIN_REQUESTED, nodes.DRAIN_FORCED, nodes.MAINTAIN_STATUS)}
    return NodeFacts(o.string(node, "metadata", "name"), o.string(node, "metadata", "uid"), status or "Unknown",
                     reason, since, nodes.cordoned(node), nodes.taints(node), kept,
                     nodes.condition(node, nodes.HARVESTER_DRAINED),
                     notes.get(opt_out, "").lower() in ("skip", "false", "off"))


def reset_policy(setting: Mapping | None, version: tuple[int, int, int] | None) -> ResetPolicy:
    """vm-force-reset-policy: the setting's value, else its default, else the default of that Harvester
    (pkg/settings/settings_helper.go InitVMForceResetPolicy: 300 s up to 1.6; 15 s and 180 s from 1.7.0)."""
    for field_name, source in (("value", "the setting's value"), ("default", "the setting's default")):
        text = o.text(setting, field_name) if setting else None
        if text:
            try:
                data = json.loads(text)
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("period"), int) and data["period"] > 0:
                timeout = data.get("vmMigrationTimeout")
                return ResetPolicy(bool(data.get("enable")), data["period"],
                                   timeout if isinstance(timeout, int) else None, source)
    newer = version is None or version >= (1, 7, 0)
    label = f"Harvester v{'.'.join(map(str, version))}'s default" if version else "the default"
    return ResetPolicy(True, 15 if newer else 300, 180 if newer else None, label)


def upgrade_facts(upgrades: Iterable[Mapping], node: str) -> UpgradeFacts | None:
    """The Upgrade under way (its state label not Succeeded or Failed: node_down_controller.go isOnUpgrade)."""
    for upgrade in upgrades:
        if kv.labels_of(upgrade).get(UPGRADE_STATE) in ("Succeeded", "Failed"):
            continue
        mine = o.mapping(upgrade, "status", "nodeStatuses", node)
        return UpgradeFacts(o.string(upgrade, "metadata", "name"), o.string(mine, "state"), o.string(mine, "message"))
    return None


def migration_facts(vmim: Mapping, vmi: Mapping | None, cluster: ClusterFacts) -> MigrationFacts:
    """The VMIM, the VMI's migrationState when it is this migration's (the VMIM's copy once final), and its
    completion budget: what KubeVirt recorded it used (migrationState.migrationConfiguration), else the KubeVirt
    CR's value, else the version's default (shared/migrations.py, docs/facts.md §4)."""
    meta = kv.meta(vmim)
    uid = str(meta.get("uid") or "")
    state = dict(o.mapping(vmi, "status", "migrationState")) if vmi else {}
    if state.get("migrationUid") != uid:
        state = {}
    copy = o.mapping(vmim, "status", "migrationState")
    if copy.get("migrationUid") in (None, uid):
        state.update(copy)
    recorded = o.mapping(state, "migrationConfiguration")
    if recorded.get("completionTimeoutPerGiB") is not None:
        per_gib, source = int(recorded["completionTimeoutPerGiB"]), "migrationState.migrationConfiguration"
    elif cluster.migrations.get("completionTimeoutPerGiB") is not None:
        per_gib, source = int(cluster.migrations["completionTimeoutPerGiB"]), "the KubeVirt CR"
    else:
        per_gib = int(mig.defaults(cluster.kubevirt_version)["completionTimeoutPerGiB"])
        source = "KubeVirt's default"
    size = mig.data_size(dict(vmi)) if vmi else None
    conditions = tuple((str(c.get("type") or ""), str(c.get("status") or ""), str(c.get("reason") or ""))
                       for c in o.objects(vmim, "status", "conditions"))
    return MigrationFacts(str(meta.get("name") or ""), uid, kv.phase(vmim),
                          kv.annotations_of(vmim).get(EVACUATION_ANNOTATION, ""),
                          kv.parse_time(meta.get("creationTimestamp")), str(state.get("sourceNode") or ""),
                          str(state.get("targetNode") or ""), kv.parse_time(state.get("startTimestamp")),
                          kv.parse_time(state.get("endTimestamp")), str(state.get("failureReason") or ""), conditions,
                          per_gib, size.gigabytes if size else None, source)


def vm_facts(vmi: Mapping, vm: Mapping | None, migration: MigrationFacts | None, pod_alive: bool | None,
             volumes: tuple[VolumeFacts, ...] = ()) -> VMFacts:
    meta, spec = kv.meta(vmi), o.mapping(vmi, "spec")
    cond = next((c for c in kv.conditions_of(vmi) if c.get("type") == "LiveMigratable"), None)
    migratable = (str(cond.get("status") or ""), str(cond.get("reason") or ""), str(cond.get("message") or "")) \
        if cond else None
    devices = o.mapping(spec, "domain", "devices")
    cdrom = any("cdrom" in d for d in o.objects(devices, "disks")) or \
        any("containerDisk" in v for v in o.objects(spec, "volumes"))
    return VMFacts(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                   kv.phase(vmi), o.string(vmi, "status", "nodeName"), bool(meta.get("deletionTimestamp")),
                   vm is not None, kv.run_strategy(vm) if vm is not None else None,
                   o.text(spec, "evictionStrategy"), migratable, o.string(vmi, "status", "evacuationNodeName"),
                   kv.labels_of(vmi).get(MAINTAIN_STRATEGY, ""),
                   bool(o.array(devices, "hostDevices") or o.array(devices, "gpus")), cdrom,
                   bool(o.mapping(spec, "nodeSelector")), pod_alive, migration, volumes)

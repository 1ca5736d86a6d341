"""evacuation-report's decision table, row by row: pure, on a fixed clock (no cluster, no HTTP). Each row is a node
and the VMs on it as KubeVirt and Harvester leave them (docs/facts.md §10), and the outcome said for each VM."""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from functions.evacuation_report.decide import Action, Category, Outcome, decide
from functions.evacuation_report.facts import (
    ClusterFacts,
    Facts,
    MigrationFacts,
    NodeFacts,
    ResetPolicy,
    UpgradeFacts,
    VMFacts,
    VolumeFacts,
    migration_facts,
    node_facts,
    reset_policy,
    upgrade_facts,
    vm_facts,
)
from functions.evacuation_report.settings import Settings, load
from shared.settings import SettingsError

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
S = Settings()
MIGRATABLE = ("True", "", "")
DISKS = ("False", "DisksNotLiveMigratable", "cannot migrate VMI: PVC data is not shared, live migration requires that "
         "all PVCs must be shared (using ReadWriteMany access mode)")
HARVESTER_16 = ClusterFacts(harvester_version=(1, 6, 1), reset_policy=ResetPolicy(True, 300, None, "default"))
HARVESTER_17 = ClusterFacts(harvester_version=(1, 7, 0), reset_policy=ResetPolicy(True, 15, 180, "default"))


def node(**kw) -> NodeFacts:
    return NodeFacts("node-a", "uid-a", **kw)


def vm(name="vm1", **kw) -> VMFacts:
    base = {"node": "node-a", "run_strategy": "RerunOnFailure", "eviction_strategy": "LiveMigrateIfPossible",
            "migratable": MIGRATABLE}
    return VMFacts("default", name, f"uid-{name}", **{**base, **kw})


def one(facts: Facts, now=NOW, settings=S):
    verdict = decide(facts, settings, now)
    assert verdict.action is Action.REPORT, verdict.reason
    [line] = verdict.lines
    return verdict, line


def test_a_node_in_service_has_nothing_to_say():
    verdict = decide(Facts(node(), (vm(),)), S, NOW)
    assert verdict.action is Action.SETTLED and "back in service" in verdict.reason


def test_a_cordon_of_an_empty_node_is_no_finding():
    verdict = decide(Facts(node(unschedulable=True)), S, NOW)
    assert verdict.action is Action.SETTLED and "drained clean: no VM" in verdict.reason


def test_a_migratable_vm_on_a_drained_node_will_migrate():
    verdict, line = one(Facts(node(unschedulable=True), (vm(),)))
    assert verdict.category is Category.DRAIN and verdict.drainer == "cordoned"
    assert line.outcome is Outcome.MIGRATE and "LiveMigratable=True" in line.why
    assert not verdict.trouble and verdict.next_step.startswith("Nothing")


def test_kubectl_drain_shuts_down_a_vm_that_cannot_migrate_if_possible():
    _, line = one(Facts(node(unschedulable=True), (vm(migratable=DISKS),)))
    assert line.outcome is Outcome.SHUT_DOWN
    assert "DisksNotLiveMigratable" in line.why and "KubeVirt starts it again elsewhere" in line.why


def test_a_vm_that_must_migrate_but_cannot_blocks_the_drain():
    verdict, line = one(Facts(node(unschedulable=True), (vm(eviction_strategy="LiveMigrate", migratable=DISKS),)))
    assert line.outcome is Outcome.BLOCKS and "refuses its eviction" in line.why
    assert verdict.next_step.startswith("default/vm1: Stop it")


def test_the_drain_taint_alone_moves_nothing_that_does_not_migrate():
    facts = Facts(node(taints=(("kubevirt.io/drain", "draining", "NoSchedule"),)), (vm(eviction_strategy=None),))
    verdict, line = one(facts)
    assert verdict.drainer == "taint kubevirt.io/drain:NoSchedule"
    assert line.outcome is Outcome.BLOCKS and "KubeVirt's default" in line.why and "None" in line.why


def test_the_cluster_default_eviction_strategy_applies():
    facts = Facts(node(unschedulable=True), (vm(eviction_strategy=None),),
                  ClusterFacts(eviction_default="LiveMigrate"))
    _, line = one(facts)
    assert line.outcome is Outcome.MIGRATE and "the cluster's" in line.why


def test_harvester_maintenance_stops_a_vm_labelled_to_shut_down():
    facts = Facts(node(unschedulable=True, annotations={"harvesterhci.io/drain-requested": "true"}),
                  (vm(maintain_strategy="ShutdownAndRestartAfterDisable"),))
    verdict, line = one(facts)
    assert verdict.drainer == "Harvester maintenance mode: requested"
    assert line.outcome is Outcome.SHUT_DOWN and "when maintenance mode is disabled" in line.why


def test_forced_maintenance_stops_a_vm_with_a_cdrom():
    facts = Facts(node(unschedulable=True, annotations={"harvesterhci.io/maintain-status": "running",
                                                        "harvesterhci.io/drain-forced": "true"}),
                  (vm(cdrom_or_container_disk=True),))
    verdict, line = one(facts)
    assert "(forced)" in verdict.drainer and line.outcome is Outcome.SHUT_DOWN and "CD-ROM" in line.why


def test_an_upgrade_stops_what_its_detector_finds_not_migratable():
    cluster = replace(HARVESTER_17, upgrade=UpgradeFacts("hvst-upgrade-x", "Pre-draining"))
    facts = Facts(node(taints=(("kubevirt.io/drain", "draining", "NoSchedule"),)), (vm(node_selector=True),), cluster)
    verdict, line = one(facts)
    assert verdict.drainer == "Harvester upgrade hvst-upgrade-x: Pre-draining"
    assert line.outcome is Outcome.SHUT_DOWN and "nodeSelector" in line.why


def test_a_failed_evacuation_during_an_upgrade_from_1_7_shuts_the_vm_down():
    failed = MigrationFacts("kubevirt-evacuation-abc", "m1", "Failed", "node-a", failure_reason=(
        "Live migration is not completed after 450 seconds and has been aborted"), per_gib=150, gigabytes=3,
        started=NOW - timedelta(minutes=10), ended=NOW - timedelta(minutes=2, seconds=30))
    cluster = replace(HARVESTER_17, upgrade=UpgradeFacts("hvst-upgrade-x", "Pre-draining"))
    _, line = one(Facts(node(taints=(("kubevirt.io/drain", "draining", "NoSchedule"),)), (vm(migration=failed),),
                        cluster))
    assert line.outcome is Outcome.MIGRATION_FAILED
    assert "after 450 s" in line.why and "450 s (150 s/GiB × 3 GB)" in line.why and "upgrade stops" in line.why
    older = replace(cluster, harvester_version=(1, 6, 1))
    tainted = node(taints=(("kubevirt.io/drain", "draining", "NoSchedule"),))
    _, line = one(Facts(tainted, (vm(migration=failed),), older))
    assert "KubeVirt creates another evacuation migration" in line.why


def test_a_running_evacuation_shows_its_budget():
    running = MigrationFacts("kubevirt-evacuation-abc", "m1", "Running", "node-a", target_node="node-b",
                             started=NOW - timedelta(seconds=400), per_gib=150, gigabytes=3, budget_source="KubeVirt")
    _, line = one(Facts(node(unschedulable=True), (vm(migration=running),)))
    assert line.outcome is Outcome.MIGRATING and line.budget_used == pytest.approx(0.889, abs=1e-3)
    assert "400 s of a 450 s completion budget" in line.why and "aborts it at the budget" in line.why
    assert line.when == NOW + timedelta(seconds=50)


def test_drained_clean_when_every_vm_left():
    done = MigrationFacts("kubevirt-evacuation-abc", "m1", "Succeeded", "node-a")
    verdict = decide(Facts(node(unschedulable=True), (vm(node="node-b", migration=done),
                                                      vm("vm2", node="", phase="Succeeded"))), S, NOW)
    assert verdict.action is Action.SETTLED and "drained clean" in verdict.reason
    assert [line.outcome for line in verdict.lines] == [Outcome.MIGRATED, Outcome.LEFT]


def test_a_node_down_for_less_than_the_setting_waits():
    verdict = decide(Facts(node(ready="Unknown", ready_since=NOW - timedelta(seconds=30)), (vm(),)), S, NOW)
    assert verdict.action is Action.WAIT


def test_harvester_1_6_resets_a_dead_nodes_vms_after_its_period():
    facts = Facts(node(ready="False", ready_reason="KubeletNotReady", ready_since=NOW - timedelta(minutes=2)),
                  (vm(),), HARVESTER_16)
    verdict, line = one(facts)
    assert verdict.category is Category.DOWN and line.outcome is Outcome.RESTARTS
    assert line.when == NOW + timedelta(minutes=3) and "300 s" in line.why


def test_harvester_1_7_does_nothing_for_a_kubelet_that_reports_not_ready():
    facts = Facts(node(ready="False", ready_since=NOW - timedelta(minutes=2)), (vm(),), HARVESTER_17)
    _, line = one(facts)
    assert line.outcome is Outcome.STUCK and "Ready=Unknown" in line.why


def test_harvester_1_7_taints_an_unreachable_node_out_of_service():
    since = NOW - timedelta(minutes=2)
    facts = Facts(node(ready="Unknown", ready_since=since), (vm(volumes=(VolumeFacts(
        "data", "pvc-1", ("node-a",)),)),), HARVESTER_17)
    _, line = one(facts)
    assert line.outcome is Outcome.RESTARTS and "out-of-service taint at 2026-12-01T12:01:15Z" in line.why
    assert line.when == since + timedelta(minutes=5)  # the heartbeat timeout comes after the 195 s
    assert "still attached" in line.blockers[0]


def test_a_manual_vm_stays_off_and_kubevirt_alone_moves_nothing():
    facts = Facts(node(ready="Unknown", ready_since=NOW - timedelta(minutes=2)), (vm(run_strategy="Manual"),),
                  HARVESTER_16)
    _, line = one(facts)
    assert line.outcome is Outcome.STAYS_OFF and "virtctl start" in line.next_step
    _, line = one(replace(facts, cluster=ClusterFacts()))
    assert line.outcome is Outcome.STUCK and "out-of-service" in line.next_step


def test_a_dead_node_whose_vms_run_elsewhere_is_settled():
    facts = Facts(node(ready="Unknown", ready_since=NOW - timedelta(minutes=9)), (vm(node="node-b"),), HARVESTER_16)
    verdict = decide(facts, S, NOW)
    assert verdict.action is Action.SETTLED and verdict.lines[0].outcome is Outcome.RECOVERED


def test_opted_out_and_out_of_scope():
    assert decide(Facts(node(unschedulable=True, opted_out=True), (vm(),)), S, NOW).action is Action.SKIP
    scoped = replace(S, namespaces=frozenset({"vms"}))
    assert decide(Facts(node(unschedulable=True), (vm(),)), scoped, NOW).action is Action.SETTLED


# -- reading the objects -------------------------------------------------------------------------
def test_reset_policy_per_version_and_from_the_setting():
    assert reset_policy(None, (1, 6, 1)) == ResetPolicy(True, 300, None, "Harvester v1.6.1's default")
    assert reset_policy(None, (1, 7, 0)).period == 15 and reset_policy(None, (1, 7, 0)).vm_migration_timeout == 180
    setting = {"value": "", "default": '{"enable":true,"period":15,"vmMigrationTimeout":180}'}
    assert reset_policy(setting, None).source == "the setting's default"
    setting["value"] = '{"enable":false,"period":60}'
    assert reset_policy(setting, None) == ResetPolicy(False, 60, None, "the setting's value")


def test_node_facts_read_harvester_annotations_and_taints():
    obj = {"metadata": {"name": "n", "uid": "u", "annotations": {"harvesterhci.io/drain-forced": "true",
                                                                   "other": "x"}},
           "spec": {"unschedulable": True, "taints": [{"key": "kubevirt.io/drain", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                      "lastTransitionTime": "2026-12-01T11:58:00Z"}]}}
    facts = node_facts(obj, "vmevents.io/evacuation-report")
    assert facts.ready == "Unknown" and facts.forced and not facts.maintenance and facts.unschedulable
    assert facts.annotations == {"harvesterhci.io/drain-forced": "true"} and facts.has_taint("kubevirt.io/drain")


def test_upgrade_facts_skip_a_finished_upgrade():
    done = {"metadata": {"name": "old", "labels": {"harvesterhci.io/upgradeState": "Succeeded"}}}
    now = {"metadata": {"name": "new", "labels": {"harvesterhci.io/upgradeState": "UpgradingNodes"}},
           "status": {"nodeStatuses": {"node-a": {"state": "Pre-draining"}}}}
    assert upgrade_facts([done, now], "node-a") == UpgradeFacts("new", "Pre-draining", "")
    assert upgrade_facts([done], "node-a") is None


def test_migration_and_vm_facts_from_kubevirt_objects():
    vmi = {"metadata": {"name": "vm1", "namespace": "default", "uid": "v",
                        "labels": {"harvesterhci.io/maintain-mode-strategy": "Shutdown"}},
           "spec": {"evictionStrategy": "LiveMigrate", "domain": {"resources": {"requests": {"memory": "2Gi"}},
                                                                   "devices": {"disks": [{"cdrom": {}}]}}},
           "status": {"nodeName": "node-a", "phase": "Running", "conditions": [{"type": "LiveMigratable",
                                                                               "status": "False", "reason": "X"}],
                      "migrationState": {"migrationUid": "m1", "startTimestamp": "2026-12-01T11:50:00Z",
                                         "targetNode": "node-b",
                                         "migrationConfiguration": {"completionTimeoutPerGiB": 800}}}}
    vmim = {"metadata": {"name": "kubevirt-evacuation-x", "uid": "m1",
                         "annotations": {"kubevirt.io/evacuationMigration": "node-a"}},
            "status": {"phase": "Running"}}
    m = migration_facts(vmim, vmi, ClusterFacts(kubevirt_version=(1, 4, 0)))
    assert (m.evacuation_of, m.target_node, m.budget, m.budget_source) == (
        "node-a", "node-b", 2400, "migrationState.migrationConfiguration")  # 2Gi → 3 GB × 800
    facts = vm_facts(vmi, {"spec": {"runStrategy": "Always"}}, m, True)
    assert facts.eviction_strategy == "LiveMigrate" and facts.migratable == ("False", "X", "")
    assert facts.cdrom_or_container_disk and facts.maintain_strategy == "Shutdown" and facts.run_strategy == "Always"


def test_settings():
    assert load({}) == Settings()
    with pytest.raises(SettingsError, match="EVACUATION_DOWN_AFTER"):
        load({"EVACUATION_DOWN_AFTER": "2h"})
    with pytest.raises(SettingsError, match="HARVESTER_NAMESPACE"):
        load({"HARVESTER_NAMESPACE": "Bad_Name"})

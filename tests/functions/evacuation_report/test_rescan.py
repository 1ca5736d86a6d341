"""evacuation-report's handler on the simulated API server, without a broker: a tick finds the node being emptied,
opens one finding for it with a line per VM, updates it (no second notice) as the VMs move, and resolves it once
the node is drained clean or back in service; a dead node's finding names what Harvester will do and when, and ends
when its VMs run elsewhere. The objects are written as KubeVirt and Harvester leave them (docs/facts.md §10)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.evacuation_report.handler import FUNCTION, converge, rescan
from functions.evacuation_report.settings import Settings
from shared import rescan as rescans
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.apiserver import SimCluster
from simcluster.builders import evacuation as b


@pytest.fixture
def cluster():
    c = SimCluster(kubevirt_version="1.3.1").start()
    yield c
    c.stop()


def context(cluster, *, later: timedelta = timedelta(0)) -> KubeContext:
    kube = Kube(cluster.api_client())
    settings = Settings(rescan=rescans.Settings(budget=timedelta(seconds=20), workers=4))
    return KubeContext(FUNCTION, settings, lambda: datetime.now(UTC) + later, kube, Recorder(kube, FUNCTION))


def notices(outcome, state="detected") -> list[dict]:
    data = outcome.reply.data if outcome.reply is not None else {}
    return [f for f in data.get("findings", [data] if data else []) if f.get("state") == state]


def lines(finding: dict) -> dict[str, str]:
    return {v["vm"]: v["outcome"] for v in finding["details"]["vms"]}


def put(cluster, *objs):
    for obj in objs:
        cluster.create(obj)


def test_a_drain_is_one_finding_updated_as_vms_move_and_resolved_when_empty(cluster):
    put(cluster, b.node("node-a", cordoned=True, annotations=b.maintenance()), b.node("node-b"))
    moves, stays = b.vm("moves"), b.vm("stays", eviction="LiveMigrate")
    put(cluster, moves, stays, b.vmi(moves, "node-a"),
        b.vmi(stays, "node-a", migratable=("False", "DisksNotLiveMigratable", b.NOT_SHARED.format("data"))))
    ctx = context(cluster)
    [opened] = notices(rescan(ctx, "tick-1"))
    assert opened["category"] == "node-drain" and opened["identity"]["node"] == "node-a"
    assert lines(opened) == {"default/moves": "will-migrate", "default/stays": "blocks-drain"}
    assert "DisksNotLiveMigratable" in opened["summary"] and opened["advice"][0].startswith("default/stays: Stop it")
    [event] = [e for e in cluster.list("v1", "Event", "default") if e["reason"] == "NodeEvacuation"]
    assert event["involvedObject"]["kind"] == "Node" and event["type"] == "Warning"

    assert notices(rescan(ctx, "tick-2")) == []  # seen again: nothing announced
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "moves",
                  {"metadata": {"labels": {"kubevirt.io/nodeName": "node-b"}}, "status": {"nodeName": "node-b"}})
    assert notices(rescan(ctx, "tick-3")) == []  # it moved: the finding is updated, no second notice
    [event] = [e for e in cluster.list("v1", "Event", "default") if e["reason"] == "NodeEvacuation"]
    assert "1 left" in event["message"] and "1 blocks-drain" in event["message"]

    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "stays")
    [resolved] = notices(rescan(ctx, "tick-4"), "resolved")
    assert "drained clean" in resolved["details"]["because"] and resolved["severity"] == "warning"
    assert notices(rescan(ctx, "tick-5"), "resolved") == [] and notices(rescan(ctx, "tick-5")) == []


def test_an_uncordoned_node_is_back_in_service_without_reading_its_vms(cluster):
    put(cluster, b.node("node-a", cordoned=True))
    shut = b.vm("shut", eviction=None)
    put(cluster, shut, b.vmi(shut, "node-a"))
    ctx = context(cluster)
    [opened] = notices(rescan(ctx, "t1"))
    assert lines(opened) == {"default/shut": "will-shut-down"}
    cluster.patch("v1", "Node", None, "node-a", {"spec": {"unschedulable": None}})
    [resolved] = notices(converge("node-a", ctx, "node-event"), "resolved")
    assert "back in service" in resolved["details"]["because"]


def test_a_dead_node_says_when_harvester_resets_its_vms(cluster):
    since = datetime.now(UTC) - timedelta(minutes=2)
    put(cluster, b.node("node-a", ready="Unknown", since=since), b.node("node-b"),
        b.setting("server-version", value="v1.6.1"), b.reset_policy(300))
    always, manual = b.vm("always", run_strategy="Always"), b.vm("manual", run_strategy="Manual")
    put(cluster, always, manual, b.vmi(always, "node-a"), b.vmi(manual, "node-a"))
    ctx = context(cluster)
    [opened] = notices(rescan(ctx, "t1"))
    assert opened["category"] == "node-down" and opened["severity"] == "critical"
    assert lines(opened) == {"default/always": "restarts-elsewhere", "default/manual": "stays-off"}
    due = {v["vm"]: v["when"] for v in opened["details"]["vms"]}
    assert due["default/always"] == b.stamp(since + timedelta(seconds=300))
    # KubeVirt failed the VMIs and started "always" on node-b; "manual" stays off
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "always",
                  {"metadata": {"labels": {"kubevirt.io/nodeName": "node-b"}}, "status": {"nodeName": "node-b"}})
    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "manual")
    [resolved] = notices(rescan(ctx, "t2"), "resolved")
    assert "no VM is left" in resolved["details"]["because"]

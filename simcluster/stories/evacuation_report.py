"""evacuation-report's story: a node put in Harvester's maintenance mode with four VMs on it — one that live-migrates,
one whose migration fails on its completion budget, one whose disk is not shared (LiveMigrateIfPossible: shut down
when evicted), one that must migrate and cannot (LiveMigrate: it blocks the drain) — and a node that dies under
Harvester 1.6's vm-force-reset-policy. evacuation-report says, before it happens, what will happen to each VM and
why, updates the node's one finding as they move, and ends it when the node is drained clean or its VMs run
elsewhere. What no backend runs is played by simcluster/evacuation.py (virt-handler's LiveMigratable, virt-api's
eviction webhook, Harvester's controllers; on the simulator KubeVirt's evacuation controller and migrations too)."""
from __future__ import annotations

import json

from simcluster.builders import evacuation as b
from simcluster.evacuation import EvacuationSim
from simcluster.play import PING_INTERVAL, Stage, stage, wait_until

COMPONENT = "evacuation-report"
NODES = ("harvester-a", "harvester-b", "harvester-c")
TIMEOUT = "Live migration is not completed after 450 seconds and has been aborted"


def play() -> None:
    with stage("evacuation-report, KubeVirt 1.3.1 (Harvester 1.4–1.6)", nodes={n: {} for n in NODES},
               env_overrides={COMPONENT: {"EVACUATION_DOWN_AFTER": "1s"}}) as s:
        sim = EvacuationSim(s.cluster, harvester="1.6.1", time_scale=0.05, period=0.1).start()
        try:
            _play(s, sim)
        finally:
            sim.stop()


def _play(s: Stage, sim: EvacuationSim) -> None:
    if not s.kubevirt.node_only:  # the node stand-in registers its nodes; the simulated KubeVirt places on these
        for name in NODES:
            s.cluster.create(b.node(name))
            s.cluster.patch("v1", "Node", None, name, {"spec": {"taints": None}})
    s.cluster.create(b.setting("server-version", value="v1.6.1"))
    s.cluster.create(b.reset_policy(300))
    s.timeline.line("setup", f"3 nodes; Harvester 1.6 (vm-force-reset-policy 300 s, played 20× faster); "
                             f"PingSource every {PING_INTERVAL:g}s")
    for claim, mode in (("web-disk", "ReadWriteMany"), ("db-disk", "ReadWriteMany"), ("cache-disk", "ReadWriteOnce"),
                        ("legacy-disk", "ReadWriteOnce"), ("batch-disk", "ReadWriteMany")):
        s.cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                          "metadata": {"name": claim, "namespace": "default"},
                          "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}})
    cast = [("batch", "harvester-c", {}, "a shared disk, on the node that will die"),
            ("web", "harvester-a", {}, "a shared disk: live-migrates"),
            ("db", "harvester-a", {}, "a shared disk, but its migration runs out of budget"),
            ("cache", "harvester-a", {}, "a ReadWriteOnce disk, LiveMigrateIfPossible: shut down when evicted"),
            ("legacy", "harvester-a", {"eviction": "LiveMigrate"}, "a ReadWriteOnce disk, LiveMigrate: cannot leave")]
    for name, node, kw, why in cast:
        _start(s, name, node, **kw)
        s.timeline.line("create", f"VM default/{name} on {node}: {why}")
    if s.kubevirt.node_only:
        from simcluster.kubevirt.migration import COMPLETION_TIMEOUT
        s.kubevirt.plan_migration("default", "db", COMPLETION_TIMEOUT)
    else:
        sim.plan("default", "db", fail=TIMEOUT)
    sim.maintenance("harvester-a")
    s.timeline.line("maintenance", "Enable Maintenance Mode on harvester-a (Harvester cordons it and drains it)")
    wait_until(lambda: _notices(s), 60)
    _show(s, "harvester-a", "the finding, as opened")
    wait_until(lambda: _outcome(s, "harvester-a").get("default/web") == "migrated"
               and _outcome(s, "harvester-a").get("default/db") == "migration-failed", 90)
    _show(s, "harvester-a", "the same finding, updated as the VMs moved (no second notice)")
    sim.set_ready("harvester-c", "Unknown")
    s.timeline.line("node", "harvester-c stops answering (Ready=Unknown)")
    wait_until(lambda: [n for n in _notices(s) if n["category"] == "node-down"], 60)
    _show(s, "harvester-c", "the dead node's finding")
    wait_until(lambda: [n for n in _notices(s, "resolved") if n["category"] == "node-down"], 120)
    s.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "legacy", {"spec": {"runStrategy": "Halted"}})
    s.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "db", {"spec": {"runStrategy": "Halted"}})
    s.timeline.line("stop", "the owners stop default/legacy and default/db for the maintenance")
    wait_until(lambda: [n for n in _notices(s, "resolved") if n["category"] == "node-drain"], 90)
    s.knative.wait_idle(10)
    print(f"\n  {len(_notices(s))} notice(s), one per node and episode; ended:")
    for notice in _notices(s, "resolved"):
        print(f"  resolved: node {notice['details']['node']} ({notice['category']}): {notice['details']['because']}")
    print(f"  ({s.timeline.irrelevant} irrelevant events answered without an API call; "
          f"{s.timeline.repeats} repeated decisions not shown)")


def _start(s: Stage, name: str, node: str, **kw) -> None:
    vm = b.vm(name, claims=(f"{name}-disk",), run_strategy="RerunOnFailure", **kw)
    vm["metadata"] = {"name": name, "namespace": "default"}
    vm.pop("status")
    others = [n for n in NODES if n != node]
    for other in others:
        s.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": True}})
    try:
        s.cluster.create(vm)
        wait_until(lambda: _where(s, name) == node, 30)
    finally:
        for other in others:
            s.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": None}})


def _where(s: Stage, name: str) -> str | None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name) or {}
    judged = any(c.get("type") == "LiveMigratable" for c in (vmi.get("status") or {}).get("conditions") or ())
    return (vmi.get("status") or {}).get("nodeName") if judged else None


def _notices(s: Stage, state: str = "detected") -> list[dict]:
    found = []
    for event in list(s.knative.broker.received):
        if event["source"] == f"/vmevents/{COMPONENT}":
            data = json.loads(event.data) if isinstance(event.data, (bytes, str)) else event.data
            found += [i for i in data.get("findings", [data]) if i.get("state") == state]
    return found


def _finding(s: Stage, node: str) -> dict:
    for event in s.kube_events(COMPONENT):
        notes = event["metadata"].get("annotations") or {}
        if event["involvedObject"]["name"] == node and "vmevents.io/finding" in notes:  # not its end's Event
            return json.loads(notes["vmevents.io/finding"])
    return {}


def _outcome(s: Stage, node: str) -> dict[str, str]:
    return {v["vm"]: v["outcome"] for v in _finding(s, node).get("details", {}).get("vms", ())}


def _show(s: Stage, node: str, title: str) -> None:
    d = _finding(s, node).get("details", {})
    print(f"\n  {title}: node {node} — {d.get('cause')}")
    for v in d.get("vms", ()):
        print(f"      {v['vm']}: {v['outcome']} — {v['why'][:200]}")
        for blocker in v.get("blockers") or ():
            print(f"          blocked by: {blocker[:160]}")
    print(f"      next step: {str(d.get('nextStep'))[:240]}\n")

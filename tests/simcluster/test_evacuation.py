"""The simulator's part in an evacuation (simcluster/evacuation.py), held to what KubeVirt and Harvester do
(docs/facts.md §10): virt-handler's LiveMigratable, virt-api's eviction webhook, KubeVirt's evacuation controller
(sim only), Harvester's maintenance mode and node-down controller per version. The story runs on the simulator with
the simulated KubeVirt; the real backend's rows are the e2e suite's (tests/functions/evacuation_report)."""
from __future__ import annotations

import pytest

from simcluster.apiserver import SimCluster
from simcluster.builders import evacuation as b
from simcluster.evacuation import EvacuationSim, admit_eviction, live_migratable
from simcluster.kubevirt.sim import KubeVirtSim
from tests.e2e import eventually

RUNNING = [{"type": "LiveMigratable", "status": "True"}]
NOT_MIGRATABLE = [{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable"}]


def vmi(strategy=None, conditions=(), node="node-a", marked=None):
    spec = {"evictionStrategy": strategy} if strategy else {}
    status = {"nodeName": node, "conditions": list(conditions), **({"evacuationNodeName": marked} if marked else {})}
    return {"spec": spec, "status": status}


@pytest.mark.parametrize("strategy,conditions,marked,verdict", [
    ("LiveMigrate", NOT_MIGRATABLE, None, "deny"),
    ("LiveMigrate", RUNNING, None, "mark"),
    ("LiveMigrate", RUNNING, "node-a", "protected"),  # marked already: the PDB protects it meanwhile
    ("LiveMigrateIfPossible", RUNNING, None, "mark"),
    ("LiveMigrateIfPossible", NOT_MIGRATABLE, None, "pass"),
    ("External", NOT_MIGRATABLE, None, "mark"),
    (None, RUNNING, None, "pass"),                  # KubeVirt's default is None
])
def test_the_eviction_webhook(strategy, conditions, marked, verdict):
    assert admit_eviction(vmi(strategy, conditions, marked=marked), None, "node-a") == verdict


def test_the_cluster_eviction_strategy_is_the_default():
    cluster = {"spec": {"configuration": {"evictionStrategy": "LiveMigrate"}}}
    assert admit_eviction(vmi(None, NOT_MIGRATABLE), cluster, "node-a") == "deny"


def test_live_migratable_as_virt_handler_judges_it():
    shared = {"spec": {"accessModes": ["ReadWriteMany"]}}
    own = {"spec": {"accessModes": ["ReadWriteOnce"]}}
    disk = {"spec": {"volumes": [{"persistentVolumeClaim": {"claimName": "data"}}]}}
    assert live_migratable(disk, {"data": shared}) == ("True", "", "")
    status, reason, message = live_migratable(disk, {"data": own})
    assert (status, reason) == ("False", "DisksNotLiveMigratable") and "PVC data is not shared" in message
    devices = {"spec": {"domain": {"devices": {"hostDevices": [{"name": "gpu"}]}}}}
    assert live_migratable(devices, {})[:2] == ("False", "HostDeviceNotLiveMigratable")


@pytest.fixture
def world():
    cluster = SimCluster(kubevirt_version="1.3.1").start()
    for name in ("node-a", "node-b"):
        cluster.create(b.node(name))
        cluster.patch("v1", "Node", None, name, {"spec": {"taints": None}})  # the lifecycle controller's part
    kubevirt = KubeVirtSim(cluster, step_delay=0.01).start()
    sim = EvacuationSim(cluster, harvester="1.7.0", time_scale=0.01, period=0.05).start()
    yield cluster, kubevirt, sim
    sim.stop()
    kubevirt.stop()
    cluster.stop()


def pvc(name, mode):
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}}


def start(cluster, vm):
    vm = dict(vm, status={})
    vm["metadata"] = {k: v for k, v in vm["metadata"].items() if k != "uid"}
    cluster.create(vm)


def judged(cluster, name):
    """virt-handler has written LiveMigratable (it does so as the VMI runs)."""
    obj = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name) or {}
    return any(c.get("type") == "LiveMigratable" for c in (obj.get("status") or {}).get("conditions") or ())


def where(cluster, name):
    obj = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name) or {}
    return (obj.get("status") or {}).get("phase"), (obj.get("status") or {}).get("nodeName")


def test_kubectl_drain_migrates_what_can_refuses_what_must_and_evicts_the_rest(world):
    cluster, kubevirt, sim = world
    cluster.create(pvc("shared", "ReadWriteMany"))
    cluster.create(pvc("own", "ReadWriteOnce"))
    cluster.patch("v1", "Node", None, "node-b", {"spec": {"unschedulable": True}})  # start everything on node-a
    start(cluster, b.vm("moves", claims=("shared",), run_strategy="Always"))
    start(cluster, b.vm("refused", claims=("own",), eviction="LiveMigrate", run_strategy="Always"))
    start(cluster, b.vm("evicted", claims=("own",), eviction=None, run_strategy="Always"))
    for name in ("moves", "refused", "evicted"):
        eventually(lambda n=name: where(cluster, n) == ("Running", "node-a") and judged(cluster, n),
                   what=f"{name} Running on node-a")
    cluster.patch("v1", "Node", None, "node-b", {"spec": {"unschedulable": None}})
    sim.drain("node-a")
    eventually(lambda: where(cluster, "moves") == ("Running", "node-b"), timeout=20, what="moves migrated")
    [vmim] = eventually(lambda: [m for m in cluster.list("kubevirt.io/v1", "VirtualMachineInstanceMigration",
                                                         "default") if m["status"].get("phase") == "Succeeded"],
                        what=f"the evacuation migration Succeeded ({sim.errors[-3:]})")
    assert vmim["metadata"]["name"].startswith("kubevirt-evacuation-")
    assert vmim["metadata"]["annotations"] == {"kubevirt.io/evacuationMigration": "node-a"}
    eventually(lambda: where(cluster, "evicted") == ("Running", "node-b"), timeout=20,
               what="evicted: shut down, then started again on node-b (runStrategy Always)")
    assert where(cluster, "refused") == ("Running", "node-a") and sim.denied == ["default/refused"]


def test_harvester_1_7_taints_an_unreachable_node_in_two_steps_and_lifts_the_taints(world):
    cluster, _, sim = world
    sim.set_ready("node-a", "Unknown")
    def drained(node):
        return [c for c in node["status"]["conditions"] if c["type"] == "Drained" and c["status"] == "True"]

    node = eventually(lambda: (x := cluster.get("v1", "Node", None, "node-a")) and
                      {t["key"] for t in (x["spec"].get("taints") or [])} >=
                      {"kubevirt.io/drain", "node.kubernetes.io/out-of-service"} and drained(x) and x, timeout=20,
                      what="both taints and Drained=True")
    assert drained(node)[0]["reason"] == "HarvesterNodeIsDrained"
    sim.set_ready("node-a", "True")
    eventually(lambda: not [t for t in cluster.get("v1", "Node", None, "node-a")["spec"].get("taints") or ()
                            if t["key"] in ("kubevirt.io/drain", "node.kubernetes.io/out-of-service")], timeout=20,
               what="taints lifted")

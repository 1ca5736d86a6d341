"""evacuation-report end to end, on both backends: the API server (simulated, or a real kube-apiserver), KubeVirt
(the simulated one; on the real backend KubeVirt's own virt-controller — its evacuation, migration, VM, VMI and node
controllers — with the node stand-in playing the scheduler, the kubelet and virt-handler), the parts no backend runs
played by simcluster/evacuation.py (virt-handler's LiveMigratable, virt-api's eviction webhook, Harvester's
controllers, Kubernetes' out-of-service taint; on the simulator also KubeVirt's evacuation controller and its
migrations' end), the broker routing by deploy/'s Triggers, the PingSource, and the function as a real
functions-framework server with the credentials of its own ServiceAccount.

On the real backend the evacuation is KubeVirt's own: `kubectl drain`'s eviction of a migratable VM's launcher pod
is answered as virt-api would (the VMI marked `evacuationNodeName`); virt-controller's evacuation controller then
creates the `kubevirt-evacuation-` VMIM, its migration controller runs it, and the node stand-in completes it. A
dead node is played as Harvester 1.6 resets it (its launcher pods force-deleted, the heartbeat rewound), and
virt-controller's node controller fails the VMI, its VM controller starts it again elsewhere.

For the real-node lane (branch realnode): the same two stories, with a real cordon and `kubectl drain`, and a
kubelet stopped for the dead node (/work/notes/evacuation.md says what to expect).
"""
from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime

import pytest

from simcluster.builders import evacuation as b
from simcluster.evacuation import EvacuationSim
from tests import e2e
from tests.e2e import backends_only, eventually
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION = "evacuation-report"
FUNCTION_SA = "vmevents/evacuation-report"
NODES = ("evac-a", "evac-b")
DOWN_AFTER = 1.0
_names = itertools.count(1)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    function_sa = FUNCTION_SA

    def __init__(self, version: str, backend: str):
        super().__init__(version, backend=backend,
                         kubevirt={"step_delay": 0.01, "nodes": {n: {} for n in NODES}},
                         env_overrides={FUNCTION: {"EVACUATION_DOWN_AFTER": f"{DOWN_AFTER:.0f}s"}})
        try:
            if not self.real:  # the node stand-in registers its nodes; the simulated KubeVirt places on Node objects
                for name in NODES:
                    if self.cluster.get("v1", "Node", None, name) is None:
                        self.cluster.create(b.node(name))
            self.heal()
            self.cluster.create(b.setting("server-version", value="v1.6.1"))  # Harvester 1.6: a reset after period
            self.cluster.create(b.reset_policy(300))
            # Harvester waits its period (300 s) × 0.05: 15 s, time for the report to come before the reset
            self.sim = EvacuationSim(self.cluster, harvester="1.6.1", time_scale=0.05, period=0.05).start()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        sim = getattr(self, "sim", None)
        if sim is not None:
            sim.stop()
        super().stop()

    @property
    def real(self) -> bool:
        return self.kubevirt.node_only

    def heal(self):
        """Every node Ready, schedulable, untainted, out of maintenance (the lifecycle controller's part too)."""
        for name in NODES:
            if getattr(self, "sim", None) is not None:
                self.sim.uncordon(name)
            stamp = b.stamp(datetime.now(UTC))
            self.cluster.patch("v1", "Node", None, name, {"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp,
                 "lastTransitionTime": stamp}]}}, subresource="status")
            self.cluster.patch("v1", "Node", None, name, {"spec": {"unschedulable": None, "taints": None},
                                                          "metadata": {"annotations": {
                                                              "kubevirt.io/heartbeat": None,
                                                              "harvesterhci.io/maintain-status": None}}})

    # -- set-up ------------------------------------------------------------------------------------
    def start_vm(self, prefix, *, node, claims=(), eviction="LiveMigrateIfPossible", run_strategy="Always"):
        """A VM running on `node` (the other node cordoned meanwhile), judged by virt-handler."""
        name = f"{prefix}{next(_names)}"
        for claim in claims:
            if self.cluster.get("v1", "PersistentVolumeClaim", "default", claim) is None:
                mode = "ReadWriteMany" if claim.startswith("shared") else "ReadWriteOnce"
                self.cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                     "metadata": {"name": claim, "namespace": "default"},
                                     "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}})
        vm = b.vm(name, claims=claims, eviction=eviction, run_strategy=run_strategy)
        vm["metadata"] = {"name": name, "namespace": "default"}
        vm.pop("status")
        others = [n for n in NODES if n != node]
        for other in others:
            self.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": True}})
        try:
            self.cluster.create(vm)
            eventually(lambda: self.where(name) == ("Running", node) and self.judged(name), timeout=120,
                       what=f"VM {name} Running on {node}")
        finally:
            for other in others:
                self.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": None}})
        return name

    def where(self, name):
        status = (self.vmi(name) or {}).get("status") or {}
        return status.get("phase"), status.get("nodeName")

    def judged(self, name):
        return any(c.get("type") == "LiveMigratable" for c in ((self.vmi(name) or {}).get("status") or {}).get(
            "conditions") or ())

    # -- looking -----------------------------------------------------------------------------------
    def notices(self, node, state="detected"):
        found = []
        for event in list(self.knative.broker.received):
            if event["source"] != f"/vmevents/{FUNCTION}":
                continue
            data = e2e.data_of(event)
            for item in data.get("findings", [data]):
                if item.get("identity", {}).get("node") == node and item.get("state") == state:
                    found.append(item)
        return found

    def record(self, node):
        return [e for e in self.cluster.list("v1", "Event", "default")
                if (e.get("source") or {}).get("component") == FUNCTION and e["involvedObject"]["name"] == node]

    def lines(self, node):
        """vm → outcome of the node's finding as last written (its Event's annotation)."""
        [event] = [e for e in self.record(node) if "vmevents.io/finding" in (e["metadata"].get("annotations") or {})]
        finding = json.loads(event["metadata"]["annotations"]["vmevents.io/finding"])
        return {v["vm"].partition("/")[2]: v["outcome"] for v in finding["details"]["vms"]}

    def until(self, predicate, what, ticks=40):
        for _ in range(ticks):
            self.tick()
            if predicate():
                return
        logs = self.knative.functions[FUNCTION].logs()[-4:] if hasattr(self.knative, "functions") else []
        raise AssertionError(f"no tick showed {what}; the function's last lines: {logs}")


@pytest.fixture(scope="module", **backends_only())
def world(request):
    with World(*request.param) as w:
        yield w


@pytest.fixture
def fresh(world):
    yield world
    world.heal()


@pytest.mark.timeout(900)  # three VMs started and moved by KubeVirt's own controllers on a loaded machine
def test_a_drained_node_names_what_migrates_what_blocks_and_what_is_shut_down(fresh):
    world = fresh
    moves = world.start_vm("moves", node="evac-a", claims=("shared-moves",))
    stays = world.start_vm("stays", node="evac-a", claims=("own-stays",), eviction="LiveMigrate")
    shut = world.start_vm("shut", node="evac-a", claims=("own-shut",), eviction=None, run_strategy="RerunOnFailure")
    world.sim.drain("evac-a")  # kubectl drain: cordon, then evictions judged as virt-api does
    world.until(lambda: world.notices("evac-a"), "a .detected notice of evac-a")
    [opened] = world.notices("evac-a")
    assert opened["category"] == "node-drain" and opened["severity"] == "warning"
    outcome = {v["vm"].partition("/")[2]: v for v in opened["details"]["vms"]}
    assert outcome[stays]["outcome"] == "blocks-drain" and "DisksNotLiveMigratable" in outcome[stays]["why"]
    assert outcome[moves]["outcome"] in ("will-migrate", "migrating", "migrated")
    assert outcome[shut]["outcome"] in ("will-shut-down", "left")
    # the migratable one leaves by its evacuation migration; the evicted one is shut down (and started elsewhere)
    try:
        eventually(lambda: world.where(moves) == ("Running", "evac-b"), timeout=120, what=f"{moves} migrated to evac-b")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {world.kubevirt_state(moves)}") from None
    world.until(lambda: world.lines("evac-a").get(moves) == "migrated", f"{moves} migrated in the finding")
    assert len(world.notices("evac-a")) == 1, "one notice per node and episode: the update went to the Event only"
    assert world.lines("evac-a")[stays] == "blocks-drain"
    # the one that blocks is stopped by its owner: the node is drained clean
    world.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", stays, {"spec": {"runStrategy": "Halted"}})
    world.until(lambda: world.notices("evac-a", "resolved"), "a .resolved notice of evac-a")
    [resolved] = world.notices("evac-a", "resolved")
    assert "drained clean" in resolved["details"]["because"]
    reasons = {e["reason"]: e["type"] for e in world.record("evac-a")}
    assert reasons == {"NodeEvacuation": "Warning", "NodeEvacuationResolved": "Normal"}, reasons
    # KubeVirt's own evacuation VMIM on the real backend, the simulator's played one: annotated with the node
    vmims = world.cluster.list("kubevirt.io/v1", "VirtualMachineInstanceMigration", "default")
    assert any((m["metadata"].get("annotations") or {}).get("kubevirt.io/evacuationMigration") == "evac-a"
               and m["spec"]["vmiName"] == moves for m in vmims)


@pytest.mark.timeout(900)
def test_a_dead_node_says_when_its_vms_restart_and_ends_when_they_run_elsewhere(fresh):
    world = fresh
    world.cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                          "metadata": {"name": "shared-dead", "namespace": "default"},
                          "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "pvc-dead",
                                   "resources": {"requests": {"storage": "1Gi"}}}})
    name = world.start_vm("dead", node="evac-a", claims=("shared-dead",))
    # its Longhorn volume, attached to the node that is about to die (longhorn-manager's status)
    if world.cluster.get("v1", "Namespace", None, "longhorn-system") is None:
        world.cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "longhorn-system"}})
    world.cluster.create({"apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
                          "metadata": {"name": "pvc-dead", "namespace": "longhorn-system"}, "spec": {}})
    world.cluster.patch("longhorn.io/v1beta2", "Volume", "longhorn-system", "pvc-dead",
                        {"status": {"state": "attached", "currentNodeID": "evac-a", "robustness": "healthy"}},
                        subresource="status")
    world.sim.set_ready("evac-a", "Unknown")
    time.sleep(DOWN_AFTER + 0.5)
    down = lambda state="detected": [n for n in world.notices("evac-a", state) if n["category"] == "node-down"]  # noqa: E731
    world.until(down, "a .detected node-down notice of evac-a")
    [opened] = down()
    assert opened["severity"] == "critical"
    [line] = [v for v in opened["details"]["vms"] if v["vm"] == f"default/{name}"]
    assert line["outcome"] == "restarts-elsewhere", line
    assert any("Longhorn volume pvc-dead of PVC shared-dead is still attached to evac-a" in x for x in line["blockers"])
    # Harvester 1.6 resets it (pods force-deleted, heartbeat rewound); KubeVirt fails the VMI and starts it on evac-b
    eventually(lambda: world.where(name) == ("Running", "evac-b"), timeout=120, what=f"{name} running on evac-b")
    world.until(lambda: down("resolved"), "a .resolved node-down notice")
    assert len(down()) == 1 and len(down("resolved")) == 1


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

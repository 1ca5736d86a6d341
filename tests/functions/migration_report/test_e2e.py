"""migration-report end to end, on both backends: the API server, the local broker routing by the Trigger in
deploy/, the ApiServerSource for VMIMs and the PingSource, and the function running as a real functions-framework
HTTP server with the credentials of its own ServiceAccount.

On the real backend KubeVirt's own virt-controller runs every migration: a test creates a VM and a VMIM, as a
person would; the migration controller creates the target pod, hands it to the VMI, matches the MigrationPolicy,
writes the VMIM's phases, copies the final migrationState and records its Events; the node stand-in plays the
scheduler (a cordoned node), the kubelet and virt-handler, and virt-launcher's migration monitor aborts the
migration on its completion budget or progress timeout with the numbers virt-controller handed to the VMI
(`KubeVirtSim.plan_migration`, simcluster/kubevirt/migration.py; time is compressed).

The simulated KubeVirt has no migration controller, so on the simulator each test plays KubeVirt's part: it
creates the VM, VMI and VMIM, KubeVirt's own Events, and moves the VMIM to its final phase with a status patch
(shaped like KubeVirt 1.1, 1.3 and 1.8 as the real backend shows them; simcluster/builders/migration.py).
"""
from __future__ import annotations

import itertools
import uuid

import pytest

from simcluster.builders.migration import (
    NOT_COMPLETED,
    STUCK,
    create_guest,
    create_migration,
    make_namespace,
    make_policy,
    unschedulable_events,
)
from simcluster.kubevirt import migration as nm
from tests import backends, e2e
from tests.e2e import eventually, kubevirt_versions
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION = "migration-report"
FUNCTION_SA = "vmevents/migration-report"
_names = itertools.count(1)


NODES = ("mig-node-a", "mig-node-b")
# A cordoned second node, as the node stand-in's scheduler words it for a migration target pod
UNSCHEDULABLE = "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 1 node(s) were unschedulable."


class World(e2e.World):
    """Real backend: KubeVirt's virt-controller and the node stand-in on two nodes. Simulator: no KubeVirtSim (it
    has no migration controller): the tests play KubeVirt's part."""
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)

    def __init__(self, version: str, backend: str):
        self.version = version
        self.shape = version.rsplit(".", 1)[0]          # "1.1", "1.3", "1.8"
        self.per_gib = 800 if self.shape in ("1.1", "1.3") else 150
        real = backend == backends.REAL
        super().__init__(version, backend=backend,
                         kubevirt={"step_delay": 0.01, "nodes": {n: {} for n in NODES}} if real else None)

    @property
    def real(self) -> bool:
        return self.kubevirt is not None

    # -- a guest and its migration: KubeVirt's own on the real backend, played on the simulator ---------
    def guest(self, *, guest="8Gi", labels=None, namespace="default") -> tuple[dict, dict]:
        name = f"mig{next(_names)}"
        if not self.real:
            return create_guest(self.cluster, name, guest=guest, labels=labels, namespace=namespace)
        vm = self.cluster.create({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"labels": labels or {}},
                "spec": {"domain": {"devices": {}, "memory": {"guest": guest}}}}}})
        vmi = self.wait_vmi_phase(name, "Running", namespace, timeout=60)
        return vm, vmi

    def migrate(self, vmi: dict, outcome: str = nm.COMPLETE, *, took: int = 1, budget: int | None = None,
                unschedulable: bool = False, policy: tuple[str, dict] | None = None) -> dict:
        """A migration of `vmi` that ends as `outcome` (after `took` seconds when it completes); `budget`: the
        completion budget KubeVirt computes (the simulator's played message names it; on the real backend
        virt-launcher's stand-in computes it from what virt-controller wrote). `unschedulable`: the target pod
        finds no node (the other node cordoned) until KubeVirt's unschedulable timeout deletes it. `policy`: (name,
        fields) of the MigrationPolicy KubeVirt matches, for the simulator to record (virt-controller matches it)."""
        if not self.real:
            name, fields = policy or (None, {})
            return self._played(vmi, outcome, took=took, budget=budget, unschedulable=unschedulable,
                                policy=name, policy_fields=fields)
        meta = vmi["metadata"]
        annotations = {}
        if unschedulable:
            other = next(n for n in NODES if n != vmi["status"]["nodeName"])
            self.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": True}})
            # the migration controller's own knob for this (types.go: "This exists for functional testing")
            annotations = {"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "3"}
        else:
            self.kubevirt.plan_migration(meta["namespace"], meta["name"], outcome, took)
        created = self.cluster.create({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": f"{meta['name']}-mig-{uuid.uuid4().hex[:5]}", "namespace": meta["namespace"],
                         "annotations": annotations},
            "spec": {"vmiName": meta["name"]}})
        try:
            return eventually(lambda: (m := self.cluster.get("kubevirt.io/v1", "VirtualMachineInstanceMigration",
                                                             meta["namespace"], created["metadata"]["name"]))
                              and (m.get("status") or {}).get("phase") in ("Succeeded", "Failed") and m,
                              timeout=60, what=f"migration {created['metadata']['name']} final")
        finally:
            if unschedulable:
                self.cluster.patch("v1", "Node", None, other, {"spec": {"unschedulable": None}})

    def _played(self, vmi, outcome, *, took, budget, unschedulable, **recorded):
        if unschedulable:
            return create_migration(self.cluster, self.shape, vmi, took=300, state=False, reached_running=False,
                                    kubevirt_events=unschedulable_events(UNSCHEDULABLE))
        if outcome == nm.COMPLETE:
            return create_migration(self.cluster, self.shape, vmi, phase="Succeeded", took=took, **recorded)
        if outcome == nm.COMPLETION_TIMEOUT:
            return create_migration(self.cluster, self.shape, vmi, took=budget + 1, reason=NOT_COMPLETED.format(budget),
                                    **recorded)
        # virt-launcher's first check past the 150 s progress timeout sees 151 s without progress
        return create_migration(self.cluster, self.shape, vmi, took=151, reason=STUCK.format(151), **recorded)

    # -- looking ------------------------------------------------------------------------------
    def events(self, obj, namespace="default"):
        """The Events migration-report recorded on this object."""
        return [e for e in self.cluster.list("v1", "Event", namespace)
                if (e.get("source") or {}).get("component") == FUNCTION
                and e["involvedObject"]["uid"] == obj["metadata"]["uid"]]

    def replies(self, uid: str, state: str = "detected"):
        """(type, details + advice) of every finding in that state about the migration `uid`, alone or in a
        re-scan's summary (whose items have the type their own reply would have had)."""
        found = []
        for event in list(self.knative.broker.received):
            if event["source"] != f"/vmevents/{FUNCTION}":
                continue
            data = e2e.data_of(event)
            for item in data.get("findings", [data]):
                if item["details"].get("uid") == uid and item["state"] == state:
                    found.append((f"io.vmevents.{FUNCTION}.{state}", dict(item["details"], advice=item["advice"])))
        return found

    def reported(self, vmi, vm, vmim):
        """Wait for the Event on the VMI and the VM; the reply that came with them."""
        eventually(lambda: self.events(vmi) and self.events(vm), what="Events on the VMI and the VM")
        return eventually(lambda: self.replies(vmim["metadata"]["uid"]), what="a reply")[0]


@pytest.fixture(scope="module", **kubevirt_versions("1.1.1", "1.3.1", "1.8.3"))
def world(request):
    with World(*request.param) as w:
        yield w


def test_a_completion_timeout_is_explained_with_kubevirts_numbers_once(world):
    vm, vmi = world.guest(guest="8Gi", labels={"harvesterhci.io/vmName": "db"})
    budget = 9 * world.per_gib                     # 8Gi → 9 decimal GB: 7200 s at 800 s/GiB, not 6400
    vmim = world.migrate(vmi, nm.COMPLETION_TIMEOUT, budget=budget)
    kind, data = world.reported(vmi, vm, vmim)
    assert kind == "io.vmevents.migration-report.detected"
    assert data["category"] == "completion-timeout" and data["budget"]["completionTimeoutSeconds"] == budget
    assert data["dataSize"]["gigabytes"] == 9 and data["kubevirtVersion"] == f"v{world.version}"
    assert any("MigrationPolicy" in (a["yaml"] or "") and "harvesterhci.io/vmName: db" in a["yaml"]
               for a in data["advice"])
    event = world.events(vmi)[0]
    assert event["reason"] == "MigrationFailed" and event["type"] == "Warning"
    assert f"of a {budget} s completion budget" in event["message"]
    assert world.events(vm)[0]["message"] == event["message"]

    # duplicates, a late copy of the event, and re-scans: nothing is reported twice
    world.send(vmim)
    world.send(vmim)
    world.knative.ping.tick()
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert [e["count"] for e in world.events(vmi) + world.events(vm)] == [1, 1]
    assert len(world.replies(vmim["metadata"]["uid"])) == 1
    assert not world.replies(vmim["metadata"]["uid"], "resolved")

    # the finding ends when a later migration of the VMI has ended: one resolved, once
    world.migrate(vmi, took=budget // 10)
    world.settle()
    world.knative.ping.tick()
    world.settle()
    [(_, ended)] = eventually(lambda: world.replies(vmim["metadata"]["uid"], "resolved"), what="resolved")
    assert "a later migration of the VMI" in ended["because"]
    world.knative.ping.tick()
    world.settle()
    assert len(world.replies(vmim["metadata"]["uid"], "resolved")) == 1

def test_a_progress_stall_is_explained(world):
    vm, vmi = world.guest(guest="2Gi")
    vmim = world.migrate(vmi, nm.PROGRESS_STALL)
    _, data = world.reported(vmi, vm, vmim)
    assert data["category"] == "progress-stall"
    assert data["budget"]["progressTimeoutSeconds"] == 150
    assert "no data moved for 151 s" in world.events(vmi)[0]["message"]  # the seconds virt-launcher names


def test_an_unschedulable_target_is_explained_with_the_schedulers_message(world):
    vm, vmi = world.guest(guest="2Gi")
    vmim = world.migrate(vmi, unschedulable=True)
    _, data = world.reported(vmi, vm, vmim)
    assert data["category"] == "target-unschedulable"
    assert UNSCHEDULABLE.rstrip(".") in world.events(vmi)[0]["message"]
    assert "it never started copying" in world.events(vmi)[0]["message"]


def test_a_policy_matched_by_namespace_labels_sets_the_budget(world):
    namespace = f"hpc{next(_names)}"
    world.cluster.create(make_namespace(namespace, {"workload-class": namespace}))
    world.cluster.create(make_policy(f"{namespace}-policy", namespace={"workload-class": namespace},
                                     completionTimeoutPerGiB=100))
    vm, vmi = world.guest(guest="2Gi", labels={"app": "batch"}, namespace=namespace)
    vmim = world.migrate(vmi, nm.COMPLETION_TIMEOUT, budget=300,    # 100 s/GiB × 3 GB, the policy's
                         policy=(f"{namespace}-policy", {"completionTimeoutPerGiB": 100}))
    eventually(lambda: world.events(vmi, namespace), what="the Event")
    _, data = eventually(lambda: world.replies(vmim["metadata"]["uid"]), what="a reply")[0]
    # KubeVirt records the policy it matched (migrationState.migrationPolicyName), so the report need not match again
    assert data["policy"]["name"] == f"{namespace}-policy" and data["policy"]["how"] == "recorded"
    assert data["budget"]["completionTimeoutSeconds"] == 300
    assert data["advice"][0]["action"] == f"amend MigrationPolicy {namespace}-policy (the policy in effect)"

    # a migration that failed before KubeVirt handed it to the VMI recorded nothing: the report matches the policy
    # itself, by the VMI's and the namespace's labels
    unplaced = world.migrate(vmi, unschedulable=True)
    _, data = eventually(lambda: world.replies(unplaced["metadata"]["uid"]), what="a reply")[0]
    assert data["category"] == "target-unschedulable"
    assert data["policy"]["name"] == f"{namespace}-policy" and data["policy"]["how"] == "matched"
    assert data["budget"]["completionTimeoutSeconds"] == 300


def test_a_success_near_its_timeout_is_reported_and_one_well_inside_is_not(world):
    vm, vmi = world.guest(guest="2Gi")
    budget = 3 * world.per_gib
    near = world.migrate(vmi, took=int(budget * 0.9))
    kind, data = world.reported(vmi, vm, near)
    assert kind == "io.vmevents.migration-report.detected" and data["category"] == "near-timeout"
    assert world.events(vmi)[0]["reason"] == "MigrationNearTimeout"

    vm2, vmi2 = world.guest(guest="2Gi")
    fine = world.migrate(vmi2, took=int(budget * 0.5))
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert not world.events(vmi2) and not world.replies(fine["metadata"]["uid"])


@pytest.mark.one_kubevirt
def test_a_missed_event_is_caught_by_the_next_tick(world):
    vm, vmi = world.guest(guest="2Gi")
    world.cluster.faults.add(method="GET", path=r"/virtualmachineinstancemigrations/mig", service_account=FUNCTION_SA,
                             status=503, times=None)
    vmim = world.migrate(vmi, nm.PROGRESS_STALL)
    eventually(lambda: any(d.dead_lettered for d in list(world.knative.broker.deliveries)
                           if d.subject and d.subject.endswith(vmim["metadata"]["name"])),
               what="every delivery failed: the event was dead-lettered")
    world.settle()
    assert not world.events(vmi)
    world.cluster.faults.clear()
    world.knative.ping.tick()
    world.reported(vmi, vm, vmim)


@pytest.mark.one_kubevirt
def test_a_report_that_could_not_be_recorded_is_retried_and_made_once(world):
    vm, vmi = world.guest(guest="2Gi")
    world.cluster.faults.add(method="POST", path=r"/namespaces/default/events$", service_account=FUNCTION_SA,
                             status=503, times=1)      # the finding's Event, on the VMIM: the delivery fails
    vmim = world.migrate(vmi, nm.PROGRESS_STALL)
    world.reported(vmi, vm, vmim)
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert len(world.events(vmim)) == 1 and len(world.events(vm)) == 1 and len(world.events(vmi)) == 1
    assert len(world.replies(vmim["metadata"]["uid"])) == 1


@pytest.mark.one_kubevirt
def test_a_finding_event_lost_before_its_end_is_reported_again_once(world):
    """As if the finding's Event had expired (--event-ttl) while the function was down: the re-scan reports the
    migration again — one extra notice, as docs/findings.md says — and no more. Runs on both backends."""
    vm, vmi = world.guest(guest="2Gi")
    vmim = world.migrate(vmi, nm.PROGRESS_STALL)
    world.reported(vmi, vm, vmim)
    world.settle()
    [lost] = world.events(vmim)
    world.cluster.delete("v1", "Event", lost["metadata"]["namespace"], lost["metadata"]["name"])
    world.knative.ping.tick()
    eventually(lambda: world.events(vmim), what="the finding's Event again, by the re-scan")
    world.settle()
    world.knative.ping.tick()
    world.settle()
    replies = world.replies(vmim["metadata"]["uid"])
    assert len(replies) == 2 and [e["count"] for e in world.events(vm)] == [2]


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    """Last in this module: by now every path has run. No request was denied, in any world; exactly the shipped
    permissions were used in the default version's, where every test ran (`one_kubevirt` ones too)."""
    world.settle()
    denied = [r for r in world.cluster.requests if r.service_account == FUNCTION_SA and not r.allowed]
    assert not denied, denied
    if world.version == e2e.DEFAULT_KUBEVIRT:
        assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

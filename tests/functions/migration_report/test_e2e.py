"""migration-report end to end: the simulated API server, the local broker routing by the Trigger in
deploy/, the ApiServerSource for VMIMs and the PingSource stand-ins, and the function running as a real
functions-framework HTTP server with the credentials of its own ServiceAccount.

The simulated KubeVirt does not model live migration, so each test plays KubeVirt's part through the
SimCluster: it creates the VM, VMI and VMIM, KubeVirt's own Events, and moves the VMIM to its final
phase with a status patch (shaped like KubeVirt 1.1, 1.3 and 1.8; simcluster/builders/migration.py).
"""
from __future__ import annotations

import itertools

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
from tests import backends, e2e
from tests.e2e import eventually, kubevirt_versions
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION = "migration-report"
FUNCTION_SA = "vmevents/migration-report"
_names = itertools.count(1)


class World(e2e.World):
    """No KubeVirtSim: it does not model live migration, so the tests play KubeVirt's part."""

    def __init__(self, version: str, backend: str):
        self.version = version
        self.shape = version.rsplit(".", 1)[0]          # "1.1", "1.3", "1.8"
        self.per_gib = 800 if self.shape in ("1.1", "1.3") else 150
        # On the real backend too the tests play KubeVirt's migration controller, so KubeVirt's own must not
        # run beside them: the node stand-in has no migration part (virt-handler's source/target progress) yet.
        super().__init__(version, backend=backend, cluster=backends.cluster(backend, version, virt_controller=False))

    # -- playing KubeVirt ---------------------------------------------------------------------
    def guest(self, *, guest="8Gi", labels=None, namespace="default") -> tuple[dict, dict]:
        return create_guest(self.cluster, f"mig{next(_names)}", guest=guest, labels=labels, namespace=namespace)

    def migrate(self, vmi: dict, **kwargs) -> dict:
        return create_migration(self.cluster, self.shape, vmi, **kwargs)

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
    vmim = world.migrate(vmi, took=budget + 1, reason=NOT_COMPLETED.format(budget))
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
    world.migrate(vmi, phase="Succeeded", took=budget // 10)
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
    vmim = world.migrate(vmi, took=300, reason=STUCK.format(150))
    _, data = world.reported(vmi, vm, vmim)
    assert data["category"] == "progress-stall"
    assert data["budget"]["progressTimeoutSeconds"] == 150
    assert "no data moved for 150 s" in world.events(vmi)[0]["message"]


def test_an_unschedulable_target_is_explained_with_the_schedulers_message(world):
    vm, vmi = world.guest(guest="2Gi")
    message = "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 2 Insufficient memory."
    vmim = world.migrate(vmi, took=300, state=False, reached_running=False,
                         kubevirt_events=unschedulable_events(message))
    _, data = world.reported(vmi, vm, vmim)
    assert data["category"] == "target-unschedulable"
    assert message.rstrip(".") in world.events(vmi)[0]["message"]
    assert "it never started copying" in world.events(vmi)[0]["message"]


def test_a_policy_matched_by_namespace_labels_sets_the_budget(world):
    namespace = f"hpc{next(_names)}"
    world.cluster.create(make_namespace(namespace, {"workload-class": namespace}))
    world.cluster.create(make_policy(f"{namespace}-policy", namespace={"workload-class": namespace},
                                     completionTimeoutPerGiB=100))
    vm, vmi = world.guest(guest="2Gi", labels={"app": "batch"}, namespace=namespace)
    vmim = world.migrate(vmi, took=301, reason=NOT_COMPLETED.format(300))
    eventually(lambda: world.events(vmi, namespace), what="the Event")
    _, data = eventually(lambda: world.replies(vmim["metadata"]["uid"]), what="a reply")[0]
    assert data["policy"]["name"] == f"{namespace}-policy" and data["policy"]["how"] == "matched"
    assert data["budget"]["completionTimeoutSeconds"] == 300
    assert data["advice"][0]["action"] == f"amend MigrationPolicy {namespace}-policy (the policy in effect)"


def test_a_success_near_its_timeout_is_reported_and_one_well_inside_is_not(world):
    vm, vmi = world.guest(guest="2Gi")
    budget = 3 * world.per_gib
    near = world.migrate(vmi, phase="Succeeded", took=int(budget * 0.9))
    kind, data = world.reported(vmi, vm, near)
    assert kind == "io.vmevents.migration-report.detected" and data["category"] == "near-timeout"
    assert world.events(vmi)[0]["reason"] == "MigrationNearTimeout"

    vm2, vmi2 = world.guest(guest="2Gi")
    fine = world.migrate(vmi2, phase="Succeeded", took=int(budget * 0.5))
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert not world.events(vmi2) and not world.replies(fine["metadata"]["uid"])


def test_a_missed_event_is_caught_by_the_next_tick(world):
    vm, vmi = world.guest(guest="2Gi")
    world.cluster.faults.add(method="GET", path=r"/virtualmachineinstancemigrations/mig", service_account=FUNCTION_SA,
                             status=503, times=None)
    vmim = world.migrate(vmi, took=300, reason=STUCK.format(150))
    eventually(lambda: any(d.dead_lettered for d in list(world.knative.broker.deliveries)
                           if d.subject and d.subject.endswith(vmim["metadata"]["name"])),
               what="every delivery failed: the event was dead-lettered")
    world.settle()
    assert not world.events(vmi)
    world.cluster.faults.clear()
    world.knative.ping.tick()
    world.reported(vmi, vm, vmim)


def test_a_report_that_could_not_be_recorded_is_retried_and_made_once(world):
    vm, vmi = world.guest(guest="2Gi")
    world.cluster.faults.add(method="POST", path=r"/namespaces/default/events$", service_account=FUNCTION_SA,
                             status=503, times=1)      # the finding's Event, on the VMIM: the delivery fails
    vmim = world.migrate(vmi, took=300, reason=STUCK.format(150))
    world.reported(vmi, vm, vmim)
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert len(world.events(vmim)) == 1 and len(world.events(vm)) == 1 and len(world.events(vmi)) == 1
    assert len(world.replies(vmim["metadata"]["uid"])) == 1


def test_a_finding_event_lost_before_its_end_is_reported_again_once(world):
    """As if the finding's Event had expired (--event-ttl) while the function was down: the re-scan reports the
    migration again — one extra notice, as docs/findings.md says — and no more. Runs on both backends."""
    vm, vmi = world.guest(guest="2Gi")
    vmim = world.migrate(vmi, took=300, reason=STUCK.format(150))
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
    """Last in this module: by now every path has run. Exactly the shipped permissions were used."""
    world.settle()
    denied = [r for r in world.cluster.requests if r.service_account == FUNCTION_SA and not r.allowed]
    assert not denied, denied
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

"""A dry run's re-scan (issue 25): a due VMI reported on the same objects before is not decided again, so a
steady tick reads no candidate in full and writes nothing; a change of the VMI, of its VM, of the settings, or a
basis past its renewal, is decided again within one tick; an acting install never trusts the record. On both
backends, with the function's own ServiceAccount: the requests are counted at the client (what each asked for:
the full object or its metadata) and, for the writes, from the simulator's record or kube-apiserver's audit log."""
from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from functions.vmi_cleanup import memory
from functions.vmi_cleanup.handler import rescan
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.kubevirt import make_vm, make_vmi
from tests import backends

NOW = datetime.now(UTC).replace(microsecond=0)
FINISHED = NOW - timedelta(hours=1)
SA = "vmevents/vmi-cleanup"
_names = itertools.count(1)


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1", virt_controller=False)
    yield c
    c.stop()


class Counting(Kube):
    """Every request as (method, path, metadata only?), as the function sent it."""

    def __init__(self, api_client):
        super().__init__(api_client)
        self.sent: list[tuple[str, str, bool]] = []

    def _send(self, method, path, query, body=None, content_type="application/json", accept="application/json"):
        self.sent.append((method, path, "PartialObjectMetadata" in accept))
        return super()._send(method, path, query, body, content_type, accept)


def context(cluster, namespace, when=NOW, **settings) -> KubeContext:
    kube = Counting(cluster.api_client(service_account=SA))
    base = {"cleanup_after": timedelta(minutes=10), "dry_run": True, "namespaces": frozenset({namespace})}
    return KubeContext(FUNCTION, Settings(**{**base, **settings}), lambda: when, kube, Recorder(kube, FUNCTION))


def world(cluster, count=3, run_strategy="Manual"):
    """A namespace of its own with `count` VMs, each with a VMI left Succeeded an hour ago (due)."""
    namespace = f"dry{next(_names)}"
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for i in range(count):
        vm = make_vm(f"vm{i}", namespace, run_strategy=run_strategy)
        for key in ("uid", "resourceVersion"):
            vm["metadata"].pop(key)
        vm.pop("status")
        vm = cluster.create(vm)
        vmi = make_vmi(f"vm{i}", namespace, owner=vm, finished=FINISHED)
        for key in ("uid", "resourceVersion"):
            vmi["metadata"].pop(key)
        cluster.create(vmi)
    return namespace


def full_reads(ctx):
    """The GETs of a VMI or a VM in full (not its metadata only)."""
    return [path for method, path, metadata in ctx.kube.sent if method == "GET" and not metadata
            and ("/virtualmachineinstances/" in path or "/virtualmachines/" in path)]


def writes(cluster):
    return [r for r in cluster.requests if r.service_account == SA and r.verb in ("create", "patch", "update",
                                                                                  "delete")]


def clear(cluster):
    if hasattr(cluster, "clear_requests"):
        cluster.clear_requests()   # the real backend's audit log: read from here on
    else:
        cluster.requests.clear()


def dry_events(cluster, namespace):
    return [e for e in cluster.list("v1", "Event", namespace) if e["reason"] == "VMICleanupDryRun"]


def test_a_steady_dry_run_tick_reads_no_candidate_in_full_and_writes_nothing(cluster):
    namespace = world(cluster)
    first = rescan(context(cluster, namespace))
    assert len(first.reply.data["findings"]) == 3 and "0 reported before" in first.reason
    assert all(memory.BASIS in e["metadata"]["annotations"] for e in dry_events(cluster, namespace))
    clear(cluster)
    ctx = context(cluster, namespace)
    steady = rescan(ctx)
    assert full_reads(ctx) == [], "a steady candidate is read from its metadata only"
    assert not writes(cluster), "a steady dry-run tick writes nothing (no Event counted again)"
    assert steady.reply is None and "3 reported before on the same objects" in steady.reason, steady
    # One Table LIST, one LIST of Events, one of KubeVirt, and two metadata GETs per candidate: no LIST of
    # migrations, no Event read or patch per candidate.
    kinds = sorted(path.rsplit("/", 1)[-1] if method == "GET" and not metadata else "metadata"
                   for method, path, metadata in ctx.kube.sent)
    assert kinds == ["events", "kubevirts"] + ["metadata"] * 6 + ["virtualmachineinstances"], kinds
    assert {e["count"] for e in dry_events(cluster, namespace)} == {1}


def test_a_change_of_the_vm_is_decided_again_within_one_tick(cluster):
    namespace = world(cluster)
    rescan(context(cluster, namespace))
    cluster.patch("kubevirt.io/v1", "VirtualMachine", namespace, "vm1", {"spec": {"runStrategy": "Once"}})
    cluster.patch("kubevirt.io/v1", "VirtualMachine", namespace, "vm2",
                  {"metadata": {"annotations": {"vmevents.io/skip-cleanup": "true"}}})
    ctx = context(cluster, namespace)
    outcome = rescan(ctx)
    assert "1 reported before" in outcome.reason, outcome.reason
    [changed] = outcome.reply.data["findings"]
    assert changed["details"]["vmi"] == f"{namespace}/vm1" and changed["details"]["action"] == "would-halt-vm"
    assert any("would have halted" in e["message"] for e in dry_events(cluster, namespace))
    assert sorted(p.rsplit("/", 1)[-1] for p in full_reads(ctx)) == ["vm1", "vm1", "vm2", "vm2"]
    # The opted-out one has no basis for its verdict (nothing reported), so it is decided in full each tick.
    again = context(cluster, namespace)
    assert "2 reported before" in rescan(again).reason
    assert sorted(p.rsplit("/", 1)[-1] for p in full_reads(again)) == ["vm2", "vm2"]


def test_a_change_of_the_vmi_is_decided_again_and_reported_again(cluster):
    namespace = world(cluster, count=2)
    rescan(context(cluster, namespace))
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", namespace, "vm0",
                  {"metadata": {"annotations": {"vmevents.io/cleanup-after": "100h"}}})
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", namespace, "vm1",
                  {"metadata": {"labels": {"someone": "was-here"}}})
    outcome = rescan(context(cluster, namespace))
    assert "0 reported before" in outcome.reason, outcome.reason
    [again] = outcome.reply.data["findings"]  # vm0 is not due any more; vm1's verdict stands, on new versions
    assert again["details"]["vmi"] == f"{namespace}/vm1"
    assert {e["involvedObject"]["name"]: e["count"] for e in dry_events(cluster, namespace)} == {"vm0": 1, "vm1": 2}
    assert "1 reported before" in rescan(context(cluster, namespace)).reason


def test_a_basis_past_its_renewal_or_of_other_settings_is_decided_again(cluster):
    namespace = world(cluster, count=1)
    rescan(context(cluster, namespace))
    later = NOW + memory.RENEW_AFTER
    renewed = rescan(context(cluster, namespace, when=later))
    assert renewed.reply is not None and "0 reported before" in renewed.reason
    [event] = dry_events(cluster, namespace)
    assert event["count"] == 2 and event["lastTimestamp"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "1 reported before" in rescan(context(cluster, namespace, when=later + timedelta(minutes=1))).reason
    other = rescan(context(cluster, namespace, when=later, cleanup_after=timedelta(minutes=20)))
    assert "0 reported before" in other.reason and other.reply is not None


def test_an_acting_install_never_trusts_a_dry_run_record(cluster):
    namespace = world(cluster, count=1)
    rescan(context(cluster, namespace))
    acting = context(cluster, namespace, dry_run=False)
    outcome = rescan(acting)
    assert outcome.reply.data["findings"][0]["details"]["action"] == "deleted-vmi"
    gone = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", namespace, "vm0")
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    assert not any(path.endswith("/events") for method, path, _ in acting.kube.sent if method == "GET")


def test_a_forged_or_unreadable_basis_is_not_trusted(cluster):
    namespace = world(cluster, count=1)
    rescan(context(cluster, namespace))
    [event] = dry_events(cluster, namespace)
    cluster.patch("v1", "Event", namespace, event["metadata"]["name"],
                  {"metadata": {"annotations": {memory.BASIS: "{not json"}}})
    assert "0 reported before" in rescan(context(cluster, namespace)).reason
    assert "1 reported before" in rescan(context(cluster, namespace)).reason  # the full decision wrote it again

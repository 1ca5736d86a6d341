"""vmi-cleanup's fetch/act/report against the simulated API server, in-process, with the function's
own ServiceAccount credentials: races, dry run, Event deduplication. (End to end through the broker
is tests/functions/vmi_cleanup/test_e2e.py.)"""
from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from functions.vmi_cleanup.handler import converge, halt_patch, rescan
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared.kinds import VM
from shared.kube import Conflict, Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.apiserver import SimCluster
from simcluster.builders.kubevirt import make_vm, make_vmi

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
FINISHED = NOW - timedelta(hours=1)


@pytest.fixture(scope="module")
def cluster():
    c = SimCluster(kubevirt_version="1.1.1").start()
    yield c
    c.stop()


def context(cluster, page_size=250, **settings) -> KubeContext:
    kube = Kube(cluster.api_client(service_account="vmevents/vmi-cleanup"), page_size=page_size)
    return KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10), **settings), lambda: NOW,
                       kube, Recorder(kube, FUNCTION))


def create_pair(cluster, name, run_strategy="Manual", **vm_kwargs):
    """A VM and its Succeeded VMI, as stored (uids and resourceVersions from the server)."""
    vm = make_vm(name, run_strategy=run_strategy, **vm_kwargs)
    for key in ("uid", "resourceVersion"):
        vm["metadata"].pop(key)
    vm.pop("status")
    vm = cluster.create(vm)
    vmi = make_vmi(name, owner=vm, finished=FINISHED)
    for key in ("uid", "resourceVersion"):
        vmi["metadata"].pop(key)
    return vm, cluster.create(vmi)


def vmi_of(cluster, name):
    return cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)


def events_on(cluster, name):
    return [e for e in cluster.list("v1", "Event", "default") if e["involvedObject"]["name"] == name]


def test_a_vmi_recreated_between_the_read_and_the_delete_is_not_deleted(cluster):
    _, stale = create_pair(cluster, "race1")
    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "race1")
    vm = cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "race1")
    fresh = make_vmi("race1", owner=vm, phase="Running")
    for key in ("uid", "resourceVersion"):
        fresh["metadata"].pop(key)
    fresh = cluster.create(fresh)

    outcome = converge(stale, context(cluster))  # decided on the stale copy: delete → 409 → re-read → skip

    assert vmi_of(cluster, "race1")["metadata"]["uid"] == fresh["metadata"]["uid"]
    assert outcome.verdict == "skip" and "phase is Running" in outcome.reason


def test_a_vmi_changed_since_the_read_is_decided_again(cluster):
    _, stale = create_pair(cluster, "race2")
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "race2",
                  {"metadata": {"annotations": {"vmevents.io/skip-cleanup": "true"}}})
    outcome = converge(stale, context(cluster))
    assert vmi_of(cluster, "race2") is not None
    assert outcome.verdict == "skip" and "opts out" in outcome.reason


def test_a_vm_whose_run_strategy_changed_since_the_read_is_not_halted(cluster):
    vm, vmi = create_pair(cluster, "race3", run_strategy="Once")
    ctx = context(cluster)
    stale_vm = copy.deepcopy(vm)
    cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "race3", {"spec": {"runStrategy": "Always"}})
    with pytest.raises(Conflict):
        ctx.kube.json_patch(VM, "default", "race3", halt_patch(stale_vm, "Once"))
    assert cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "race3")["spec"]["runStrategy"] == "Always"
    outcome = converge(vmi, ctx)  # fresh read: Always → leave it
    assert outcome.verdict == "leave"


def test_dry_run_reports_and_changes_nothing(cluster):
    vm, vmi = create_pair(cluster, "dry1", run_strategy="Once")
    outcome = converge(vmi, context(cluster, dry_run=True))
    assert outcome.effect == "would-halt-vm" and outcome.reply.data["details"]["dryRun"] is True
    assert cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "dry1")["spec"]["runStrategy"] == "Once"
    assert vmi_of(cluster, "dry1") is not None
    [event] = events_on(cluster, "dry1")
    assert event["reason"] == "VMICleanupDryRun" and event["message"].startswith("Dry run: would have halted")


def test_the_same_event_again_raises_its_count(cluster):
    _, vmi = create_pair(cluster, "dry2")
    ctx = context(cluster, dry_run=True)
    for _ in range(3):
        converge(vmi_of(cluster, "dry2"), ctx)
    [event] = events_on(cluster, "dry2")
    assert event["count"] == 3 and event["reason"] == "VMICleanupDryRun"


def test_rescan_pages_through_every_vmi_and_acts_on_the_due_ones(cluster):
    for i in range(7):
        create_pair(cluster, f"scan{i}")
    cluster.requests.clear()
    outcome = rescan(context(cluster, page_size=3))
    assert all(vmi_of(cluster, f"scan{i}") is None for i in range(7))
    cleaned = {c["details"]["vmi"] for c in outcome.reply.data["findings"]}
    assert {f"default/scan{i}" for i in range(7)} <= cleaned
    lists = [r for r in cluster.requests if r.service_account == "vmevents/vmi-cleanup" and r.verb == "list"
             and r.resource == "virtualmachineinstances"]
    namespaces = {n["metadata"]["name"] for n in cluster.list("v1", "Namespace")}
    # Since issue 15 the VMIs' phases come from the watch cache (resourceVersion=0), which does not paginate:
    # one Table LIST per namespace, whatever the page size (docs/api-cost.md).
    assert sorted(r.namespace for r in lists) == sorted(namespaces), "one LIST of VMI rows per namespace"


def test_rescan_reads_in_full_only_the_vmis_in_a_final_phase(cluster):
    """The re-scan finds its candidates in the Table cells; a Running VMI is never fetched (issue 15)."""
    for i in range(3):
        create_pair(cluster, f"cand{i}")
    for i in range(5):
        cluster.create({**make_vmi(f"busy{i}", phase="Running", finished=None),
                        "metadata": {"name": f"busy{i}", "namespace": "default"}})
    cluster.requests.clear()
    rescan(context(cluster))
    gets = {r.name for r in cluster.requests if r.service_account == "vmevents/vmi-cleanup" and r.verb == "get"
            and r.resource == "virtualmachineinstances"}
    assert {f"cand{i}" for i in range(3)} <= gets and not {n for n in gets if n.startswith("busy")}


def test_a_delete_applied_while_the_api_is_down_is_reported_once_the_api_answers(cluster, monkeypatch):
    """The DELETE is applied but its answer lost (etcd stopped: kube-apiserver applies it once etcd is back), and the
    re-read that would tell fails too for a while: the answer waits for the re-read, then reports the cleanup. A 503
    instead would be redelivered, find the VMI gone, and announce nothing (issue 23's etcd scenario)."""
    from functions.vmi_cleanup import handler

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 10.0)
    _, vmi = create_pair(cluster, "lost1")
    path = "/virtualmachineinstances/lost1$"
    cluster.faults.add(method="DELETE", path=path, status=503, service_account="vmevents/vmi-cleanup",
                       call=lambda: cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "lost1"))
    reads = cluster.faults.add(method="GET", path=path, status=503, times=2, service_account="vmevents/vmi-cleanup")
    try:
        outcome = converge(vmi, context(cluster))
    finally:
        cluster.faults.clear()
    assert reads.hits == 2, "the re-read failed twice before it answered"
    assert outcome.effect == "deleted-vmi" and outcome.reply is not None
    assert vmi_of(cluster, "lost1") is None
    assert [e["reason"] for e in events_on(cluster, "lost1")] == ["VMICleanedUp"]


def test_a_delete_whose_answer_stays_lost_is_answered_unavailable(cluster, monkeypatch):
    from functions.vmi_cleanup import handler
    from shared.kube import Unavailable

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 1.5)
    _, vmi = create_pair(cluster, "lost2")
    path = "/virtualmachineinstances/lost2$"
    cluster.faults.add(method="DELETE", path=path, status=503, service_account="vmevents/vmi-cleanup")
    cluster.faults.add(method="GET", path=path, status=503, times=None, service_account="vmevents/vmi-cleanup")
    try:
        with pytest.raises(Unavailable):
            converge(vmi, context(cluster))
    finally:
        cluster.faults.clear()
    assert vmi_of(cluster, "lost2") is not None and events_on(cluster, "lost2") == []


def test_a_delete_lost_on_its_way_is_sent_again_and_reported(cluster, monkeypatch):
    """The DELETE's answer is lost and the re-read finds the VMI unchanged: the DELETE never arrived (or is still on
    its way). A 503 would lose the notice if it were applied later; instead the function decides again on fresh
    reads and sends the DELETE again, which is applied and reported."""
    from functions.vmi_cleanup import handler

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 2.0)
    _, vmi = create_pair(cluster, "lost5")
    lost = cluster.faults.add(method="DELETE", path="/virtualmachineinstances/lost5$", status=503,
                              service_account="vmevents/vmi-cleanup")
    try:
        outcome = converge(vmi, context(cluster), delivery="ce-1")
    finally:
        cluster.faults.clear()
    deletes = [r for r in cluster.requests if r.verb == "delete" and r.name == "lost5"]
    assert lost.hits == 1 and len(deletes) == 2, "the DELETE was sent again"
    assert outcome.effect == "deleted-vmi" and outcome.reply is not None
    assert vmi_of(cluster, "lost5") is None
    [event] = events_on(cluster, "lost5")
    assert event["reason"] == "VMICleanedUp" and event["count"] == 1


def test_a_delete_turned_away_with_429_is_not_sent_again_but_answered_with_its_retry_after(cluster, monkeypatch):
    """A 429 is an answer, not a lost one: the DELETE was not applied, so it is not in doubt. The delivery answers
    503 with the server's Retry-After for the broker to honour (the burst fault test holds it on the real backend),
    rather than sending it again at once to a server that asked for a pause. The client is configured as a deployed
    function's is (shared.kubeconfig.connect: urllib3 never retries a status itself)."""
    from shared.kube import Throttled
    from shared.kubeconfig import connect

    _, vmi = create_pair(cluster, "throttled1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(service_account="vmevents/vmi-cleanup")))
    kube = connect()
    ctx = KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10)), lambda: NOW, kube,
                      Recorder(kube, FUNCTION))
    cluster.faults.add(method="DELETE", path="/virtualmachineinstances/throttled1$", status=429, retry_after=3,
                       service_account="vmevents/vmi-cleanup")
    try:
        with pytest.raises(Throttled) as refused:
            converge(vmi, ctx, delivery="ce-3")
    finally:
        cluster.faults.clear()
    assert refused.value.retry_after == 3
    assert len([r for r in cluster.requests if r.verb == "delete" and r.name == "throttled1"]) == 1
    assert vmi_of(cluster, "throttled1") is not None and events_on(cluster, "throttled1") == []


def test_a_delete_applied_after_the_reread_is_reported_by_the_delivery_that_sent_it(cluster, monkeypatch):
    """The lost DELETE is applied late, after the re-read saw the VMI unchanged and before the DELETE sent again
    arrives (kube-apiserver retried it once etcd was back): the second finds the VMI gone, and the delivery
    reports the cleanup, for the first was its own. Before, it answered 503, and its redelivery found the VMI gone
    with nothing to announce (issue 23's etcd scenario: "no notice")."""
    from functions.vmi_cleanup import handler

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 2.0)
    _, vmi = create_pair(cluster, "lost6")
    path = "/virtualmachineinstances/lost6$"

    def late():  # on the DELETE sent again, just before it is served: the first one is applied
        cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "lost6")

    cluster.faults.add(method="DELETE", path=path, status=503, service_account="vmevents/vmi-cleanup",
                       call=lambda: cluster.faults.add(method="DELETE", path=path, kind="latency", delay=0.0,
                                                       service_account="vmevents/vmi-cleanup", call=late))
    try:
        outcome = converge(vmi, context(cluster), delivery="ce-2")
    finally:
        cluster.faults.clear()
    assert outcome.effect == "deleted-vmi" and outcome.reply is not None
    [event] = events_on(cluster, "lost6")
    assert event["reason"] == "VMICleanedUp" and event["count"] == 1


def test_two_deliveries_whose_deletes_both_lost_their_answer_announce_the_cleanup_once(cluster, monkeypatch):
    """Two deliveries about one VMI read it before either DELETE, and both DELETEs lose their answer (etcd down):
    one was applied, and neither can tell whose. The first to record the Event since the VMI was made reports the
    cleanup; the other finds that Event counted after the VMI's creation and announces nothing, and the count
    stays 1 (issue 23's etcd scenario, seen once as two notices for one cleanup)."""
    from functions.vmi_cleanup import handler

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 2.0)
    _, vmi = create_pair(cluster, "lost3")
    path = "/virtualmachineinstances/lost3$"

    def applied():
        if vmi_of(cluster, "lost3") is not None:
            cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "lost3")

    cluster.faults.add(method="DELETE", path=path, status=503, times=2, service_account="vmevents/vmi-cleanup",
                       call=applied)
    kube = Kube(cluster.api_client(service_account="vmevents/vmi-cleanup"))
    # The cluster's own clock: the Event's time is compared with the VMI's creationTimestamp, which the server set.
    ctx = KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10)), lambda: datetime.now(UTC), kube,
                      Recorder(kube, FUNCTION))
    try:
        first, second = converge(copy.deepcopy(vmi), ctx), converge(copy.deepcopy(vmi), ctx)
    finally:
        cluster.faults.clear()
    assert first.effect == "deleted-vmi" and first.reply is not None
    assert second.verdict == "gone" and second.reply is None and "another delivery reported it" in second.reason
    [event] = events_on(cluster, "lost3")
    assert event["reason"] == "VMICleanedUp" and event["count"] == 1


def test_an_earlier_episodes_event_does_not_pass_for_a_lost_answers_report(cluster, monkeypatch):
    """The VM's Event from an earlier power-off (before this VMI was made) does not pass for this one's report:
    each VMI's cleanup has an Event of its own (named by the VMI's uid, so that a redelivery finds it)."""
    from functions.vmi_cleanup import handler

    monkeypatch.setattr(handler, "LOST_ANSWER_WAIT", 2.0)
    vm, old = create_pair(cluster, "lost4")
    kube = Kube(cluster.api_client(service_account="vmevents/vmi-cleanup"))
    earlier = datetime.now(UTC) - timedelta(hours=2)
    ctx_then = KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10)), lambda: earlier, kube,
                           Recorder(kube, FUNCTION))
    converge(copy.deepcopy(old), ctx_then)  # the earlier episode, reported two hours ago
    _, vmi = create_pair_again(cluster, vm, "lost4")
    path = "/virtualmachineinstances/lost4$"
    cluster.faults.add(method="DELETE", path=path, status=503, times=1, service_account="vmevents/vmi-cleanup",
                       call=lambda: cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "lost4"))
    ctx = KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10)), lambda: datetime.now(UTC), kube,
                      Recorder(kube, FUNCTION))
    try:
        outcome = converge(copy.deepcopy(vmi), ctx)
    finally:
        cluster.faults.clear()
    assert outcome.effect == "deleted-vmi" and outcome.reply is not None
    events = events_on(cluster, "lost4")
    assert sorted(e["metadata"]["annotations"]["vmevents.io/counted-for"] for e in events) == sorted(
        [old["metadata"]["uid"], vmi["metadata"]["uid"]]) and all(e["count"] == 1 for e in events)


def create_pair_again(cluster, vm, name):
    """The VM's next VMI (a start after the last cleanup), stored."""
    vmi = make_vmi(name, owner=vm, finished=FINISHED)
    for key in ("uid", "resourceVersion"):
        vmi["metadata"].pop(key)
    return vm, cluster.create(vmi)


def test_a_redelivery_of_the_event_that_cleaned_up_answers_with_its_reply_again(cluster):
    """The broker redelivers an event whose reply it could not take in (Knative's channel failed to hand the reply
    to the broker's ingress: tests/controlplane/test_knative_story.py). The VMI is gone by then; the redelivery of
    that very event answers with the same reply, same id, and any other event announces nothing."""
    _, vmi = create_pair(cluster, "again1")
    kube = Kube(cluster.api_client(service_account="vmevents/vmi-cleanup"))
    ctx = KubeContext(FUNCTION, Settings(cleanup_after=timedelta(minutes=10)), lambda: datetime.now(UTC), kube,
                      Recorder(kube, FUNCTION))
    first = converge(copy.deepcopy(vmi), ctx, delivery="event-1")
    assert first.effect == "deleted-vmi" and first.reply is not None
    again = converge(copy.deepcopy(vmi), ctx, delivery="event-1")
    assert again.verdict == "gone" and again.reply == first.reply and again.reply.id == first.reply.id
    other = converge(copy.deepcopy(vmi), ctx, delivery="event-2")
    assert other.verdict == "gone" and other.reply is None
    [event] = events_on(cluster, "again1")
    assert event["count"] == 1

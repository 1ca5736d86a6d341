"""A finding's life on the simulated API server: one notice per transition, the same reply on a redelivery,
one notice when deliveries race, and renewal of what is still open."""
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from shared.finding import DETECTED, RESOLVED, Finding, one_or_summary, report
from shared.kube import Kube
from shared.ledger import Ledger, event_name
from simcluster.apiserver import SimCluster

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
VM = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
      "metadata": {"name": "vm1", "namespace": "default", "uid": "u-1"}}
FINDING = Finding("device-conflict", "taken-while-stopped", "/apis/kubevirt.io/v1/namespaces/default/"
                  "virtualmachines/vm1", "dev-1", {"namespace": "default", "vm": "vm1", "device": "dev-1"},
                  "warning", "vm2 holds dev-1", details={"device": "dev-1"})


@pytest.fixture(scope="module")
def cluster():
    with SimCluster() as running:
        yield running


@pytest.fixture
def ledger(cluster):
    for event in cluster.list("v1", "Event", "default"):
        cluster.delete("v1", "Event", "default", event["metadata"]["name"])
    return Ledger(Kube(cluster.api_client(service_account="vmevents/device-conflict")), "device-conflict",
                  renew_after=timedelta(seconds=10), reason="HostDeviceConflict")


def _event(cluster):
    """The finding's Event (the ledger's record)."""
    [event] = [e for e in cluster.list("v1", "Event", "default") if "vmevents.io/finding" in e["metadata"].get(
        "labels", {})]
    return event


def _ends(cluster):
    """The Events that tell an episode's end."""
    return [e for e in cluster.list("v1", "Event", "default") if e["reason"] == "HostDeviceConflictResolved"]


def test_an_episode_announces_its_start_and_its_end_once(cluster, ledger):
    opened = ledger.sighted(FINDING, VM, "ce-1", NOW)
    assert opened is not None and opened.transition == DETECTED and opened.record.episode == 1
    assert all(ledger.sighted(FINDING, VM, f"ce-{i}", NOW + timedelta(seconds=i)) is None for i in range(2, 12))
    assert _event(cluster)["count"] == 11
    [record] = ledger.records()
    ended = ledger.resolve(record, "ping-1", NOW + timedelta(minutes=1), summary="it ended")
    assert ended is not None and ended.transition == RESOLVED
    assert ended.data()["summary"] == "it ended" and ended.data()["identity"] == FINDING.labels
    assert ledger.resolve(record, "ping-2", NOW + timedelta(minutes=2)) is None
    assert ledger.resolve(record, "ping-1", NOW + timedelta(minutes=3), summary="it ended") is not None  # redelivered
    assert list(ledger.records()) == []
    # kubectl describe: what was found, as found (Warning, the problem's reason and message, 11 sightings), and its
    # end in a row of its own, once (issue 34: the finding's Event turned "Normal HostDeviceConflict: it ended")
    event = _event(cluster)
    assert (event["type"], event["reason"], event["message"], event["count"]) == (
        "Warning", "HostDeviceConflict", "vm2 holds dev-1", 11)
    [end] = _ends(cluster)
    assert (end["type"], end["reason"], end["message"], end["count"]) == (
        "Normal", "HostDeviceConflictResolved", "it ended", 1)
    assert end["involvedObject"] == event["involvedObject"]
    assert end["firstTimestamp"] == "2026-11-30T13:01:00Z"


def test_each_episode_tells_its_end_in_a_row_of_its_own_and_no_more(cluster, ledger):
    for episode in range(1, 4):
        assert ledger.sighted(FINDING, VM, f"ce-{episode}", NOW + timedelta(minutes=10 * episode)) is not None
        [record] = ledger.records()
        assert ledger.resolve(record, f"ping-{episode}", NOW + timedelta(minutes=10 * episode + 5),
                              message=f"ended {episode}") is not None
    assert sorted(e["message"] for e in _ends(cluster)) == ["ended 1", "ended 2", "ended 3"]
    assert _event(cluster)["type"] == "Warning" and len(cluster.list("v1", "Event", "default")) == 4


def test_a_redelivery_gets_the_same_reply_and_other_sightings_none(ledger):
    first = ledger.sighted(FINDING, VM, "ce-1", NOW)
    again = ledger.sighted(FINDING, VM, "ce-1", NOW + timedelta(seconds=5))
    assert first is not None and again is not None and first.reply().id == again.reply().id
    [record] = ledger.records()
    ended = ledger.resolve(record, "ping-1", NOW)
    redelivered = ledger.resolve(record, "ping-1", NOW + timedelta(seconds=3))
    assert ended is not None and redelivered is not None and ended.reply().id == redelivered.reply().id
    assert ledger.sighted(FINDING, VM, "ping-1", NOW) is None  # the resolving event is no new sighting


def test_a_resolved_finding_seen_again_reopens_with_a_new_reply_id(ledger):
    first = ledger.sighted(FINDING, VM, "ce-1", NOW)
    [record] = ledger.records()
    ledger.resolve(record, "ping-1", NOW)
    reopened = ledger.sighted(FINDING, VM, "ce-9", NOW + timedelta(minutes=5))
    assert reopened is not None and reopened.record.episode == 2 and reopened.record.resolved_by is None
    assert reopened.record.count == 1  # the new episode counts from one
    assert first is not None and reopened.reply().id != first.reply().id


def test_racing_deliveries_produce_one_notice(cluster, ledger):
    ledgers = [Ledger(Kube(cluster.api_client(service_account="vmevents/device-conflict")), "device-conflict")
               for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(lambda pair: pair[1].sighted(FINDING, VM, f"ce-{pair[0]}", NOW), enumerate(ledgers)))
    assert sum(n is not None for n in opened) == 1
    assert _event(cluster)["count"] == 4
    [record] = ledger.records()
    with ThreadPoolExecutor(4) as pool:
        ended = list(pool.map(lambda pair: pair[1].resolve(record, f"ping-{pair[0]}", NOW), enumerate(ledgers)))
    assert sum(n is not None for n in ended) == 1


def test_the_rescan_renews_only_what_is_open_and_old(cluster, ledger):
    ledger.sighted(FINDING, VM, "ce-1", NOW)
    assert ledger.renew_stale(ledger.records(), NOW + timedelta(seconds=5)) == 0
    before = _event(cluster)["metadata"]["resourceVersion"]
    assert ledger.renew_stale(ledger.records(), NOW + timedelta(seconds=11)) == 1
    event = _event(cluster)
    assert event["metadata"]["resourceVersion"] != before and event["count"] == 1  # a write, not a sighting
    # a re-scan's own sighting (count=False) writes only when old, too
    assert ledger.sighted(FINDING, VM, "ping-1", NOW + timedelta(seconds=12), count=False) is None
    assert _event(cluster)["metadata"]["resourceVersion"] == event["metadata"]["resourceVersion"]


def test_the_event_is_named_from_the_identity_and_replies_follow_the_schema(ledger):
    notice = ledger.sighted(FINDING, VM, "ce-1", NOW)
    assert notice is not None
    assert notice.record.name == event_name(VM, FINDING)
    reply = notice.reply()
    assert reply.type == "io.vmevents.device-conflict.detected"
    assert {"function", "category", "subject", "key", "identity", "severity", "summary", "advice", "details",
            "state", "episode", "count", "openedAt", "resolvedAt"} <= set(reply.data)
    done = report(FINDING)
    both = one_or_summary("device-conflict", "/vmevents/device-conflict", [reply, done], "two")
    assert both is not None and both.type == "io.vmevents.device-conflict.batch"
    assert [f["id"] for f in both.data["findings"]] == [reply.id, done.id]
    assert one_or_summary("device-conflict", "/x", [reply], "one") is reply


def test_a_record_sighted_after_it_was_read_is_not_resolved_by_the_reader():
    """A re-scan reads the record, then the state it judges it by; an event that sees the finding in between
    (its patch moves the record on) was looking later than that state: the re-scan's resolution gives up, and
    the next one decides again. A renewal alone is no sighting: a resolution over it goes ahead."""
    with SimCluster() as cluster:
        ledger = Ledger(Kube(cluster.api_client(service_account="vmevents/device-conflict")), "device-conflict",
                        renew_after=timedelta(seconds=10), reason="HostDeviceConflict")
        ledger.sighted(FINDING, VM, "ce-1", NOW)
        [read] = ledger.records()
        assert ledger.sighted(FINDING, VM, "ce-2", NOW + timedelta(seconds=1)) is None  # seen again meanwhile
        assert ledger.resolve(read, "ping-1", NOW + timedelta(seconds=2)) is None
        [still] = ledger.records()
        assert still.open and still.count == 2
        assert ledger.renew_stale([still], NOW + timedelta(minutes=5)) == 1  # someone renewed it meanwhile
        ended = ledger.resolve(still, "ping-2", NOW + timedelta(minutes=6))
        assert ended is not None and ended.transition == RESOLVED


def test_a_sighting_does_not_reopen_what_was_resolved_after_it_read_the_record(ledger):
    """A delivery reads the finding's record, then the state (the finding is there), is slowed before it writes
    (its API server waiting for etcd), and meanwhile a later look resolves the episode: the slow sighting does not
    reopen it, for the resolution may rest on the later look (the fault suite saw detected, resolved, detected,
    resolved). The record's resourceVersion says so, whatever the clocks say: here the slow delivery's clock is a
    minute ahead. A sighting that read the record after the resolution opens the next episode as before."""
    ledger.sighted(FINDING, VM, "ce-1", NOW)
    [record] = ledger.records()
    ledger.resolve(record, "ping-2", NOW + timedelta(seconds=5))
    ahead = NOW + timedelta(minutes=1)
    assert ledger.sighted(FINDING, VM, "ce-slow", ahead, read=record.resource_version) is None
    assert ledger.sighted(FINDING, VM, "ce-slower", ahead, read="") is None  # read before it existed
    assert list(ledger.records()) == [], "still resolved"
    [resolved] = ledger.records(state=None)
    reopened = ledger.sighted(FINDING, VM, "ce-3", ahead, read=resolved.resource_version)
    assert reopened is not None and reopened.transition == DETECTED and reopened.record.episode == 2

"""Kubernetes Events are deduplicated by count, and no count is lost when deliveries race."""
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from shared.kube import Kube
from shared.recorder import Recorder
from simcluster.apiserver import SimCluster

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
VM = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
      "metadata": {"name": "vm1", "namespace": "default", "uid": "u-1"}}


def test_racing_recorders_lose_no_count():
    with SimCluster() as cluster:
        recorders = [Recorder(Kube(cluster.api_client(service_account="vmevents/vmi-cleanup")), "vmi-cleanup")
                     for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            for _ in pool.map(lambda r: [r.record(VM, "Warning", "Test", "the same thing", NOW) for _i in range(5)],
                              recorders):
                pass
        [event] = cluster.list("v1", "Event", "default")
        assert event["count"] == 20 and event["reason"] == "Test"


def test_a_different_message_is_another_event():
    with SimCluster() as cluster:
        recorder = Recorder(Kube(cluster.api_client(service_account="vmevents/vmi-cleanup")), "vmi-cleanup")
        recorder.record(VM, "Normal", "Test", "one thing", NOW)
        recorder.record(VM, "Normal", "Test", "another thing", NOW)
        assert sorted(e["message"] for e in cluster.list("v1", "Event", "default")) == ["another thing", "one thing"]


def test_a_transition_is_recorded_once_even_when_deliveries_race():
    """record_once: exactly one racer records the Event (None); every other gets that Event back, uncounted."""
    with SimCluster() as cluster:
        recorders = [Recorder(Kube(cluster.api_client(service_account="vmevents/io-pause-report")), "io-pause-report")
                     for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda r: r.record_once(VM, "Normal", "Resolved", "it ended", NOW,
                                                            annotations={"by": str(id(r))}), recorders))
        assert results.count(None) == 1
        [event] = cluster.list("v1", "Event", "default")
        assert event["count"] == 1
        assert all(r["metadata"]["uid"] == event["metadata"]["uid"] for r in results if r is not None)
        winner = recorders[results.index(None)]
        assert event["metadata"]["annotations"] == {"by": str(id(winner))}


def test_counted_once_for_a_thing_even_when_deliveries_race():
    """record(once_for=…): racers reporting the same act (the same VMI) count the Event once, and exactly one of them
    is told it recorded it; another thing (the VM's next VMI) has an Event of its own, found by what it is for."""
    with SimCluster() as cluster:
        recorders = [Recorder(Kube(cluster.api_client(service_account="vmevents/vmi-cleanup")), "vmi-cleanup")
                     for _ in range(4)]
        recorders[0].record(VM, "Normal", "Cleaned", "the same words", NOW, once_for="vmi-uid-0")  # an earlier one
        with ThreadPoolExecutor(4) as pool:
            told = list(pool.map(lambda r: r.record(VM, "Normal", "Cleaned", "the same words", NOW,
                                                    once_for="vmi-uid-1"), recorders))
        assert told.count(True) == 1
        events = {e["metadata"]["annotations"]["vmevents.io/counted-for"]: e
                  for e in cluster.list("v1", "Event", "default")}
        assert sorted(events) == ["vmi-uid-0", "vmi-uid-1"] and all(e["count"] == 1 for e in events.values())
        assert recorders[1].record(VM, "Normal", "Cleaned", "other words", NOW, once_for="vmi-uid-2") is True
        found = recorders[2].recorded_once("default", VM["metadata"]["name"], "Normal", "Cleaned", "vmi-uid-2")
        assert found is not None and found["message"] == "other words"
        assert recorders[2].recorded_once("default", VM["metadata"]["name"], "Normal", "Cleaned", "vmi-uid-9") is None

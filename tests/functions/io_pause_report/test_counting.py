"""A pause is counted once (issue 26): whatever the number of failing volumes (one IOerror Event per volume per
pause, docs/facts.md §5), and whatever the number of deliveries that see it at once (a redelivery, the tick
beside the event). io-pause-report's own handler, with its ServiceAccount's credentials, on the simulator and
on a real kube-apiserver alike: the races are real requests against real resourceVersion preconditions."""
from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime

import pytest

from functions.io_pause_report import handler
from functions.io_pause_report.settings import Settings
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.io_pause import kubevirt_event, make_vmi
from tests import backends

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
SA = "vmevents/io-pause-report"
RACERS = 4
_names = itertools.count(1)


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    yield c
    c.stop()


def context(cluster) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    return KubeContext("io-pause-report", Settings(), lambda: NOW, kube, Recorder(kube, "io-pause-report"))


def paused_vmi(cluster) -> dict:
    """A VMI paused on an IO error whose two disks are not PVCs (so the handler reads no storage)."""
    name = f"count{next(_names)}"
    vmi = make_vmi(name, vm_uid=None, volumes=[{"name": "disk-0", "containerDisk": {"image": "x"}},
                                               {"name": "disk-1", "containerDisk": {"image": "y"}}])
    vmi["metadata"] = {k: v for k, v in vmi["metadata"].items() if k not in ("uid", "resourceVersion")}
    return cluster.create(vmi)


def io_errors(cluster, vmi: dict, count: int) -> list[dict]:
    """KubeVirt's IOerror Events: one per failing volume, each counting `count` pauses."""
    return [cluster.create(kubevirt_event(vmi, volume=v, count=count, last=NOW)) for v in ("disk-0", "disk-1")]


def recount(cluster, events: list[dict], count: int) -> None:
    for event in events:
        cluster.patch("v1", "Event", "default", event["metadata"]["name"], {"count": count})


def episode(cluster, vmi: dict) -> dict:
    [found] = [e for e in cluster.list("v1", "Event", "default")
               if e["involvedObject"]["name"] == vmi["metadata"]["name"] and e["reason"] == "IOErrorPause"]
    return found


def race(vmi: dict, contexts: list[KubeContext], deliveries: list[str]) -> list:
    """Every context converges the same VMI at the same moment, each as its own delivery."""
    target = handler.Target("default", vmi["metadata"]["name"])
    start, outcomes = threading.Barrier(len(contexts)), [None] * len(contexts)

    def one(i: int) -> None:
        start.wait()
        outcomes[i] = handler.converge(target, contexts[i], deliveries[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(contexts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_two_failing_volumes_are_one_pause_not_two(cluster):
    vmi = paused_vmi(cluster)
    events = io_errors(cluster, vmi, 1)
    outcome = handler.converge(handler.Target("default", vmi["metadata"]["name"]), context(cluster), "ce-1")
    assert outcome.reply is not None and outcome.reply.type == "io.vmevents.io-pause-report.detected"
    assert episode(cluster, vmi)["count"] == 1
    recount(cluster, events, 3)  # two more pauses, each on both disks
    handler.converge(handler.Target("default", vmi["metadata"]["name"]), context(cluster), "ce-2")
    assert episode(cluster, vmi)["count"] == 3, "three pauses, not six"


def test_concurrent_deliveries_of_one_pause_open_it_once_and_count_it_once(cluster):
    vmi = paused_vmi(cluster)
    io_errors(cluster, vmi, 1)
    contexts = [context(cluster) for _ in range(RACERS)]
    outcomes = race(vmi, contexts, [f"first-{i}" for i in range(RACERS)])
    assert sum(o.reply is not None for o in outcomes) == 1, [o.effect for o in outcomes]
    assert episode(cluster, vmi)["count"] == 1, "one pause, however many deliveries saw it"


def test_concurrent_deliveries_of_a_later_pause_count_it_once(cluster):
    vmi = paused_vmi(cluster)
    events = io_errors(cluster, vmi, 1)
    handler.converge(handler.Target("default", vmi["metadata"]["name"]), context(cluster), "ce-open")
    recount(cluster, events, 2)  # the second pause
    outcomes = race(vmi, [context(cluster) for _ in range(RACERS)], [f"second-{i}" for i in range(RACERS)])
    # A racer that reads the finding after another counted the pause finds nothing new (hold): both are right.
    verdicts = [o.verdict for o in outcomes]
    assert all(o.reply is None for o in outcomes) and "count" in verdicts and set(verdicts) <= {"count", "hold"}
    assert episode(cluster, vmi)["count"] == 2, "pause 2 of the episode, counted once"

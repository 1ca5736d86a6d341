"""No finding opened during a re-scan is resolved by it (issue 26), on both backends: a full repair whose LISTs
are slow (the VMI LIST's answer held back until the other actor is done, so its view of the VMs is older than
what happens meanwhile), and in the middle an event that opens a conflict, or an overlapping tick (a redelivery
after the delivery timeout) that opens it. The slow repair must not resolve it: no `.resolved` notice, and the
finding stays open. Its own module: only the API server and the function's handler, with its ServiceAccount."""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from functions.device_conflict import handler
from functions.device_conflict.settings import FUNCTION, Settings
from shared.kinds import VMI
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.devices import VF, host_device, seed_vm1
from tests import backends
from tests.functions.device_conflict.test_parameter_object import SA

pytestmark = pytest.mark.e2e
_names = itertools.count(1)


class HeldBack:
    """The function's client, whose first VMI LIST is read whole and then held until `go` is set: a repair
    whose paginated LISTs take long, its view of the cluster fixed when they were read."""

    def __init__(self, kube: Kube):
        self._kube = kube
        self.read, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def list(self, kind, *args, **kwargs):
        items = list(self._kube.list(kind, *args, **kwargs))
        if kind is VMI and not self.read.is_set():
            self.read.set()
            assert self.go.wait(60), "the test never let the repair go on"
        return iter(items)


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    found = backends.cluster(request.param, "1.3.1")
    yield found
    found.stop()


def stopped_vm(name: str, device: str) -> dict:
    manifest = seed_vm1(name, host_devices=[host_device(device, VF)])
    manifest["spec"]["runStrategy"] = "Halted"
    return manifest


def context(kube) -> KubeContext[Settings]:
    return KubeContext(function=FUNCTION, settings=Settings(), clock=lambda: datetime.now(UTC), kube=kube,
                       recorder=Recorder(kube, FUNCTION))


def states(outcome) -> list[str]:
    data = outcome.reply.data if outcome.reply is not None else {}
    return [f["state"] for f in data.get("findings", [data] if data.get("state") else [])]


@pytest.mark.parametrize("other", ["an event", "an overlapping tick"])
def test_a_conflict_opened_during_a_slow_repair_is_not_resolved_by_it(cluster, other):
    kube = Kube(cluster.api_client(service_account=SA))
    n = next(_names)
    device = f"harvester-ktmg4-0000{n:05d}"
    first, second = f"race-a{n}", f"race-b{n}"
    cluster.create(stopped_vm(first, device))
    handler.repair(context(kube), f"ping-{n}-0", None)  # the parameter object: the device is assigned to `first`
    slow = HeldBack(kube)
    with ThreadPoolExecutor(1) as pool:
        repairing = pool.submit(handler.repair, context(cast(Kube, slow)), f"ping-{n}-1", None)
        assert slow.read.wait(60), "the repair read its LISTs"
        try:
            opened = _meanwhile(cluster, kube, other, n, second, device)
        finally:
            slow.go.set()
        late = repairing.result(timeout=60)
    assert "detected" in states(opened), opened.reason
    assert "resolved" not in states(late), f"the slow repair resolved what opened after it read: {late.reason}"
    events = [e for e in cluster.list("v1", "Event", "default")
              if (e["metadata"].get("labels") or {}).get("vmevents.io/finding") == FUNCTION
              and e["involvedObject"]["name"] in (first, second)]
    assert [(e["metadata"]["labels"]["vmevents.io/finding-state"]) for e in events] == ["open"]


def _meanwhile(cluster, kube, other, n, second, device):
    """A second stopped VM names the same device: a double-assigned conflict, opened by its event (or by a tick
    that started later and read the cluster as it is now)."""
    cluster.create(stopped_vm(second, device))
    if other == "an event":
        return handler.check(handler.Target("default", second), None, context(kube), f"add-{second}")
    return handler.repair(context(kube), f"ping-{n}-2", None)

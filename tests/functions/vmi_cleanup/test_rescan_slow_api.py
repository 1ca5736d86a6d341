"""vmi-cleanup's re-scan against a slow API and an object that fails (issue 14): 5,000 VMIs, every request
delayed 2 s; each re-scan answers before the Trigger's delivery timeout, says how far it got, and later ticks
finish the work with nothing skipped; one VMI's failure stops no other."""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from functions.vmi_cleanup.handler import rescan
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared import rescan as rescans
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.apiserver import SimCluster
from simcluster.builders.kubevirt import make_vm, make_vmi

pytestmark = pytest.mark.timeout(600)
NOW = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
SA = "vmevents/vmi-cleanup"
VMIS, DUE, DELAY = 5000, 24, 2.0


@pytest.fixture
def cluster():
    c = SimCluster(kubevirt_version="1.3.1").start()
    yield c
    c.stop()


def stored(obj: dict) -> dict:
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion")}
    obj.pop("status", None) if obj["kind"] == "VirtualMachine" else None
    return obj


def fill(cluster, due: int, running: int) -> list[str]:
    names = []
    for i in range(due):
        vm = cluster.create(stored(make_vm(f"due{i:02d}", run_strategy="Manual")))
        cluster.create(stored(make_vmi(f"due{i:02d}", owner=vm, finished=NOW - timedelta(hours=1))))
        names.append(f"due{i:02d}")
    for i in range(running):
        cluster.create(stored(make_vmi(f"run{i:04d}", phase="Running", finished=None)))
    return names


def context(cluster, minute: int, budget: float = 20.0) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    settings = Settings(namespaces=frozenset({"default"}),
                        rescan=rescans.Settings(budget=timedelta(seconds=budget), workers=8))
    return KubeContext(FUNCTION, settings, lambda: NOW + timedelta(minutes=minute), kube, Recorder(kube, FUNCTION))


def left(cluster, names) -> set[str]:
    return {n for n in names if cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", n) is not None}


def test_a_rescan_of_5000_vmis_with_every_request_delayed_2s_answers_in_time_and_ticks_finish(cluster):
    names = fill(cluster, DUE, VMIS - DUE)
    cluster.faults.add(kind="latency", delay=DELAY, service_account=SA, times=None)
    ticks, remaining = [], [len(names)]
    for minute in range(8):
        began = time.monotonic()
        outcome = rescan(context(cluster, minute))
        took = time.monotonic() - began
        ticks.append((round(took, 1), outcome.reason))
        assert took < rescans.DELIVERY_TIMEOUT.total_seconds(), f"tick {minute} took {took:.1f} s: {outcome.reason}"
        assert f"scanned {VMIS - (DUE - remaining[-1])} VMI(s)" in outcome.reason  # all but those cleaned up
        remaining.append(len(left(cluster, names)))
        assert remaining[-1] < remaining[-2] or remaining[-1] == 0, ticks  # every tick makes progress
        if remaining[-1] == 0:
            break
    assert remaining[-1] == 0, ticks
    assert len(ticks) >= 2 and "stopped at the re-scan budget" in ticks[0][1], ticks
    print("\nticks (s, reason):", *ticks, sep="\n  ")  # the figures for the note (pytest -s)


def test_one_vmi_that_fails_stops_no_other_and_is_retried_next_tick(cluster):
    names = fill(cluster, 4, 3)
    fault = cluster.faults.add(method="GET", path="/virtualmachineinstances/due01$", service_account=SA,
                               status=500, times=None)
    outcome = rescan(context(cluster, 0))
    assert left(cluster, names) == {"due01"}
    assert "1 failed, retried next tick (default/due01:" in outcome.reason
    assert {c["details"]["vmi"] for c in outcome.reply.data["findings"]} == {"default/due00", "default/due02",
                                                                             "default/due03"}
    assert fault.hits >= 1
    cluster.faults.clear()
    again = rescan(context(cluster, 1))
    assert left(cluster, names) == set() and "failed" not in again.reason
    assert [c["details"]["vmi"] for c in again.reply.data["findings"]] == ["default/due01"]

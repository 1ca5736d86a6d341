"""A burst on the real backend (issue 23): a node is lost and BURST VMIs on it go Failed at once. Through the real
path (kube-apiserver, Knative's ApiServerSource adapter, the broker, vmi-cleanup with CLEANUP_FAILED=true, its
requests through the fault proxy) every one is handled, within BURST_BOUND; the API load stays bounded; the first
THROTTLED deletes are answered 429 with Retry-After, which vmi-cleanup hands to the broker; no notice is doubled,
and the VMIs on the node that stayed are not touched.

The bounds, and why: vmi-cleanup handles one event per functions-framework thread (gunicorn `threads`, 4 per CPU:
8 here) and each handler makes its requests one after another, so at most FUNCTION_THREADS requests are in flight
at once, whatever the burst's size (no tick runs during it: a re-scan would add up to RESCAN_WORKERS of its own).
What an event wave leaves (an event the broker dead-lettered after its retries, here the 429s can do that) the
next PingSource tick catches. BURST_BOUND is generous for a loaded 2-core machine; the measured times are printed.
"""
from __future__ import annotations

import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from simcluster.builders.kubevirt import make_vmi, stamp
from tests import backends, e2e
from tests.faults.test_restarts import notices
from tests.functions.vmi_cleanup.test_e2e import FUNCTION_SA
from tests.functions.vmi_cleanup.test_e2e import World as CleanupWorld

pytestmark = [pytest.mark.e2e, pytest.mark.real,
              pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                 reason=f"real control plane: {backends.real_missing()}")]
BURST = int(os.environ.get("VMEVENTS_BURST", "1000"))
STAYED = 20
THROTTLED, RETRY_AFTER = 30, 1
BURST_BOUND = 480.0
FUNCTION_THREADS = (os.cpu_count() or 1) * 4  # functions-framework's gunicorn default (_http/gunicorn.py)
_names = itertools.count(1)


class World(CleanupWorld):
    settle = e2e.World.settle
    through_knative = False  # the session's plane, LocalKnative's broker: the stored VMIs are the load here

    def __init__(self):
        # VMIs written as stored objects (no VM, no launcher pod): no KubeVirt may act on them, the real
        # virt-controller included (it would fail a Running VMI that has no pod).
        e2e.World.__init__(self, "1.3.1", backend=backends.REAL, kubevirt=None,
                           cluster=backends.cluster(backends.REAL, "1.3.1", virt_controller=False),
                           env_overrides={"vmi-cleanup": {"CLEANUP_AFTER": "0s", "CLEANUP_FAILED": "true"}})


@pytest.fixture(scope="module")
def world():
    with World() as w:
        yield w


def running_vmi(name: str, node: str) -> dict:
    vmi = make_vmi(name, phase="Running", finished=None)
    vmi["metadata"].pop("uid")
    vmi["status"].update(nodeName=node)
    return vmi


def node_lost(vmi: dict, now: datetime) -> dict:
    """What KubeVirt writes when the node of a running VMI is gone: phase Failed, with its transition time."""
    status = vmi["status"]
    return {"status": {"phase": "Failed", "reason": "NodeUnresponsive", "phaseTransitionTimestamps": [
        *status["phaseTransitionTimestamps"], {"phase": "Failed", "phaseTransitionTimestamp": stamp(now)}]}}


@pytest.mark.timeout(1200)
def test_a_node_loss_leaving_a_thousand_vmis_failed_at_once(world):
    w = world
    proxy = w.cluster.proxy
    lost = [f"lost{next(_names):04d}" for _ in range(BURST)]
    stayed = [f"stayed{next(_names):04d}" for _ in range(STAYED)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        created = dict(zip(lost + stayed, pool.map(
            lambda name: w.cluster.create(running_vmi(name, "node-a" if name in lost else "node-b")),
            lost + stayed), strict=True))
    w.settle()
    w.knative.wait_idle(timeout=120)
    proxy.clear()
    throttle = w.cluster.faults.add(method="DELETE", path="/virtualmachineinstances/lost", service_account=FUNCTION_SA,
                                    status=429, retry_after=RETRY_AFTER, times=THROTTLED)
    started = time.monotonic()
    now = datetime.now(UTC)
    with ThreadPoolExecutor(max_workers=8) as pool:  # the node's VMIs all turn Failed within a second or two
        list(pool.map(lambda name: w.cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", name,
                                                    node_lost(created[name], now)), lost))

    def gone() -> int:
        names = {v["metadata"]["name"] for v in w.cluster.list("kubevirt.io/v1", "VirtualMachineInstance", "default")}
        return sum(1 for name in lost if name not in names)

    w.knative.wait_idle(timeout=BURST_BOUND)  # the wave of events, with the broker's retries
    by_events, wave = gone(), time.monotonic() - started
    ticks = 0
    while gone() < BURST and time.monotonic() - started < BURST_BOUND:  # what was dead-lettered: the minute's tick
        w.knative.ping.tick()
        ticks += 1
        w.knative.wait_idle(timeout=BURST_BOUND)
    took, handled = time.monotonic() - started, gone()

    records = [r for r in proxy.records if r.identity == FUNCTION_SA]
    throttled = [r for r in records if r.status == 429]
    cleaned = notices(w)
    duplicates = len(cleaned) - len(set(cleaned))
    handed_on = [d for d in w.knative.broker.deliveries if d.status == 503 and d.retry_after == str(RETRY_AFTER)]
    touched = [r for r in records if r.method in ("DELETE", "PATCH", "PUT") and "/stayed" in r.path]
    print(f"\n[faults] burst: {BURST} VMIs Failed at once (node loss), {THROTTLED} deletes answered 429 "
          f"Retry-After {RETRY_AFTER}; {by_events} handled from their events in {wave:.1f} s, {handled} in all after "
          f"{ticks} re-scan tick(s), {took:.1f} s; vmi-cleanup's requests {len(records)}, "
          f"peak in flight {proxy.peak(FUNCTION_SA)} (bound {FUNCTION_THREADS}), all callers' peak {proxy.peak()}; "
          f"429s {len(throttled)}, answered 503 with Retry-After {len(handed_on)}; duplicate notices {duplicates}; "
          f"wrong writes {len(touched)}")
    assert handled == BURST, f"{BURST - handled} of {BURST} VMIs left after {took:.0f} s"
    assert throttle.hits == THROTTLED and len(throttled) == THROTTLED
    assert len(handed_on) >= THROTTLED, "each 429 reached the broker as a 503 with the server's Retry-After"
    assert proxy.peak(FUNCTION_SA) <= FUNCTION_THREADS
    assert sorted(cleaned) == sorted(f"default/{name}" for name in lost), "one notice per VMI, none missing"
    assert not touched
    for name in stayed:
        vmi = w.vmi(name)
        assert vmi and vmi["metadata"]["uid"] == created[name]["metadata"]["uid"]
        assert vmi["status"]["phase"] == "Running"

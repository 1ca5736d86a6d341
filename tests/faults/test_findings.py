"""A finding's whole episode across outages on the real backend (issue 23): opened while kube-apiserver is killed and
started again, resolved while etcd is down for longer than the functions' client timeouts, each announced exactly
once. tests/faults/test_restarts.py shows the same for vmi-cleanup's notices, which have no `.resolved`.

The producer is vm-stuck-report with its e2e world (KubeVirt's own virt-controller writes the VM's printableStatus;
the node stand-in schedules), on a VM that cannot be scheduled for memory. While the API server or etcd is away,
the re-scan ticks fail and the broker gives up on them (the dead letter); the next ticks after recovery carry the
episode on. Afterwards: one `.detected` and one `.resolved` notice, the VMStuck Event as reported beside one
VMStuckResolved, and the VM Running — with the `[faults]` line giving what was injected and how long each half
took to converge.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

from simcluster.builders import stuck as b
from tests import backends
from tests.e2e import eventually
from tests.faults.test_restarts import CLIENT_READ_TIMEOUT, CONVERGE_BOUND, plane, virt_controller_exits
from tests.functions.vm_stuck_report.test_e2e import AFTER, nodes  # noqa: F401 - `nodes` is a fixture
from tests.functions.vm_stuck_report.test_e2e import World as StuckWorld

pytestmark = [pytest.mark.e2e, pytest.mark.real,
              # An outage can leave a test-side TLS connection (the fault proxy's, the node stand-in's, a client's)
              # to be closed by the garbage collector, whose warning would land in whichever test runs then. What
              # these tests assert is the functions' behaviour, in processes of their own; the leak is listed to fix.
              pytest.mark.filterwarnings(
                  "ignore:Exception ignored in. <ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                 reason=f"real control plane: {backends.real_missing()}")]


class World(StuckWorld):
    # the outages stop the session plane's kube-apiserver and etcd; LocalKnative's broker with Knative's adapter
    # (Knative's own data plane restarted mid-story: tests/controlplane/test_knative_story.py)
    through_knative = False


@pytest.fixture(scope="module")
def world():
    with World("1.3.1", backends.REAL) as w:
        yield w


def _ticking(w, stop: threading.Event) -> threading.Thread:
    """The PingSource's ticks, once a second, while an outage lasts: each re-scan fails and is dead-lettered."""
    def run():
        while not stop.is_set():
            try:
                w.knative.ping.tick()
            except Exception:  # noqa: BLE001 - a tick that cannot be delivered is the point
                pass
            stop.wait(1.0)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until(w, predicate, what: str, recovered: float) -> float:
    """Tick once a second until `predicate()` holds; the seconds from `recovered`."""
    deadline = recovered + CONVERGE_BOUND
    while not predicate():
        assert time.monotonic() < deadline, f"not converged {CONVERGE_BOUND:.0f} s after recovery: {what}"
        w.knative.ping.tick()
        time.sleep(1.0)
    return time.monotonic() - recovered


@pytest.mark.timeout(600)
def test_a_finding_opened_across_a_kube_apiserver_crash_and_resolved_across_an_etcd_outage(world, nodes):  # noqa: F811
    w = world
    exits_before = len(virt_controller_exits(w))
    nodes(b.node("fault-a", allocatable={"cpu": "8", "memory": "4Gi", "pods": "110"}))
    name = w.create_vm(memory="16Gi")
    w.wait_status(name, "ErrorUnschedulable")
    time.sleep(AFTER + 1)  # past the threshold: the next tick that gets through reports it

    # -- opened: kube-apiserver SIGKILLed while the ticks run, started 3 s later
    stop = threading.Event()
    ticks = _ticking(w, stop)
    plane().stop_process("kube-apiserver", signal.SIGKILL)
    time.sleep(3)
    plane().start_process("kube-apiserver")
    stop.set()
    ticks.join()
    opened = time.monotonic()
    detected_after = _until(w, lambda: w.notices(name), "no .detected notice", opened)
    w.tick()
    w.tick()

    # -- resolved: the cause removed, then etcd down past the client timeouts while the ticks run
    w.node_status("fault-a", {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}})
    stop = threading.Event()
    ticks = _ticking(w, stop)
    plane().stop_process("etcd", signal.SIGTERM)
    time.sleep(CLIENT_READ_TIMEOUT + 5)
    plane().start_process("etcd")
    stop.set()
    ticks.join()
    recovered = time.monotonic()
    eventually(lambda: w.status(name) == "Running", timeout=CONVERGE_BOUND, what=f"VM {name} Running")
    resolved_after = _until(w, lambda: w.notices(name, "resolved"), "no .resolved notice", recovered)
    w.tick()
    w.tick()

    detected, resolved = w.notices(name), w.notices(name, "resolved")
    events = w.events(name)
    exits = virt_controller_exits(w)[exits_before:]
    # the ticks the outages failed: the function's 503s (and their retries), as the broker saw them
    failed = [d for d in w.knative.broker.deliveries
              if d.trigger == "vm-stuck-report" and (d.status is None or d.status >= 500)]
    print(f"\n[faults] a finding across outages: kube-apiserver SIGKILLed and started 3 s later while the VM was "
          f"past its threshold, etcd stopped {CLIENT_READ_TIMEOUT + 5:.0f} s after its cause was removed; "
          f".detected {len(detected)} ({detected_after:.1f} s after the API server was back), .resolved "
          f"{len(resolved)} ({resolved_after:.1f} s after etcd was back), Events {len(events)}, deliveries the "
          f"outages failed {len(failed)}; virt-controller "
          + (f"exited {len(exits)} time(s), each restarted" if exits else "ran throughout"))
    assert failed, "the outages failed no tick: nothing was shown"
    story = [(n["state"], n.get("episode"), {k: n.get("details", {}).get(k)
                                             for k in ("state", "since", "cause", "checked", "because")})
             for n in detected + resolved]
    assert len(detected) == 1, story
    assert len(resolved) == 1, story
    assert detected[0]["key"] == resolved[0]["key"]
    # the episode as reported, and its end in a row of its own, once (docs/findings.md, "What kubectl describe shows")
    stuck, end = sorted(events, key=lambda e: e["reason"])
    assert (stuck["reason"], stuck["type"]) == ("VMStuck", "Warning")
    assert (end["reason"], end["type"], end["count"]) == ("VMStuckResolved", "Normal", 1)

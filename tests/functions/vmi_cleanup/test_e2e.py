"""vmi-cleanup end to end: simulated API server and KubeVirt, the local broker routing by the
Trigger in deploy/, the ApiServerSource and PingSource stand-ins, and the function running as a
real functions-framework HTTP server with the credentials of its own ServiceAccount.

Each KubeVirt version gets one world (starting servers costs seconds); tests use their own VM
names so they do not see each other.
"""
from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from functions.vmi_cleanup.handler import rescan
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.kubevirt import make_vmi
from simcluster.play import virtctl_start
from tests import backends, e2e
from tests.e2e import eventually, kubevirt_versions
from tests.rbac import assert_exact_rbac

pytestmark = pytest.mark.e2e
FUNCTION_SA = "vmevents/vmi-cleanup"
SOURCE_SA = "vmevents/vmevents-source"
_names = itertools.count(1)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    function_sa = FUNCTION_SA
    settle = e2e.World.settle_with_kubevirt

    def __init__(self, version: str, backend: str, virt_controller: bool = True):
        """virt_controller=False: on the real backend the simulator's KubeVirt plays virt-controller too."""
        cluster = None if virt_controller else backends.cluster(backend, version, virt_controller=False,
                                                                knative=True)
        super().__init__(version, backend=backend, kubevirt={"step_delay": 0.01}, cluster=cluster,
                         env_overrides={"vmi-cleanup": {"CLEANUP_AFTER": "0s"}})

    # -- helpers ------------------------------------------------------------------------------
    def vm(self, run_strategy="Manual", annotations=None, namespace="default"):
        name = f"vm{next(_names)}"
        vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
              "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
              "spec": {"runStrategy": run_strategy, "template": {
                  "metadata": {"labels": {"harvesterhci.io/vmName": name}},
                  "spec": {"domain": {"devices": {}, "memory": {"guest": "1948Mi"},
                                      "resources": {"requests": {"memory": "1365Mi"}}}}}}}
        self.cluster.create(vm)
        if run_strategy != "Halted" and run_strategy != "Manual":
            self.wait_phase(namespace, name, "Running")
        return name

    def start_manual(self, name, namespace="default"):
        virtctl_start(self.cluster, namespace, name)

    def vm_obj(self, name, namespace="default"):
        return self.cluster.get("kubevirt.io/v1", "VirtualMachine", namespace, name)

    def wait_phase(self, namespace, name, phase):
        return self.wait_vmi_phase(name, phase, namespace)

    def power_off(self, name, namespace="default"):
        """The guest runs `poweroff`; returns the VMI's uid at that moment."""
        uid = self.wait_phase(namespace, name, "Running")["metadata"]["uid"]
        self.kubevirt.guest_power_off(namespace, name)
        return uid

    def events(self, name, namespace="default"):
        """The Events vmi-cleanup recorded about this VM or VMI."""
        return [e for e in self.cluster.list("v1", "Event", namespace)
                if e["involvedObject"].get("name") == name and e["reason"].startswith(("VMICleanedUp", "VMICleanup"))]

    def replies(self, type_suffix):
        """The findings' details of the reply CloudEvents the function sent back into the broker."""
        return [e2e.data_of(e)["details"] for e in list(self.knative.broker.received)
                if e["type"] == f"io.vmevents.vmi-cleanup.{type_suffix}" and e["source"] == "/vmevents/vmi-cleanup"]


@pytest.fixture(scope="module", **kubevirt_versions("1.1.1", "1.3.1", "1.8.3"))
def world(request):
    with World(*request.param) as w:
        yield w


@pytest.fixture
def old_world(world):
    if world.cluster.kubevirt_version != "1.1.1":
        pytest.skip("this row is about KubeVirt < 1.2")
    return world


@pytest.fixture
def new_world(world):
    if world.cluster.kubevirt_version == "1.1.1":
        pytest.skip("this row is about KubeVirt >= 1.2")
    return world


def assert_not_restarted(w, name, old_uid):
    """No new VMI boots for this VM (KubeVirt would create one within a few resync periods)."""
    w.settle()
    time.sleep(0.3)
    w.settle()
    vmi = w.vmi(name)
    assert vmi is None or vmi["metadata"]["uid"] == old_uid and vmi["status"]["phase"] == "Succeeded", \
        f"VM {name} was started again"


# -- the promise: a guest that powered itself off is never booted again ------------------------------------
@pytest.mark.parametrize("strategy", ["Manual", "Once", "RerunOnFailure"])
def test_a_guest_power_off_ends_with_the_vm_stopped_and_no_new_vmi(world, strategy):
    """On the real backend KubeVirt's own virt-controller decides what follows (per version); whatever
    vmi-cleanup does (delete the VMI, halt the VM, or leave it to KubeVirt), no new guest boots. (Always is
    KubeVirt restarting by design: test_always_vm_is_left_to_kubevirt_which_restarts_it.)"""
    name = world.vm(strategy)
    if strategy == "Manual":
        world.start_manual(name)
    uid = world.power_off(name)
    eventually(lambda: world.vmi(name) is None, timeout=30, what="the Succeeded VMI gone")
    assert_not_restarted(world, name, uid)
    time.sleep(2.0)  # longer than KubeVirt takes to start a VMI it means to start
    assert world.vmi(name) is None, f"{strategy}: a new VMI booted after the guest powered off"
    eventually(lambda: (world.vm_obj(name).get("status") or {}).get("printableStatus") == "Stopped",
               what="the VM Stopped")


# -- the decision table, row by row, end to end --------------------------------------------------
def test_manual_vm_powered_off_its_vmi_is_deleted_and_the_vm_stays_off(world):
    name = world.vm("Manual")
    world.start_manual(name)
    uid = world.power_off(name)
    eventually(lambda: world.vmi(name) is None, what="VMI deleted")
    assert_not_restarted(world, name, uid)
    cleaned = [e for e in world.events(name) if e["reason"] == "VMICleanedUp"]
    assert len(cleaned) == 1 and cleaned[0]["involvedObject"]["kind"] == "VirtualMachine"
    assert f"Deleted VMI default/{name}" in cleaned[0]["message"]
    reply = [r for r in world.replies("cleaned") if r["vmi"] == f"default/{name}"]
    assert reply and reply[0] == {
        "vmi": f"default/{name}", "vm": f"default/{name}", "action": "deleted-vmi", "dryRun": False,
        "previousRunStrategy": "Manual", "reason": "runStrategy Manual: KubeVirt will not start it again"}
    assert world.vm_obj(name)["spec"]["runStrategy"] == "Manual"


def test_once_vm_is_halted_not_restarted(world):
    name = world.vm("Once")
    uid = world.power_off(name)
    eventually(lambda: world.vm_obj(name)["spec"]["runStrategy"] == "Halted", what="VM halted")
    vm = world.vm_obj(name)
    assert vm["metadata"]["annotations"]["vmevents.io/previous-run-strategy"] == "Once"
    eventually(lambda: world.vmi(name) is None, what="KubeVirt removes the VMI of a halted VM")
    assert_not_restarted(world, name, uid)


def test_rerun_on_failure_on_old_kubevirt_is_halted_not_restarted(old_world):
    w = old_world
    name = w.vm("RerunOnFailure")
    uid = w.power_off(name)
    eventually(lambda: w.vm_obj(name)["spec"]["runStrategy"] == "Halted", what="VM halted")
    eventually(lambda: w.vmi(name) is None, what="VMI removed")
    assert_not_restarted(w, name, uid)
    # Under load a second delivery can find the VM Halted and the VMI still there, and delete it (its reply may be
    # published first): the halt is what this row is about, in whatever order the replies came.
    eventually(lambda: [r for r in w.replies("cleaned") if r["vmi"] == f"default/{name}"
                        and r["action"] == "halted-vm" and r["previousRunStrategy"] == "RerunOnFailure"],
               what="the reply that the VM was halted")


def test_rerun_on_failure_on_new_kubevirt_is_left_to_kubevirt(new_world):
    w = new_world
    name = w.vm("RerunOnFailure")
    uid = w.power_off(name)
    eventually(lambda: w.vmi(name) is None, what="KubeVirt >= 1.2 removes the VMI itself")
    assert_not_restarted(w, name, uid)
    assert w.vm_obj(name)["spec"]["runStrategy"] == "RerunOnFailure"
    assert not [r for r in w.function_requests() if r.verb in ("delete", "patch") and r.name == name]


def test_always_vm_is_left_to_kubevirt_which_restarts_it(world):
    name = world.vm("Always")
    uid = world.power_off(name)
    eventually(lambda: (v := world.vmi(name)) and v["metadata"]["uid"] != uid, what="KubeVirt restarts it")
    world.settle()
    assert not [r for r in world.function_requests() if r.verb in ("delete", "patch") and r.name == name]
    assert not world.events(name)


@pytest.mark.one_kubevirt
def test_opted_out_vm_keeps_its_vmi_through_ticks(world):
    name = world.vm("Once", annotations={"vmevents.io/skip-cleanup": "true"})
    uid = world.power_off(name)
    world.settle()
    world.knative.ping.tick()
    world.settle()
    assert world.vmi(name)["metadata"]["uid"] == uid
    assert world.vm_obj(name)["spec"]["runStrategy"] == "Once"


@pytest.mark.one_kubevirt
def test_typo_in_the_opt_out_never_deletes_and_warns(world):
    name = world.vm("Manual", annotations={"vmevents.io/skip-cleanup": "ture"})
    world.start_manual(name)
    uid = world.power_off(name)
    warning = eventually(lambda: [e for e in world.events(name) if e["reason"] == "VMICleanupAnnotationInvalid"],
                         what="a Warning Event")
    assert warning[0]["type"] == "Warning" and "'ture'" in warning[0]["message"]
    world.settle()
    assert world.vmi(name)["metadata"]["uid"] == uid


@pytest.mark.one_kubevirt
def test_standalone_vmi_is_deleted(world):
    name = f"standalone{next(_names)}"
    world.cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                          "metadata": {"name": name, "namespace": "default"},
                          "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}})
    world.power_off(name)
    eventually(lambda: world.vmi(name) is None, what="standalone VMI deleted")


# -- never on the word of a payload ---------------------------------------------------------------
@pytest.mark.one_kubevirt
def test_a_forged_succeeded_event_for_a_running_vmi_changes_nothing(world):
    name = world.vm("Manual")
    world.start_manual(name)
    running = world.wait_phase("default", name, "Running")
    forged = make_vmi(name, phase="Succeeded", finished=datetime.now(UTC) - timedelta(days=1))
    forged["metadata"].update(uid=running["metadata"]["uid"], resourceVersion=running["metadata"]["resourceVersion"])
    before = len(world.function_requests())
    world.send(forged)
    world.settle()
    assert len(world.function_requests()) > before, "the function did look at the VMI"
    assert world.vmi(name)["status"]["phase"] == "Running"
    deletes = world.function_requests("delete")
    assert not deletes[before:] or all(r.name != name for r in deletes)


@pytest.mark.one_kubevirt
def test_duplicate_and_out_of_order_events_converge(world):
    name = world.vm("Manual")
    world.start_manual(name)
    running = world.wait_phase("default", name, "Running")
    world.kubevirt.guest_power_off("default", name)
    # At CLEANUP_AFTER=0s the function may delete the VMI before a poll sees it Succeeded (1 in CI's real runs):
    # the payloads are the source's own events.
    succeeded = world.announced_vmi(name, "Succeeded")
    for payload in (succeeded, succeeded, running, succeeded):  # a duplicate, then a late, stale "Running"
        world.send(payload)
    eventually(lambda: world.vmi(name) is None, what="VMI deleted")
    world.settle()
    deletes = [r for r in world.function_requests("delete") if r.name == name and r.status < 300]
    assert len(deletes) == 1
    cleaned = [e for e in world.events(name) if e["reason"] == "VMICleanedUp"]
    assert len(cleaned) == 1 and cleaned[0]["count"] == 1


@pytest.mark.one_kubevirt
@pytest.mark.parametrize("fault", [{"status": 503}, {"status": 429, "retry_after": 1}],
                         ids=["api-503", "api-429"])
def test_api_failures_answer_5xx_and_a_redelivery_finishes_the_job(world, fault):
    name = world.vm("Manual")
    world.start_manual(name)
    world.wait_phase("default", name, "Running")
    world.cluster.faults.add(method="GET", path=f"/virtualmachineinstances/{name}$",
                             service_account=FUNCTION_SA, times=2, **fault)
    world.kubevirt.guest_power_off("default", name)
    eventually(lambda: world.vmi(name) is None, what="VMI deleted after redelivery")
    # The VMI's update and its launcher pod's completion both lead the function to GET the VMI; whichever
    # arrives first meets the faults.
    statuses = [d.status for d in world.knative.broker.deliveries
                if d.subject and (d.subject.endswith(f"/virtualmachineinstances/{name}")
                                  or f"/pods/virt-launcher-{name}-" in d.subject)]
    assert any(s is not None and s >= 500 for s in statuses), statuses


@pytest.mark.one_kubevirt
def test_a_delete_whose_answer_is_lost_is_still_announced_once(world):
    """The DELETE reaches the API server and is applied, but its answer is cut off (an API server restarting): the
    function re-reads, finds this very VMI gone, and reports the cleanup; a redelivery would find nothing to say."""
    name = world.vm("Manual")
    world.start_manual(name)
    world.wait_phase("default", name, "Running")
    cut = world.cluster.faults.add(method="DELETE", path=f"/virtualmachineinstances/{name}$",
                                   service_account=FUNCTION_SA, kind="cut")
    world.kubevirt.guest_power_off("default", name)
    eventually(lambda: world.vmi(name) is None, what="VMI deleted")
    world.settle()
    assert cut.hits == 1
    assert [r["vmi"] for r in world.replies("cleaned")].count(f"default/{name}") == 1
    cleaned = [e for e in world.events(name) if e["reason"] == "VMICleanedUp"]
    assert len(cleaned) == 1 and cleaned[0]["count"] == 1


@pytest.fixture
def one_world(world):
    if world.cluster.kubevirt_version != "1.3.1":
        pytest.skip("this row is about the API server and the broker, not KubeVirt: one version is enough")
    return world


@pytest.mark.one_kubevirt
@pytest.mark.timeout(300)
def test_a_delete_applied_after_its_delivery_gave_up_is_announced_once_by_whoever_comes_next(one_world):
    """Issue 34: every DELETE of the VMI is held and never answered, and every re-read of it hangs (kube-apiserver
    holding them while etcd is away), longer than the client's timeouts. Each delivery answers 503 before the
    broker's 30 s are up, however long each call could last (each is given what is left: shared/deadline.py); before,
    the wait after a lost answer made three calls of up to 10 s each and answered after 31 s. Then the held DELETE
    is applied, after every delivery that sent one has answered: the next delivery finds the VMI gone, and the
    intent kept before the DELETE says whose it was, so the cleanup is announced, once. Before, nothing was."""
    w = one_world
    name = w.vm("Manual")
    w.start_manual(name)
    w.wait_phase("default", name, "Running")
    path = f"/virtualmachineinstances/{name}$"
    reads = []

    def held():  # the first DELETE seen: from now on every re-read of the VMI hangs too
        if not reads:
            reads.append(w.cluster.faults.add(method="GET", path=path, service_account=FUNCTION_SA, kind="latency",
                                              delay=12.0, times=None))

    held_deletes = w.cluster.faults.add(method="DELETE", path=path, service_account=FUNCTION_SA, kind="latency",
                                        delay=12.0, times=None, call=held)
    dropped = w.cluster.faults.add(method="DELETE", path=path, service_account=FUNCTION_SA, kind="drop", times=None)
    assert dropped is not None
    function = w.knative.functions["vmi-cleanup"]

    def answers():
        found = []
        for line in function.logs():
            about = f"virtualmachineinstances/{name}\"" in line or f"virt-launcher-{name}-" in line
            if line.startswith("{") and about:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return [a for a in found if a.get("function") == "vmi-cleanup"]

    w.kubevirt.guest_power_off("default", name)
    eventually(lambda: held_deletes.hits >= 1, timeout=30, what="vmi-cleanup's DELETE held")
    first = eventually(lambda: [a for a in answers() if a.get("outcome") == 503], timeout=60,
                       what="a delivery that sent the DELETE answered")
    assert w.vmi(name) is not None, "no DELETE went through"
    w.cluster.faults.clear()
    w.cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", name)  # the held DELETE, applied
    eventually(lambda: [r for r in w.replies("cleaned") if r["vmi"] == f"default/{name}"], timeout=90,
               what="the cleanup announced")
    w.settle()
    w.tick()
    notices = {e["id"] for e in list(w.knative.broker.received) if e["type"] == "io.vmevents.vmi-cleanup.cleaned"
               and e2e.data_of(e)["details"]["vmi"] == f"default/{name}"}
    assert len(notices) == 1, notices
    cleaned = [e for e in w.events(name) if e["reason"] == "VMICleanedUp"]
    assert len(cleaned) == 1 and cleaned[0]["count"] == 1, cleaned
    slow = [a for a in answers() if (a.get("duration_ms") or 0) >= 30_000]
    assert not slow, f"answered after the broker's 30 s: {slow}"
    assert first[0]["duration_ms"] < 30_000


@pytest.mark.one_kubevirt
def test_a_missed_event_is_caught_by_the_next_tick(world):
    name = world.vm("Manual")
    world.start_manual(name)
    world.wait_phase("default", name, "Running")
    # Every delivery about this VMI fails until the broker gives up and dead-letters it: missed.
    fault = world.cluster.faults.add(path=f"/virtualmachineinstances/{name}$", service_account=FUNCTION_SA,
                                     status=503, times=None)
    world.kubevirt.guest_power_off("default", name)
    world.settle()
    assert world.vmi(name) is not None
    assert any(d.dead_lettered for d in world.knative.broker.deliveries
               if d.subject and d.subject.endswith(f"/virtualmachineinstances/{name}"))
    world.cluster.faults.clear()
    world.knative.ping.tick()
    eventually(lambda: world.vmi(name) is None, what="VMI deleted by the re-scan")
    assert fault is not None


@pytest.mark.one_kubevirt
def test_the_delay_works_with_no_timer_in_memory(world):
    name = world.vm("Manual", annotations={"vmevents.io/cleanup-after": "1h"})
    world.start_manual(name)
    world.power_off(name)
    world.settle()
    assert world.vmi(name) is not None, "not due yet"
    world.kubevirt.set_phase_time("default", name, "Succeeded", datetime.now(UTC) - timedelta(hours=2))
    world.settle()  # that update itself is an event: due now
    world.knative.ping.tick()
    eventually(lambda: world.vmi(name) is None, what="VMI deleted once due")


@pytest.mark.one_kubevirt
def test_a_dry_run_tick_reads_back_what_its_events_reported(world):
    """The dry-run overlay's re-scan (functions/vmi_cleanup/memory.py; tests/functions/vmi_cleanup/
    test_dry_run_tick.py has its rows), run in-process with the function's ServiceAccount and a clock two hours
    ahead: the running function (CLEANUP_AFTER=0s, but this VMI says 1h) waits, the dry run finds it due."""
    name = world.vm("Manual", annotations={"vmevents.io/cleanup-after": "1h"})
    world.start_manual(name)
    world.power_off(name)
    world.settle()
    kube = Kube(world.cluster.api_client(service_account=FUNCTION_SA))
    ctx = KubeContext(FUNCTION, Settings(dry_run=True), lambda: datetime.now(UTC) + timedelta(hours=2), kube,
                      Recorder(kube, FUNCTION))
    first = rescan(ctx)
    assert f"default/{name}" in {f["details"]["vmi"] for f in first.reply.data["findings"]}
    second = rescan(ctx)
    assert f"default/{name}" not in {f["details"]["vmi"] for f in (second.reply.data["findings"]
                                                                  if second.reply else ())}, second.reason
    assert world.vmi(name) is not None


def test_the_function_needs_nothing_beyond_its_shipped_rbac(world):
    """Last in this module: by now every path has run. No request was denied, in any world; exactly the shipped
    permissions were used in the default version's, where every test ran (`one_kubevirt` ones too)."""
    world.settle()
    denied = [r for r in world.cluster.requests if r.service_account in (FUNCTION_SA, SOURCE_SA) and not r.allowed]
    assert not denied, denied
    if world.cluster.kubevirt_version == e2e.DEFAULT_KUBEVIRT:
        assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

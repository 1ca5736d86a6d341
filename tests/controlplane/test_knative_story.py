"""vmi-cleanup's story through Knative's own data plane (issue 21), and that data plane restarted mid-story (issue 23).

Everything between the cluster and the function is Knative's: deploy/ applied through Knative's webhooks
(tests/delivery.py `session_knative`), the ApiServerSource adapters Knative's controller deployed for deploy/'s
sources, the MT channel-based broker's ingress, the in-memory channel's dispatcher and the broker's filter, routing
by deploy/'s own Trigger, with its delivery and dead-letter sink. KubeVirt's virt-controller decides what becomes of
the VM; the node stand-in plays the node. The functions run locally as functions-framework servers with their own
ServiceAccounts' credentials, and the Serving stand-in (controlplane/knative.py `serve`) gives their Knative
Services the address where they run. A tap Trigger with no filter sees every event the broker takes in, the
functions' replies among them.

A guest powers itself off: its VMI is deleted by vmi-cleanup, announced by one `.cleaned` reply that the broker
took back in, and the VM stays stopped. Then the same with the broker's ingress, the channel's dispatcher and the
broker's filter each SIGKILLed (the kubelet stand-in starts each again) the moment a guest has powered off: every
episode is handled, no VM starts again, and none is announced twice.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import time
import uuid
from types import SimpleNamespace

import pytest

from localknative.runtime import load_manifests, of_kind
from localknative.serving import FunctionServer, service_account
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.paths import DEPLOY_DIR
from simcluster.play import virtctl_start
from tests import backends
from tests.delivery import Recorder, loads, session_knative
from tests.e2e import eventually

pytestmark = [pytest.mark.real, pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(backends.real_missing() is not None and not backends.in_ci(),
                                 reason=f"real control plane: {backends.real_missing()}")]
NAMESPACE = "vmevents"
SERVED = {"vmi-cleanup": {"CLEANUP_AFTER": "0s"}, "vmevents-dead-letter": {}}
CLEANED, SCANNED = "io.vmevents.vmi-cleanup.cleaned", "io.vmevents.vmi-cleanup.scanned"
DATA_PLANE = ("knative-eventing/mt-broker-ingress", "knative-eventing/imc-dispatcher",
              "knative-eventing/mt-broker-filter")
_names = itertools.count(1)


@pytest.fixture(scope="module")
def story():
    knative = session_knative()[2]
    # a world of its own on Knative's plane: deploy/ as it ships (an e2e world before it scaled its Triggers'
    # backoff and set its PingSource aside, and ran another KubeVirt), reset, virt-controller 1.3.1
    cluster = backends.cluster(backends.REAL, "1.3.1", knative=True)
    knative.drop_stale_subscribers(NAMESPACE)  # deploy/'s delivery back on the Triggers: the channel as installed
    api = knative.api
    servers: list[FunctionServer] = []
    tap = Recorder("tap")
    node = KubeVirtSim(cluster, step_delay=0.01).start()
    try:
        for svc in of_kind(load_manifests(DEPLOY_DIR), "serving.knative.dev", "Service"):
            name = svc["metadata"]["name"]
            if name in SERVED:
                server = FunctionServer(svc, kubeconfig=cluster.kubeconfig(
                    service_account=f"{NAMESPACE}/{service_account(svc)}"), env_overrides=SERVED[name]).start()
                servers.append(server)
                knative.serve(NAMESPACE, name, server.port)
        knative.serve(NAMESPACE, "tap", tap.port)
        api.request("POST", f"/apis/serving.knative.dev/v1/namespaces/{NAMESPACE}/services", {
            "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "tap"},
            "spec": {"template": {"spec": {"containers": [{"image": "example.com/tap:1"}]}}}}, allow=(409,))
        api.request("POST", f"/apis/eventing.knative.dev/v1/namespaces/{NAMESPACE}/triggers", {
            "apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "metadata": {"name": "tap"},
            "spec": {"broker": "default", "subscriber": {"ref": {
                "apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "tap"}}}}, allow=(409,))
        for kind, name in (("Broker", "default"), ("Trigger", "vmi-cleanup"), ("Trigger", "tap")):
            knative.wait_ready("eventing.knative.dev/v1", kind, NAMESPACE, name, timeout=90)
        knative.wait_ready("sources.knative.dev/v1", "ApiServerSource", NAMESPACE, "vmevents-vmis", timeout=90)
        knative.kubelet.wait_names()
        time.sleep(2)  # the adapters' informers have listed (what exists when they start is not sent)
        yield SimpleNamespace(cluster=cluster, knative=knative, tap=tap, node=node, servers=servers)
    finally:
        for server in servers:
            server.stop()
        tap.stop()
        node.stop()
        cluster.stop()
        for path in (f"/apis/eventing.knative.dev/v1/namespaces/{NAMESPACE}/triggers/tap",
                     f"/apis/serving.knative.dev/v1/namespaces/{NAMESPACE}/services/tap"):
            api.request("DELETE", path, allow=(404,))


def _vm(s) -> str:
    name = f"kn{next(_names)}-{uuid.uuid4().hex[:4]}"
    s.cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                      "metadata": {"name": name, "namespace": "default"},
                      "spec": {"runStrategy": "Manual", "template": {"spec": {"domain": {
                          "devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}})
    virtctl_start(s.cluster, "default", name)
    return name


def _vmi(s, name):
    return s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)


def _running(s, name) -> str:
    vmi = eventually(lambda: (_vmi(s, name) or {}).get("status", {}).get("phase") == "Running" and _vmi(s, name),
                     timeout=90, what=f"VMI {name} Running")
    return vmi["metadata"]["uid"]


def _notices(s, name) -> set[str]:
    """The ids of the notices of VM `name`'s cleanup that the broker took in: a `.cleaned` reply, or an item of a
    re-scan's `.scanned` summary (tests/faults/test_restarts.py `notices`). A redelivery keeps its id."""
    found = set()
    for r in list(s.tap.requests):
        kind, data = r["headers"].get("ce-type"), loads(r["body"]) or {}
        if kind == CLEANED and (data.get("details") or {}).get("vmi") == f"default/{name}":
            found.add(r["headers"]["ce-id"])
        elif kind == SCANNED:
            found.update(item["id"] for item in data.get("findings") or []
                         if (item.get("details") or {}).get("vmi") == f"default/{name}")
    return found


def _dead_lettered(s, name) -> list[dict]:
    """What vmevents-dead-letter logged about VM `name`'s VMI or launcher pod: an event no retry delivered. Knative
    dead-letters the event a subscriber was given when the subscriber's reply cannot be forwarded into the broker
    (knative.dev/eventing pkg/kncloudevents/event_dispatcher.go `send`), so a lost notice shows up here."""
    found = []
    for server in s.servers:
        for line in list(server.lines):
            if '"undelivered"' in line and (f"/virtualmachineinstances/{name}" in line
                                            or f"virt-launcher-{name}-" in line):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    found.append({"line": line})
    return found


def _source_gave_up(s, name) -> int:
    """The events about VM `name` (its VMI, its launcher pod, the VM) that an ApiServerSource adapter gave up on
    after its retries (it logs "failed to send cloudevent" with the subject: pkg/adapter/apiserver/delegate.go)."""
    count = 0
    for log in (s.knative.kubelet.workdir / "pods").glob("apiserversource-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "failed to send cloudevent" in line and (f"/{name}\"" in line or f"virt-launcher-{name}-" in line):
                count += 1
    return count


def _cleaned(s, name) -> None:
    eventually(lambda: _vmi(s, name) is None, timeout=90, what=f"VMI {name} deleted by vmi-cleanup")
    eventually(lambda: _notices(s, name), timeout=60, what=f"the .cleaned reply about {name} through the broker")


def _story_of(s, name) -> str:
    """What the function logged about `name` and what the tap saw since, for a failure's message."""
    lines = [line for server in s.servers for line in server.lines
             if (name in line and '"irrelevant"' not in line) or '"acted-on-' in line]
    seen = [(r["headers"].get("ce-type"), r["headers"].get("ce-id")) for r in list(s.tap.requests)
            if "vmevents" in (r["headers"].get("ce-type") or "")]
    return f"the function logged {lines[-6:]}; the tap's last events {seen}"


def _stays_stopped(s, *names: str, notices: tuple[int, ...] = (1,)) -> None:
    time.sleep(5)  # long enough for virt-controller to have started it again, were it going to
    for name in names:
        assert _vmi(s, name) is None, f"VM {name} was started again"
        vm = s.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)
        assert vm["spec"]["runStrategy"] == "Manual" and vm["status"].get("printableStatus") == "Stopped", vm["status"]
        assert len(_notices(s, name)) in notices, \
            f"{name}: {len(_notices(s, name))} notices; dead-lettered {_dead_lettered(s, name)}; {_story_of(s, name)}"


def test_a_guest_power_off_is_cleaned_up_through_knatives_broker_and_the_vm_stays_stopped(story):
    s = story
    name = _vm(s)
    _running(s, name)
    assert any(r["headers"].get("ce-source") for r in s.tap.requests), "Knative's adapters sent nothing"
    s.node.guest_power_off("default", name)
    _cleaned(s, name)
    _stays_stopped(s, name)


# How many notices each kill can leave (docs/vmi-cleanup.md, "Knative's broker restarted"). The in-memory channel
# fans out synchronously (knative.dev/eventing pkg/channel/fanout/fanout_event_handler.go, the default since
# knative/eventing#8311): the source's POST to the ingress is held open through the dispatcher and the filter to the
# function and back. Killing the ingress or the dispatcher cuts that chain, the function's reply with it, and the
# source retries 5 times from 50 ms, about 1.5 s in all (pkg/adapter/apiserver/events/events.go): a retry that
# reaches the function again is answered with the same notice (functions/vmi_cleanup/handler.py `_gone`), one that
# does not leaves the cleanup with its Kubernetes Event and no notice. The filter's death is retried by the
# dispatcher under the Trigger's delivery (deploy/base/vmi-cleanup.yaml: 6 retries, up to a minute), well past
# the filter's restart, so the notice arrives.
NOTICES = {"mt-broker-ingress": (0, 1), "imc-dispatcher": (0, 1), "mt-broker-filter": (1,)}


@pytest.mark.parametrize("key", DATA_PLANE, ids=lambda key: key.split("/")[1])
def test_each_part_of_the_data_plane_killed_mid_story_loses_no_episode(story, key):
    """One part SIGKILLed the moment a guest has powered off, while the events of it are on their way: what the
    kill loses, the PingSource's next re-scan (every minute, deploy/) catches, the VMI is cleaned, no VM is started
    again, and the episode is announced at most once (exactly once where the broker retries past the restart:
    NOTICES). Each row waits until its episode is over, so no kill lands in another's retries."""
    s = story
    name = _vm(s)
    _running(s, name)
    s.node.guest_power_off("default", name)
    started = time.monotonic()
    took = s.knative.kubelet.kill(key)
    eventually(lambda: _vmi(s, name) is None, timeout=150, what=f"VMI {name} deleted by vmi-cleanup")
    cleaned = time.monotonic() - started
    with contextlib.suppress(AssertionError):  # the replies' retries; a cut chain may leave none (NOTICES)
        eventually(lambda: _notices(s, name), timeout=70)
    gave_up = _source_gave_up(s, name)
    print(f"\n[faults] Knative's {key.split('/')[1]} SIGKILLed right after a guest power-off: started again in "
          f"{took:.1f} s, the VMI cleaned {cleaned:.1f} s after the kill, {len(_notices(s, name))} notice(s), "
          f"{len(_dead_lettered(s, name))} dead-lettered, {gave_up} event(s) about it the source gave up on; "
          f"episode not lost")
    _stays_stopped(s, name, notices=NOTICES[key.split("/")[1]])

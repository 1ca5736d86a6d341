"""alert-forwarder end to end with a real Alertmanager: findings enter the local broker as the
other functions' replies do, the Trigger in deploy/ routes them to the function running as a real
functions-framework server, and the alerts are checked through Alertmanager's API v2 (labels,
grouping, one alert per repeated finding, resolution) and through what Alertmanager's own webhook
delivered. vmi-cleanup runs in the same world, so a real reply of a real function is seen too.

Needs Debian's `prometheus-alertmanager` (`.ci/run` installs it). Outside CI a missing binary
skips this module with that reason; in CI (CI=true) it fails.
"""
from __future__ import annotations

import itertools
import json
import os
import time
from datetime import UTC, datetime

import pytest

from shared.finding import Finding
from shared.kube import Kube
from shared.ledger import Ledger
from simcluster.alertmanager import Alertmanager, Receiver, find_binary
from simcluster.builders import findings as b
from simcluster.play import virtctl_start
from tests import e2e
from tests.e2e import eventually
from tests.rbac import assert_exact_rbac, granted

pytestmark = pytest.mark.e2e
FUNCTION_SA = "vmevents/alert-forwarder"
PRODUCER = "e2e-producer"  # a producer no function's re-scan knows: nothing but the test settles its findings
_names = itertools.count(1)


def alertmanager_binary() -> str:
    binary = find_binary()
    if binary:
        return binary
    why = ("prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager, "
           "or set ALERTMANAGER_BIN); .ci/run installs it")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}")
    pytest.skip(why)


class World(e2e.World):
    through_knative = True  # the real rows: Knative's broker delivers (tests/e2e.py World)
    def __init__(self, binary: str, version: str, backend: str):
        self.notifications = Receiver().start()   # Alertmanager's own webhook receiver
        self.hook = Receiver().start()            # alert-forwarder's WEBHOOK_URL
        self.alertmanager = Alertmanager(binary, self.notifications.url).start()
        super().__init__(version, backend=backend, kubevirt={"step_delay": 0.01},
                         env_overrides={"vmi-cleanup": {"CLEANUP_AFTER": "0s"},
                                        "alert-forwarder": {"ALERTMANAGER_URL": self.alertmanager.url,
                                                            "WEBHOOK_URL": f"{self.hook.url}/hook",
                                                            "CLUSTER_NAME": "e2e"}})

    def stop(self):
        super().stop()
        for part in (self.alertmanager, self.notifications, self.hook):
            part.stop()

    def publish(self, type_, data, subject=None):
        self.knative.broker.publish(b.finding_event(type_, data, subject))

    def settle(self):
        assert self.knative.wait_idle(timeout=20)

    def deliveries(self, ok=None):
        return [d for d in self.knative.broker.deliveries if d.trigger == "alert-forwarder"
                and (ok is None or d.ok == ok)]

    def decisions(self):
        lines = self.knative.functions["alert-forwarder"].logs()
        return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture(scope="module", **e2e.backends_only())
def world(request):
    with World(alertmanager_binary(), *request.param) as w:
        yield w


def unique_ns():
    return f"ns{next(_names)}"


def test_a_device_conflict_arrives_with_the_right_labels_and_annotations(world):
    ns = unique_ns()
    world.publish("io.vmevents.device-conflict.detected", b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",)))
    (alert,) = eventually(lambda: world.alertmanager.alerts(namespace=ns), what="the alert in Alertmanager")
    assert alert["labels"] == {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": ns,
                               "vm": "vm2", "device": "harvester-ktmg4-000004102", "conflict": "taken-while-stopped",
                               "finding": b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",))["identity"]["finding"],
                               "cluster": "e2e"}
    assert alert["annotations"]["summary"].startswith(f"{ns}/vm2 holds harvester-ktmg4-000004102")
    assert alert["annotations"]["runbook_url"].endswith("README.md#vmhostdeviceconflict")
    assert alert["status"]["state"] == "active"


def test_findings_are_grouped_by_alertname_and_namespace(world):
    ns = unique_ns()
    for vm in ("vm1", "vm2", "vm3"):
        world.publish("io.vmevents.io-pause-report.detected", b.io_pause(f"{ns}/{vm}", pvcs=(f"{vm}-disk-0",)))
    world.publish("io.vmevents.migration-report.detected", b.migration_report(f"{ns}/vm1", f"{ns}/vm1-mig"))
    eventually(lambda: len(world.alertmanager.alerts(namespace=ns)) == 4, what="four alerts")
    groups = {g["labels"]["alertname"]: g for g in world.alertmanager.api("alerts/groups")
              if g["labels"].get("namespace") == ns}
    assert set(groups) == {"VMPausedOnIOError", "VMMigrationFailed"}
    assert sorted(a["labels"]["vm"] for a in groups["VMPausedOnIOError"]["alerts"]) == ["vm1", "vm2", "vm3"]
    assert groups["VMPausedOnIOError"]["labels"] == {"alertname": "VMPausedOnIOError", "namespace": ns}
    # Alertmanager notified its receiver per group, with every alert of the group in one notification. (Their
    # episodes opened in the past, so it notifies about the first at once, dispatch.go, and the others with it
    # at the group's next interval.)
    group = groups["VMPausedOnIOError"]["labels"]
    world.notifications.wait_for(lambda posts: [p for p in posts if p["body"]["groupLabels"] == group
                                                and len(p["body"]["alerts"]) == 3],
                                 what="the group's notification with its three alerts")


def test_a_repeated_finding_keeps_one_alert_alive_not_duplicates(world):
    ns = unique_ns()
    data = b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",))
    world.publish("io.vmevents.device-conflict.detected", data)
    (first,) = eventually(lambda: world.alertmanager.alerts(namespace=ns), what="the alert")
    time.sleep(0.05)  # so that a later POST has a later timestamp (Alertmanager's resolution is 1 ms)
    for _ in range(3):
        world.publish("io.vmevents.device-conflict.detected", data)
    world.settle()
    (again,) = world.alertmanager.alerts(namespace=ns)
    assert again["fingerprint"] == first["fingerprint"]
    assert again["startsAt"] == first["startsAt"], "the earliest startsAt is kept"
    assert again["endsAt"] > first["endsAt"], "each repeat extends the alert's life"


def test_a_resolved_finding_ends_the_alert(world):
    ns = unique_ns()
    data = b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",))
    world.publish("io.vmevents.device-conflict.detected", data)
    eventually(lambda: world.alertmanager.alerts(namespace=ns), what="the alert")
    world.notifications.wait_for(lambda posts: any(p["body"]["groupLabels"].get("namespace") == ns for p in posts),
                                 what="the firing notification")
    world.publish("io.vmevents.device-conflict.resolved", b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",),
                                                                            state="resolved"))
    eventually(lambda: not world.alertmanager.alerts(namespace=ns), what="no active alert any more")
    resolved = world.notifications.wait_for(
        lambda posts: [a for p in posts if p["body"]["groupLabels"].get("namespace") == ns
                       for a in p["body"]["alerts"] if a["status"] == "resolved"], what="the resolved notification")
    assert resolved[0]["endsAt"] >= resolved[0]["startsAt"] and resolved[0]["labels"]["vm"] == "vm2"


def test_the_webhook_gets_one_post_per_finding(world):
    ns = unique_ns()
    world.publish("io.vmevents.migration-report.detected", b.migration_report(f"{ns}/vm5", f"{ns}/vm5-mig",
                                                                              category="near-timeout"))
    posts = world.hook.wait_for(lambda posts: [p for p in posts
                                               if p["body"]["commonLabels"].get("namespace") == ns], what="the webhook")
    world.settle()
    assert len([p for p in world.hook.posts if p["body"]["commonLabels"].get("namespace") == ns]) == 1
    assert posts[0]["body"]["commonLabels"]["alertname"] == "VMMigrationNearTimeout"
    assert posts[0]["body"]["finding"]["type"] == "io.vmevents.migration-report.detected"


def test_a_real_vmi_cleanup_reply_reaches_the_function_and_is_dropped_as_info(world):
    name = f"vm-off{next(_names)}"
    world.cluster.create({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                          "metadata": {"name": name, "namespace": "default"},
                          "spec": {"runStrategy": "Manual", "template": {"spec": {"domain": {
                              "devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}})
    virtctl_start(world.cluster, "default", name)
    eventually(lambda: ((world.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name) or {})
                        .get("status") or {}).get("phase") == "Running", what="Running")
    world.kubevirt.guest_power_off("default", name)
    line = eventually(lambda: [d for d in world.decisions() if d["event_type"] == "io.vmevents.vmi-cleanup.cleaned"
                               and name in (d["subject"] or "")], what="alert-forwarder saw the cleanup reply")
    assert line[0]["verdict"] == "drop" and "below MIN_SEVERITY=warning" in line[0]["reason"]
    assert not world.alertmanager.alerts(alertname="VMICleanedUp")


def test_a_receiver_that_is_down_is_retried_and_the_finding_arrives_when_it_is_back(world):
    ns = unique_ns()
    world.hook.fail_with(503)
    world.publish("io.vmevents.device-conflict.detected", b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",)))
    eventually(lambda: any(d.status == 503 and d.trigger == "alert-forwarder" for d in world.deliveries(ok=False)),
               what="a 503 to the broker")
    world.hook.fail_with(None)
    world.hook.wait_for(lambda posts: any(p["body"]["commonLabels"].get("namespace") == ns for p in posts),
                        what="the redelivered finding")
    world.settle()
    assert len(world.alertmanager.alerts(namespace=ns)) == 1, "Alertmanager merged the redeliveries into one alert"


def test_a_receiver_down_for_good_dead_letters_the_finding_so_it_is_not_lost(world):
    ns = unique_ns()
    world.hook.fail_with(503)
    try:
        world.publish("io.vmevents.device-conflict.detected", b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",)))
        world.settle()
    finally:
        world.hook.fail_with(None)
    dead = [d for d in world.deliveries() if d.dead_lettered]
    assert dead, "the broker gave up and sent the finding to the dead-letter sink"
    logged = world.knative.functions["vmevents-dead-letter"].wait_for_log(
        lambda line: '"undelivered":true' in line and "device-conflict.detected" in line and '"status":"503"' in line)
    assert logged, "the dead-letter function logged the finding"
    assert "answered 503" in json.loads(logged)["error"], "with the function's own explanation"


def test_a_tick_brings_an_alert_back_after_alertmanager_restarts_and_webhooks_get_one_pair(world):
    """The finding is on record (a producer's ledger; here a producer of the test's own, whose findings no
    function's re-scan would settle) and its notice reached alert-forwarder. Alertmanager restarts mid-episode
    and forgets it (alerts live in its memory only): the next tick re-posts it from the record. The episode
    ends; the ticks that follow re-post it resolved, and the webhook still got exactly one firing and one
    resolved message."""
    ns = unique_ns()
    ledger = Ledger(Kube(world.cluster.api_client()), PRODUCER, reason="E2eFinding")
    # the finding's recipient (its Event lives in the recipient's namespace; the alert's labels are the finding's)
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
          "metadata": {"name": f"{ns}-vm1", "namespace": "default", "uid": f"uid-{ns}"}}
    finding = Finding(PRODUCER, "disk-on-fire", f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/vm1", "k",
                      {"namespace": ns, "vm": "vm1"}, "critical", "vm1's disk is on fire.")
    opened = ledger.sighted(finding, vm, f"add-{ns}", datetime.now(UTC))
    assert opened is not None
    _publish(world, opened.reply())
    (first,) = eventually(lambda: world.alertmanager.alerts(namespace=ns), what="the alert")
    world.alertmanager.restart()
    assert not world.alertmanager.alerts(namespace=ns), "a restarted Alertmanager holds no alert"
    world.tick()
    (again,) = eventually(lambda: world.alertmanager.alerts(namespace=ns), timeout=5, what="the alert back")
    assert again["labels"] == first["labels"] and again["status"]["state"] == "active"
    [record] = [r for r in ledger.records("default") if r.finding.identity.get("namespace") == ns]
    world.settle()
    assert [a["status"]["state"] for a in world.alertmanager.alerts(namespace=ns)] == ["active"], "still firing"
    ended = ledger.resolve(record, f"ping-{ns}", datetime.now(UTC), summary="it ended")
    assert ended is not None
    _publish(world, ended.reply())
    eventually(lambda: not world.alertmanager.alerts(namespace=ns), what="the alert ended")
    for _ in range(3):
        world.tick()
    assert not world.alertmanager.alerts(namespace=ns), "re-posted resolved, it stays ended"
    world.settle()
    sent = [p["body"]["status"] for p in world.hook.posts if p["body"]["commonLabels"].get("namespace") == ns]
    assert sent == ["firing", "resolved"], "one firing and one resolved message for the episode, whatever the ticks"


def _publish(world, reply):
    """A producer's reply into the broker, as the broker would carry it."""
    world.knative.broker.publish(b.finding_event(reply.type, reply.data, reply.subject, id=reply.id))


def test_the_function_may_only_read_and_annotate_events_and_does(world):
    """Last: by now every path has run. Its permissions, all on Events and all used: get a finding's Event before
    its notice is sent, patch its receipts onto it, list the finding Events on every tick and watch for those
    resolved while it ran."""
    world.settle()
    assert granted(FUNCTION_SA) == {("get", "", "events"), ("list", "", "events"), ("patch", "", "events"),
                                    ("watch", "", "events")}
    assert_exact_rbac(world.cluster.requests, FUNCTION_SA)

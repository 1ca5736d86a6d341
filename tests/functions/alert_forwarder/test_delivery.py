"""A notice reaches each receiver once, in order (issue 34, points 2 and 3), on both backends: findings on record in
the cluster (shared/ledger.py, as a producer keeps them), alert-forwarder's handler in this process with its own
ServiceAccount, a webhook receiver, and a second receiver standing in for Alertmanager (what it makes of the posts
is test_exactly_once.py's, with a real one). The deliveries are what the broker does: the same notice again after a
failure, out of order, and several at once."""
from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime

import pytest

from functions.alert_forwarder import handler
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.errors import TemporaryError
from shared.finding import Finding
from shared.intake import Incoming
from shared.kube import Kube
from shared.ledger import Ledger
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.alertmanager import Receiver
from tests import backends

pytestmark = pytest.mark.e2e
SA = "vmevents/alert-forwarder"
PRODUCER = "delivery-test"
RETRIES = 8  # deploy/base/alert-forwarder.yaml: the Trigger's delivery.retry
_names = itertools.count(1)


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1", virt_controller=False)
    yield c
    c.stop()


@pytest.fixture
def am():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def hook():
    r = Receiver().start()
    yield r
    r.stop()


class Story:
    """One finding's episodes on record, and alert-forwarder delivering their notices."""

    def __init__(self, cluster, am, hook):
        self.name = f"vm{next(_names)}"
        self.ledger = Ledger(Kube(cluster.api_client()), PRODUCER, reason="DeliveryTest")
        self.vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                   "metadata": {"name": self.name, "namespace": "default", "uid": f"uid-{self.name}"}}
        self.finding = Finding(PRODUCER, "disk-on-fire", f"/apis/kubevirt.io/v1/namespaces/default/"
                               f"virtualmachines/{self.name}", "k", {"namespace": "default", "vm": self.name},
                               "critical", f"{self.name}'s disk is on fire.")
        kube = Kube(cluster.api_client(service_account=SA))
        settings = Settings.from_env({"ALERTMANAGER_URL": am.url, "WEBHOOK_URL": f"{hook.url}/hook"})
        self.ctx = KubeContext(FUNCTION, settings, lambda: datetime.now(UTC), kube, Recorder(kube, FUNCTION))
        self.am, self.hook, self.cluster = am, hook, cluster

    def open(self, delivery="add-1"):
        notice = self.ledger.sighted(self.finding, self.vm, delivery, datetime.now(UTC))
        assert notice is not None
        return notice.reply()

    def resolve(self, delivery="tick-1"):
        [record] = [r for r in self.ledger.records("default", state=None) if r.finding.key == "k"
                    and r.finding.identity["vm"] == self.name]
        notice = self.ledger.resolve(record, delivery, datetime.now(UTC))
        assert notice is not None
        return notice.reply()

    def deliver(self, reply):
        """One delivery of the reply as the broker makes it: the outcome, or the error the broker would see."""
        event = Incoming(id=reply.id, type=reply.type, source=f"/vmevents/{PRODUCER}", subject=reply.subject,
                         data=reply.data)
        try:
            return handler.on_event(event, self.ctx)
        except TemporaryError as exc:
            return exc

    def messages(self):
        """The webhook's messages about this finding, in the order it accepted them."""
        return [body["status"] for body in self.hook.bodies("/hook")
                if body["commonLabels"].get("vm") == self.name]

    def posted(self):
        """What the stand-in Alertmanager accepted about this finding, post by post."""
        now = _now()  # an alert posted ended (RFC 3339 in UTC with milliseconds: compared as text) is resolved
        return [("resolved" if alert["endsAt"] <= now else "firing")
                for body in self.am.bodies("/api/v2/alerts") for alert in body if alert["labels"]["vm"] == self.name]

    def receipts(self):
        [event] = [e for e in self.cluster.list("v1", "Event", "default")
                   if e["metadata"]["name"].startswith(f"{self.name}.f")]
        return (event["metadata"].get("annotations") or {}).get("vmevents.io/alert-receipts")


def _now():
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_resolved_episode_is_not_fired_again_by_its_late_firing_notice(cluster, am, hook):
    s = Story(cluster, am, hook)
    detected = s.open()
    resolved = s.resolve()
    assert not isinstance(s.deliver(resolved), Exception)
    assert not isinstance(s.deliver(detected), Exception)  # the .detected handled after the .resolved
    assert s.messages() == ["firing", "resolved"], "the webhook's last word is RESOLVED, after the firing it missed"
    assert s.posted() == ["resolved"], "Alertmanager is never posted firing for an episode that ended"


def test_a_redelivered_firing_notice_after_the_resolution_sends_nothing(cluster, am, hook):
    s = Story(cluster, am, hook)
    detected = s.open()
    s.deliver(detected)
    s.deliver(s.resolve())
    s.deliver(detected)
    assert s.messages() == ["firing", "resolved"]
    assert s.posted() == ["firing", "resolved"]
    assert s.receipts() is not None and "1/resolved" in s.receipts()


def test_alertmanager_down_for_every_retry_leaves_the_webhook_one_message(cluster, am, hook):
    s = Story(cluster, am, hook)
    detected = s.open()
    am.fail_with(503)
    answers = [s.deliver(detected) for _ in range(1 + RETRIES)]
    assert all(isinstance(a, TemporaryError) and "Alertmanager" in a.message for a in answers)
    assert s.messages() == ["firing"], "the webhook accepted it once: not sent again for Alertmanager's failure"
    am.fail_with(None)
    assert not isinstance(s.deliver(detected), Exception)  # the broker's next try (or the tick) reaches it
    assert s.posted() == ["firing"] and s.messages() == ["firing"]
    s.deliver(s.resolve())
    assert s.messages() == ["firing", "resolved"] and s.posted() == ["firing", "resolved"]


def test_the_webhook_down_for_every_retry_gets_the_whole_episode_at_its_end(cluster, am, hook):
    s = Story(cluster, am, hook)
    detected = s.open()
    hook.fail_with(503)
    answers = [s.deliver(detected) for _ in range(1 + RETRIES)]  # dead-lettered after these
    assert all(isinstance(a, TemporaryError) for a in answers)
    assert s.posted() == ["firing"], "Alertmanager accepted it once"
    hook.fail_with(None)
    s.deliver(s.resolve())
    assert s.messages() == ["firing", "resolved"], "the firing message it never got, then the resolved one"
    assert s.posted() == ["firing", "resolved"]


def test_a_webhook_failing_between_the_firing_it_was_owed_and_the_resolved_keeps_the_firing(cluster, am, hook):
    """At the end of an episode whose firing message the webhook missed, it takes the firing message and fails on the
    resolved one: its receipt says firing, so the redelivery sends the resolved message only."""
    s = Story(cluster, am, hook)
    detected = s.open()
    hook.fail_with(503)
    s.deliver(detected)
    hook.accept_then_fail(1, 503)
    resolved = s.resolve()
    assert isinstance(s.deliver(resolved), TemporaryError)
    assert s.messages() == ["firing"]
    hook.fail_with(None)
    assert not isinstance(s.deliver(resolved), Exception)
    assert s.messages() == ["firing", "resolved"]


def test_deliveries_at_once_send_each_message_once(cluster, am, hook):
    """Eight deliveries of one notice at once (a redelivery overtaking a slow first try, replicas): one claims the
    finding and sends; the others read its claim and answer 503, and their redeliveries find it accepted."""
    s = Story(cluster, am, hook)
    detected = s.open()
    start = threading.Barrier(8)
    answers = []

    def one():
        start.wait()
        answers.append(s.deliver(detected))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.messages() == ["firing"] and s.posted() == ["firing"]
    assert any(not isinstance(a, Exception) for a in answers)
    assert not isinstance(s.deliver(detected), Exception), "a later redelivery finds it accepted"
    assert s.messages() == ["firing"] and s.posted() == ["firing"]


def test_a_producers_sightings_during_a_delivery_do_not_lose_its_receipts(cluster, am, hook):
    """The finding's Event is the producer's too: its sightings write it (count + 1) while alert-forwarder delivers.
    Every write is conditioned on the version read, so each side reads again on a Conflict; nothing is lost."""
    s = Story(cluster, am, hook)
    detected = s.open()
    stop = threading.Event()

    def sight():
        while not stop.wait(0.005):
            s.ledger.sighted(s.finding, s.vm, "update", datetime.now(UTC))

    sighting = threading.Thread(target=sight)
    sighting.start()
    try:
        for _ in range(3):
            s.deliver(detected)
    finally:
        stop.set()
        sighting.join()
    assert s.messages() == ["firing"] and s.posted() == ["firing"]
    event = s.cluster.get("v1", "Event", "default", detected.data["record"].partition("/")[2])
    assert event["count"] > 1, "the producer's sightings went on meanwhile"
    assert "vmevents.io/alert-claim" not in (event["metadata"].get("annotations") or {}), "the claim was cleared"


def test_a_reply_naming_another_findings_record_writes_nothing_there(cluster, am, hook):
    """The record a reply names is read, never trusted: a reply whose `record` is another finding's Event (forged, or
    broken) is sent as it says, and that Event gets no claim and no receipt of it."""
    other, s = Story(cluster, am, hook), Story(cluster, am, hook)
    other_reply = other.open()
    forged = s.open()
    forged.data["record"] = other_reply.data["record"]
    assert not isinstance(s.deliver(forged), Exception)
    assert s.messages() == ["firing"]
    event = cluster.get("v1", "Event", "default", other_reply.data["record"].partition("/")[2])
    notes = event["metadata"].get("annotations") or {}
    assert "vmevents.io/alert-receipts" not in notes and "vmevents.io/alert-claim" not in notes
    assert not isinstance(other.deliver(other_reply), Exception)
    assert other.messages() == ["firing"], "the other finding's own notice is still sent"

"""One firing and one resolved per episode, end to end (issue 34, points 2 and 3): a finding's notices enter the
broker as a producer's replies do (the finding on record in the cluster, shared/ledger.py), deploy/'s Trigger
delivers them to alert-forwarder with its retries, and what a real Alertmanager and a webhook receiver make of it
is checked: notices out of order, a late redelivery of the firing one, and one receiver down for the whole retry
span. On both backends (the real one through Knative's broker).

Needs Debian's `prometheus-alertmanager` (skipped without it outside CI, as test_e2e)."""
from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from shared.finding import Finding
from shared.kube import Kube
from shared.ledger import Ledger
from tests import e2e
from tests.e2e import eventually
from tests.functions.alert_forwarder.test_e2e import PRODUCER, World, _publish, alertmanager_binary

pytestmark = pytest.mark.e2e
_names = itertools.count(1)


@pytest.fixture(scope="module", **e2e.backends_only())
def world(request):
    with World(alertmanager_binary(), *request.param) as w:
        yield w


class Episode:
    """A finding of the test's own producer (no function's re-scan settles it), in a namespace of its own so that it
    is a group of its own in Alertmanager."""

    def __init__(self, world):
        self.world = world
        self.ns = f"once{next(_names)}"
        self.ledger = Ledger(Kube(world.cluster.api_client()), PRODUCER, reason="E2eFinding")
        self.vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                   "metadata": {"name": f"{self.ns}-vm1", "namespace": "default", "uid": f"uid-{self.ns}"}}
        self.finding = Finding(PRODUCER, "disk-on-fire", f"/apis/kubevirt.io/v1/namespaces/{self.ns}/"
                               f"virtualmachines/vm1", "k", {"namespace": self.ns, "vm": "vm1"}, "critical",
                               "vm1's disk is on fire.")

    def open(self):
        notice = self.ledger.sighted(self.finding, self.vm, f"add-{self.ns}", datetime.now(UTC))
        assert notice is not None
        return notice.reply()

    def resolve(self):
        [record] = [r for r in self.ledger.records("default") if r.finding.identity.get("namespace") == self.ns]
        notice = self.ledger.resolve(record, f"tick-{self.ns}", datetime.now(UTC), summary="it ended")
        assert notice is not None
        return notice.reply()

    def publish(self, reply):
        _publish(self.world, reply)
        self.world.settle()

    def messages(self):
        """The webhook's messages about this finding, in the order it accepted them."""
        return [p["body"]["status"] for p in self.world.hook.posts
                if p["body"]["commonLabels"].get("namespace") == self.ns]

    def firing(self):
        """Alertmanager holds the alert firing."""
        return [a for a in self.world.alertmanager.alerts(namespace=self.ns) if a["status"]["state"] == "active"]

    def notified(self):
        """What Alertmanager notified its own receiver of this alert, notification by notification."""
        return [a["status"] for p in self.world.notifications.posts
                if p["body"]["groupLabels"].get("namespace") == self.ns for a in p["body"]["alerts"]]


def test_a_firing_notice_redelivered_after_the_resolution_does_not_fire_again(world):
    e = Episode(world)
    detected = e.open()
    e.publish(detected)
    eventually(e.firing, what="the alert firing")
    world.notifications.wait_for(lambda _: "firing" in e.notified(), what="Alertmanager's firing notification")
    e.publish(e.resolve())
    eventually(lambda: not e.firing(), what="the alert ended")
    world.notifications.wait_for(lambda _: "resolved" in e.notified(), what="Alertmanager's resolved notification")
    e.publish(detected)  # the broker's redelivery (a receiver failed), or a slower replica's copy
    assert not e.firing(), "Alertmanager was not posted the ended episode firing again"
    world.tick()
    assert not e.firing()
    assert e.messages() == ["firing", "resolved"]
    assert e.notified() == ["firing", "resolved"]


def test_notices_out_of_order_are_one_firing_and_one_resolved(world):
    e = Episode(world)
    detected = e.open()
    resolved = e.resolve()
    e.publish(resolved)
    e.publish(detected)  # the .detected handled after the .resolved of its episode
    assert not e.firing(), "Alertmanager was not posted the ended episode firing"
    world.tick()
    assert e.messages() == ["firing", "resolved"], "the webhook's last word is RESOLVED"
    assert not e.firing()
    assert "firing" not in e.notified(), "Alertmanager never held it firing, so it told nobody"


def test_alertmanager_down_for_the_whole_retry_span_repeats_nothing_to_the_webhook(world):
    e = Episode(world)
    detected = e.open()
    world.alertmanager.down()
    try:
        e.publish(detected)  # 1 + 8 tries, all answered 503, then the dead letter
        dead = [d for d in world.deliveries() if d.dead_lettered and d.event_id == detected.id]
        assert dead, "the broker tried for its whole retry span and gave up"
    finally:
        world.alertmanager.start()
    assert e.messages() == ["firing"], "the webhook accepted it once and was not sent it again"
    world.tick()  # Alertmanager back: the tick posts the finding on record
    eventually(e.firing, what="the alert firing after the tick")
    e.publish(e.resolve())
    eventually(lambda: not e.firing(), what="the alert ended")
    assert e.messages() == ["firing", "resolved"]
    world.notifications.wait_for(lambda _: e.notified() == ["firing", "resolved"],
                                 what="one firing and one resolved notification")


def test_the_webhook_down_for_the_whole_retry_span_gets_the_episode_when_it_ends(world):
    e = Episode(world)
    detected = e.open()
    world.hook.fail_with(503)
    try:
        e.publish(detected)
    finally:
        world.hook.fail_with(None)
    eventually(e.firing, what="the alert firing: Alertmanager accepted it")
    assert e.messages() == []
    e.publish(e.resolve())
    assert e.messages() == ["firing", "resolved"], "the firing message it missed, then the resolved one"
    eventually(lambda: not e.firing(), what="the alert ended")
    world.notifications.wait_for(lambda _: e.notified() == ["firing", "resolved"],
                                 what="one firing and one resolved notification")

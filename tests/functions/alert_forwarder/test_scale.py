"""10,000 open findings on record (issue 34, point 4), as a storage outage pausing that many VMs leaves them, on both
backends: a tick re-posts every one of them to a real Alertmanager in bodies of a bounded size (500 alerts, 1 MiB:
memory and request size do not depend on the number of findings; the peak RSS is bench/alert_forwarder.py's), and an
episode among them is still one firing and one resolved message on the webhook and one firing and one resolved
notification from Alertmanager. alert-forwarder's handler runs in this process with its own ServiceAccount.

Needs Debian's `prometheus-alertmanager` (skipped without it outside CI, as test_e2e)."""
from __future__ import annotations

import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder import handler, tick
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.finding import Finding
from shared.intake import Incoming
from shared.kube import Kube
from shared.ledger import Ledger
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.alertmanager import Alertmanager, Receiver, Sizer
from simcluster.builders.findings import open_findings
from tests import backends
from tests.e2e import eventually
from tests.functions.alert_forwarder.test_e2e import PRODUCER, alertmanager_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
FINDINGS = 10_000
SA = "vmevents/alert-forwarder"


@pytest.fixture(scope="module", params=backends.params())
def outage(request):
    """The cluster with 10,000 open findings, a real Alertmanager and its notification receiver, a second replica
    that measures what it is posted, a webhook, and alert-forwarder's context."""
    cluster = backends.cluster(request.param, "1.3.1", virt_controller=False)
    parts = []
    try:
        step = FINDINGS // 8
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda start: open_findings(cluster.create, start, start + step), range(0, FINDINGS, step)))
        notifications, hook, sizer = Receiver().start(), Receiver().start(), Sizer().start()
        parts += [notifications, hook, sizer]
        am = Alertmanager(alertmanager_binary(), notifications.url).start()
        parts.append(am)
        kube = Kube(cluster.api_client(service_account=SA))
        settings = Settings.from_env({"ALERTMANAGER_URL": f"{am.url},{sizer.url}", "WEBHOOK_URL": f"{hook.url}/hook"})
        ctx = KubeContext(FUNCTION, settings, lambda: datetime.now(UTC), kube, Recorder(kube, FUNCTION))
        yield cluster, am, notifications, hook, sizer, ctx
    finally:
        for part in reversed(parts):
            part.stop()
        cluster.stop()


def ping(ctx):
    return handler.on_event(Incoming(id=str(uuid.uuid4()), type=tick.PING, source="/ping", data={}), ctx)


@pytest.fixture
def unhurried(monkeypatch):
    """The tick's budget out of the way: what is checked is what it posts, not how fast a loaded machine serves
    10,000 findings (test_tick.py checks the budget; bench/alert_forwarder.py measures the time)."""
    monkeypatch.setattr(tick, "BUDGET", timedelta(minutes=10))


def test_a_tick_reposts_10000_findings_in_bounded_bodies(outage, unhurried):
    cluster, am, _, _, sizer, ctx = outage
    sizer.reset()
    outcome = ping(ctx)
    assert outcome.verdict == "refresh" and "stopped" not in outcome.reason, outcome.reason
    assert f"{FINDINGS} firing" in outcome.reason
    assert sizer.alerts == FINDINGS, "every open finding, to every replica"
    assert sizer.posts == math.ceil(FINDINGS / tick.CHUNK_ALERTS), "in bodies of 500 alerts"
    assert sizer.largest <= tick.CHUNK_BYTES
    eventually(lambda: am.unresolved() >= FINDINGS, timeout=60, what="Alertmanager holding every alert")


def test_an_episode_among_10000_open_findings_is_one_firing_and_one_resolved(outage, unhurried):
    cluster, am, notifications, hook, _, ctx = outage
    ns = "scale1"
    ledger = Ledger(Kube(cluster.api_client()), PRODUCER, reason="E2eFinding")
    vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
          "metadata": {"name": f"{ns}-vm1", "namespace": "default", "uid": f"uid-{ns}"}}
    finding = Finding(PRODUCER, "disk-on-fire", f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/vm1", "k",
                      {"namespace": ns, "vm": "vm1"}, "critical", "vm1's disk is on fire.")

    def deliver(notice):
        reply = notice.reply()
        return handler.on_event(Incoming(id=reply.id, type=reply.type, source="/test", subject=reply.subject,
                                         data=reply.data), ctx)

    detected = ledger.sighted(finding, vm, "add-1", datetime.now(UTC))
    assert deliver(detected).verdict == "forward"
    ping(ctx)
    deliver(detected)  # a redelivery, after the tick
    notified = lambda: [a["status"] for p in notifications.posts  # noqa: E731
                        if p["body"]["groupLabels"].get("namespace") == ns for a in p["body"]["alerts"]]
    notifications.wait_for(lambda _: notified() == ["firing"], what="Alertmanager's firing notification")
    [record] = [r for r in ledger.records("default") if r.finding.identity.get("namespace") == ns]
    resolved = ledger.resolve(record, "tick-1", datetime.now(UTC))
    deliver(resolved)
    deliver(detected)  # late, after the resolution
    ping(ctx)
    messages = [body["status"] for body in hook.bodies("/hook") if body["commonLabels"].get("namespace") == ns]
    assert messages == ["firing", "resolved"]
    notifications.wait_for(lambda _: notified() == ["firing", "resolved"], what="Alertmanager's resolved notification")
    assert not am.api("alerts", filter=f'namespace="{ns}"', active="true"), "ended in Alertmanager"

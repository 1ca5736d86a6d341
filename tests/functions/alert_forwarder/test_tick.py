"""A tick's parts (issue 34, point 4): it stops between pages at its budget, keeps firing over resolved across its
bodies, and raises what its reader met. The 10,000 findings are test_scale.py's; the memory, bench/."""
from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder import handler, tick
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.errors import TemporaryError
from shared.finding import Finding
from shared.intake import Incoming
from shared.kube import Kube
from shared.ledger import Ledger
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.alertmanager import Alertmanager, Receiver
from simcluster.builders.findings import open_findings
from tests import backends
from tests.functions.alert_forwarder.test_e2e import alertmanager_binary

SA = "vmevents/alert-forwarder"


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1", virt_controller=False)
    open_findings(c.create, 0, 600)  # three pages
    yield c
    c.stop()


@pytest.fixture
def am():
    r = Receiver().start()
    yield r
    r.stop()


def context(cluster, am):
    kube = Kube(cluster.api_client(service_account=SA))
    settings = Settings.from_env({"ALERTMANAGER_URL": am.url})
    return KubeContext(FUNCTION, settings, lambda: datetime.now(UTC), kube, Recorder(kube, FUNCTION))


def ping(ctx):
    return handler.on_event(Incoming(id=str(uuid.uuid4()), type=tick.PING, source="/ping", data={}), ctx)


def posted(am):
    return [alert for body in am.bodies("/api/v2/alerts") for alert in body]


def test_a_tick_that_used_its_budget_stops_between_pages_and_says_so(cluster, am, monkeypatch):
    monkeypatch.setattr(tick, "BUDGET", timedelta(0))
    outcome = ping(context(cluster, am))
    assert outcome.verdict == "refresh" and "stopped at the tick's budget" in outcome.reason, outcome.reason
    assert len(posted(am)) == tick.PAGE, "the first page, always: every tick makes progress"


def test_a_tick_within_its_budget_posts_every_page(cluster, am, monkeypatch):
    monkeypatch.setattr(tick, "BUDGET", timedelta(minutes=10))
    monkeypatch.setattr(tick, "CHUNK_ALERTS", 100)
    outcome = ping(context(cluster, am))
    assert "stopped" not in outcome.reason and len(posted(am)) >= 600
    assert max(len(body) for body in am.bodies("/api/v2/alerts")) == 100


def test_firing_wins_over_resolved_under_one_label_set_across_bodies(cluster, am, monkeypatch):
    """One finding on record twice, on two recipients (an Event each): open on one, resolved on the other. Whatever
    body each comes in, Alertmanager must be left with the firing one (it keeps the later post)."""
    monkeypatch.setattr(tick, "BUDGET", timedelta(minutes=10))
    monkeypatch.setattr(tick, "CHUNK_ALERTS", 1)  # every alert in a body of its own
    ledger = Ledger(Kube(cluster.api_client()), "tick-test", reason="TickTest")
    finding = Finding("tick-test", "twin", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/twin", "k",
                      {"namespace": "default", "vm": "twin"}, "critical", "Twice on record.")
    now = datetime.now(UTC)
    for name in ("aaa-first", "zzz-last"):  # the LIST's order: by name
        ledger.sighted(finding, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                 "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}}, name, now)
    [last] = [r for r in ledger.records("default") if r.name.startswith("zzz-last.")]
    assert ledger.resolve(last, "tick", now) is not None
    ping(context(cluster, am))
    now_text = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")  # as the posts write it
    twins = ["resolved" if a["endsAt"] <= now_text else "firing" for a in posted(am) if a["labels"].get("vm") == "twin"]
    assert twins == ["firing"], "the firing one, and not the resolved one after it"


def test_a_finding_resolved_while_the_tick_runs_is_not_left_firing(cluster, monkeypatch):
    """The tick reads the finding open; before it posts it, the finding is resolved and its .resolved notice reaches
    Alertmanager. The tick's firing post comes after, and Alertmanager holds the later post (docs/facts.md §11): the
    tick looks for the findings resolved while it ran and posts them resolved again, after."""
    monkeypatch.setattr(tick, "BUDGET", timedelta(minutes=10))
    notifications = Receiver().start()
    am = Alertmanager(alertmanager_binary(), notifications.url).start()
    try:
        ctx = context(cluster, am)
        ledger = Ledger(Kube(cluster.api_client()), "tick-test", reason="TickTest")
        finding = Finding("tick-test", "late", "/apis/kubevirt.io/v1/namespaces/late1/virtualmachines/vm1", "k",
                          {"namespace": "late1", "vm": "vm1"}, "critical", "Resolved while a tick runs.")
        vm = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
              "metadata": {"name": "late1-vm1", "namespace": "default", "uid": "uid-late1"}}
        opened = ledger.sighted(finding, vm, "add", datetime.now(UTC))
        assert opened is not None
        deliver(ctx, opened.reply())
        real = tick.every_record

        def meanwhile(kube, **kw):
            for record in real(kube, **kw):
                if record.finding.category == "late" and record.open:
                    ended = ledger.resolve(record, "tick", datetime.now(UTC))  # after the tick's snapshot
                    deliver(ctx, ended.reply())  # Alertmanager ends the alert
                    assert not firing(am, "late1")
                yield record  # as the tick read it: open

        monkeypatch.setattr(tick, "every_record", meanwhile)
        outcome = ping(ctx)
        assert not firing(am, "late1"), "left resolved, not fired again by the tick's snapshot"
        assert "1 resolved during the tick posted resolved again" in outcome.reason, outcome.reason
    finally:
        am.stop()
        notifications.stop()


def deliver(ctx, reply):
    return handler.on_event(Incoming(id=reply.id, type=reply.type, source="/test", subject=reply.subject,
                                     data=reply.data), ctx)


def firing(am, namespace):
    return am.api("alerts", filter=f'namespace="{namespace}"', active="true")


def test_a_tick_whose_list_fails_answers_503(monkeypatch):
    monkeypatch.setattr(tick, "version_now", lambda kube: "1")

    def failing(kube, *, cached=False):
        raise TemporaryError("GET /api/v1/events: Kubernetes API unreachable (ConnectionRefusedError)")
        yield  # pragma: no cover - a generator that fails on its first item

    monkeypatch.setattr(tick, "every_record", failing)
    am = Receiver().start()
    try:
        ctx = KubeContext(FUNCTION, Settings.from_env({"ALERTMANAGER_URL": am.url}), lambda: datetime.now(UTC),
                          None, None)  # type: ignore[arg-type]
        with pytest.raises(TemporaryError, match="unreachable"):
            ping(ctx)
    finally:
        am.stop()


def test_the_bloom_filter_never_forgets_and_rarely_imagines():
    rng = random.Random(34)
    seen = tick.Seen()
    added = [f"{rng.getrandbits(64):016x}" for _ in range(50_000)]
    for fingerprint in added:
        seen.add(fingerprint)
    assert all(seen.maybe(f) for f in added)
    imagined = sum(seen.maybe(f"{rng.getrandbits(64):016x}") for _ in range(50_000))
    assert imagined < 50_000 * 0.005, f"{imagined} false positives of 50,000 (expected about 0.24%)"

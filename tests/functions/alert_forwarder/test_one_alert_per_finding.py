"""One alert per finding, against a real Alertmanager (issue 26): for every producer, two findings of the same
category at once, whose readable labels are the same, are two alerts, and resolving one leaves the other firing;
a body holding a firing and a resolved alert under one label set posts it firing; and a resolved finding ends its
alert even when Alertmanager's clock is behind ours. alert-forwarder's handler runs in this process (no broker):
what is checked is what Alertmanager makes of its posts.

Needs Debian's `prometheus-alertmanager` (skipped without it outside CI, as test_e2e)."""
from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder import handler
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.intake import Incoming
from shared.runtime import Context
from simcluster.alertmanager import Alertmanager, Receiver
from simcluster.builders import findings as b
from tests.e2e import eventually
from tests.functions.alert_forwarder.test_e2e import alertmanager_binary

_names = itertools.count(1)
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def alertmanager():
    notifications = Receiver().start()
    am = Alertmanager(alertmanager_binary(), notifications.url).start()
    yield am
    am.stop()
    notifications.stop()


def post(am, type_, data, *, ahead=timedelta(0), min_severity="warning"):
    """One reply event through alert-forwarder's handler, with our clock `ahead` of Alertmanager's."""
    settings = Settings.from_env({"ALERTMANAGER_URL": am.url, "MIN_SEVERITY": min_severity})
    ctx = Context(FUNCTION, settings, lambda: datetime.now(UTC) + ahead)
    event = Incoming(id=f"e{next(_ids)}", type=type_, source="/vmevents/test", subject=None, data=data)
    outcome = handler.on_event(event, ctx)
    assert outcome.verdict == "forward", outcome.reason


def active(am, ns):
    return am.alerts(namespace=ns)


# Two findings of one category at once whose readable labels (namespace, vm, ...) are the same: each producer's
# own way of having them. `make(ns, which, state)` is the finding's reply data.
PRODUCERS = {
    # a holder with two stopped VMs naming its device: two findings, labels {namespace, vm=holder, device, conflict}
    "device-conflict": ("VMHostDeviceConflict",
                        lambda ns, which, state: b.device_conflict(f"{ns}/vm2", (f"{ns}/{which}",), state=state)),
    # a VMI recreated under the same name while its predecessor's episode is still open: two uids, one name
    "io-pause-report": ("VMPausedOnIOError",
                        lambda ns, which, state: b.io_pause(f"{ns}/vm1", uid=which, state=state)),
    # a migration object recreated under the same name (a retry by a script): two uids, one name
    "migration-report": ("VMMigrationFailed",
                         lambda ns, which, state: b.migration_report(f"{ns}/vm1", f"{ns}/vm1-mig", uid=which,
                                                                     state=state)),
}


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_two_findings_of_one_category_are_two_alerts_and_one_ending_leaves_the_other(alertmanager, producer):
    alertname, make = PRODUCERS[producer]
    ns = f"one{next(_names)}"
    for which in ("vm1", "vm3"):
        post(alertmanager, f"io.vmevents.{producer}.detected", make(ns, which, "detected"))
    alerts = eventually(lambda: len(active(alertmanager, ns)) == 2 and active(alertmanager, ns), what="two alerts")
    assert {a["labels"]["alertname"] for a in alerts} == {alertname}
    assert len({a["fingerprint"] for a in alerts}) == 2, "two findings, two alerts"
    post(alertmanager, f"io.vmevents.{producer}.resolved", make(ns, "vm1", "resolved"))
    (left,) = eventually(lambda: len(active(alertmanager, ns)) == 1 and active(alertmanager, ns),
                         what="one alert left")
    assert left["labels"]["finding"] == make(ns, "vm3", "detected")["identity"]["finding"], "the other one fires"
    assert left["status"]["state"] == "active"


def test_two_vmi_cleanups_of_one_vm_are_two_alerts(alertmanager):
    """vmi-cleanup's findings have no episode (reported, info): the same VM's VMI cleaned up twice within ALERT_TTL
    (two VMI uids) is two alerts, not one extended."""
    ns = f"one{next(_names)}"
    for uid in ("uid-a", "uid-b"):
        post(alertmanager, "io.vmevents.vmi-cleanup.cleaned", b.cleaned(f"{ns}/vm1", uid=uid), min_severity="info")
    alerts = eventually(lambda: len(active(alertmanager, ns)) == 2 and active(alertmanager, ns), what="two alerts")
    assert {a["labels"]["alertname"] for a in alerts} == {"VMICleanedUp"}


def test_a_summary_with_a_firing_and_a_resolved_alert_of_one_label_set_posts_it_firing(alertmanager):
    """A re-scan's summary can hold an episode that ended and one that opened under the same labels (a finding
    written by an earlier version, whose identity had no digest): Alertmanager merges a body in order, the later
    winning, so the firing one must be what it gets."""
    ns = f"one{next(_names)}"
    opened = b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",))
    ended = b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",), state="resolved")
    post(alertmanager, "io.vmevents.device-conflict.scanned",
         {"summary": "scanned", "scanned": {"vms": 3}, "findings": [opened, ended]})
    (alert,) = eventually(lambda: active(alertmanager, ns), what="the alert")
    assert alert["status"]["state"] == "active"


def test_a_resolved_alert_ends_even_when_alertmanagers_clock_is_behind(alertmanager):
    """Our clock 30 s ahead of Alertmanager's. Alertmanager keeps the later end of two posts unless the newer one
    has ended by its own clock (types.Alert.Merge): a resolution stamped with our `now` would be in its future and
    lose to the firing alert's end. alert-forwarder puts it ALERT_CLOCK_SKEW (1m) in the past."""
    ns = f"one{next(_names)}"
    ahead = timedelta(seconds=30)
    post(alertmanager, "io.vmevents.device-conflict.detected", b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",)),
         ahead=ahead)
    eventually(lambda: active(alertmanager, ns), what="the alert")
    resolved = b.device_conflict(f"{ns}/vm2", (f"{ns}/vm1",), state="resolved")
    resolved["resolvedAt"] = (datetime.now(UTC) + ahead).strftime("%Y-%m-%dT%H:%M:%SZ")  # stamped by our clock
    post(alertmanager, "io.vmevents.device-conflict.resolved", resolved, ahead=ahead)
    eventually(lambda: not active(alertmanager, ns), timeout=5, what="the alert ended at once")

"""alert-forwarder's story: findings shaped like the other functions' replies (the seed's device
conflict, a VM pausing on IO errors, a failed migration) reach a real local Alertmanager when
`prometheus-alertmanager` is installed, or the local webhook receiver otherwise; a repeat keeps one
alert, a resolution ends it, and Alertmanager's grouped notifications are shown as they arrive."""
from __future__ import annotations

import time

from simcluster.alertmanager import Alertmanager, Receiver, find_binary
from simcluster.builders import findings as b
from simcluster.play import Stage, stage, wait_until

NS = "default"
SEED_CONFLICT = b.device_conflict(f"{NS}/vm2", (f"{NS}/vm1",))  # the Harvester issue's vm1/vm2
SEED_RESOLVED = b.device_conflict(f"{NS}/vm2", (f"{NS}/vm1",), state="resolved")


def play() -> None:
    notifications, hook = Receiver().start(), Receiver().start()
    binary = find_binary()
    alertmanager = Alertmanager(binary, notifications.url, group_wait="1s").start() if binary else None
    env = {"CLUSTER_NAME": "harvester-demo", "WEBHOOK_URL": f"{hook.url}/hook", "WEBHOOK_FORMAT": "slack"}
    if alertmanager:
        env["ALERTMANAGER_URL"] = alertmanager.url
    try:
        with stage("alert-forwarder: findings to Alertmanager and a Slack-format webhook",
                   env_overrides={"alert-forwarder": env}, ping_interval=None) as s:
            _play(s, alertmanager, notifications, hook)
    finally:
        if alertmanager:
            alertmanager.stop()
        notifications.stop()
        hook.stop()


def _play(s: Stage, am: Alertmanager | None, notifications: Receiver, hook: Receiver) -> None:
    line = s.timeline.line
    if am:
        line("setup", f"Alertmanager {am.version()} on {am.url} (grouping by alertname, namespace; group_wait 1s), "
                      f"and a Slack-format webhook receiver")
    else:
        line("setup", "prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager): "
                      "findings go to the local webhook receiver only")
    shown = {"hook": 0, "am": 0}

    def publish(type_: str, data: dict, what: str, subject: str) -> None:
        line("finding", f"{type_}: {what}")
        s.knative.broker.publish(b.finding_event(type_, data, subject))
        s.knative.wait_idle(10)
        _show(s, am, notifications, hook, shown)

    publish("io.vmevents.device-conflict.detected", SEED_CONFLICT,
            "vm2 holds harvester-ktmg4-000004102 that stopped vm1 names too (the seed)", _vm("vm2"))
    publish("io.vmevents.io-pause-report.detected", b.io_pause(f"{NS}/etcd-1", pvcs=("etcd-1-disk-0",)),
            "etcd-1 flaps Running↔Paused during a Longhorn rebuild", _vmi("etcd-1"))
    publish("io.vmevents.io-pause-report.detected", b.io_pause(f"{NS}/etcd-2", pvcs=("etcd-2-disk-0",)),
            "etcd-2 too, in the same namespace", _vmi("etcd-2"))
    publish("io.vmevents.migration-report.detected", b.migration_report(f"{NS}/db", f"{NS}/db-migration-x7k2p"),
            "db's migration hit its completion timeout",
            b.VMIM_PATH.format(ns=NS, name="db-migration-x7k2p"))
    publish("io.vmevents.vmi-cleanup.cleaned", b.cleaned(f"{NS}/vm8"), "vm8's VMI removed (informational)", _vmi("vm8"))
    publish("io.vmevents.device-conflict.detected", SEED_CONFLICT, "the next re-scan sees the same conflict",
            _vm("vm2"))
    wait_until(lambda: _show(s, am, notifications, hook, shown) and (not am or shown["am"] >= 2), 8)
    publish("io.vmevents.device-conflict.resolved", SEED_RESOLVED, "vm2 stopped: the conflict is over", _vm("vm2"))
    wait_until(lambda: _show(s, am, notifications, hook, shown) and _resolved_seen(notifications), 8 if am else 0)
    time.sleep(0.2)
    _show(s, am, notifications, hook, shown)
    _summary(am)


def _vm(name: str) -> str:
    return b.VM_PATH.format(ns=NS, name=name)


def _vmi(name: str) -> str:
    return b.VMI_PATH.format(ns=NS, name=name)


def _show(s: Stage, am, notifications: Receiver, hook: Receiver, shown: dict) -> bool:
    for body in hook.bodies()[shown["hook"]:]:
        shown["hook"] += 1
        s.timeline.line("webhook", body["text"])
    if am:
        for body in notifications.bodies()[shown["am"]:]:
            shown["am"] += 1
            alerts = ", ".join(f"{a['labels'].get('vm')} {a['status']}" for a in body["alerts"])
            s.timeline.line("notify", f"Alertmanager → its receiver: group {body['groupLabels']} ({body['status']}): "
                                      f"{alerts}")
    return True


def _resolved_seen(notifications: Receiver) -> bool:
    return any(a["status"] == "resolved" for body in notifications.bodies() for a in body["alerts"])


def _summary(am: Alertmanager | None) -> None:
    if not am:
        print("\n  (no Alertmanager here: install prometheus-alertmanager to see the alerts grouped and resolved)")
        return
    print("\n  Alertmanager's active alerts now (GET /api/v2/alerts/groups):")
    for group in am.api("alerts/groups"):
        print(f"  group {group['labels']}:")
        for alert in group["alerts"]:
            labels = {k: v for k, v in alert["labels"].items() if k not in ("alertname", "namespace")}
            print(f"    {labels}  since {alert['startsAt']}, until {alert['endsAt']}")
    print("  (the device conflict is gone: resolved; VMICleanedUp is info, below MIN_SEVERITY=warning)")

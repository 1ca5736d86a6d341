"""alert-forwarder's pure part: which finding becomes which alert (the table), severities and
MIN_SEVERITY, resolution, the webhook formats, settings, and the README runbook anchors."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder.decide import TABLE, decide, generic_rule
from functions.alert_forwarder.finding import findings
from functions.alert_forwarder.settings import Receiver, Settings, read_headers
from functions.alert_forwarder.wording import slack_message, webhook_payload
from shared.errors import BadEvent
from shared.intake import Incoming
from shared.settings import SettingsError
from simcluster.builders import findings as b
from tests.conftest import REPO

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
AM = Settings(alertmanager=Receiver(("http://alertmanager:9093",)), cluster="prod")
BASE = "https://github.com/vmevents/vmevents/blob/main/README.md"


def incoming(type_, data, subject=None):
    return Incoming(id="e1", type=type_, source="/vmevents/test", subject=subject, data=data)


def alerts_for(type_, data, settings=AM, subject=None):
    return decide(type_, findings(incoming(type_, data, subject)), settings, NOW)


# -- the table, one row per finding type ------------------------------------------------------------
ROWS = [
    pytest.param("io.vmevents.device-conflict.detected", b.device_conflict(), None,
                 {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": "default", "vm": "vm2",
                  "device": "harvester-ktmg4-000004102", "conflict": "taken-while-stopped", "cluster": "prod"},
                 False, "vmhostdeviceconflict", id="device-conflict-detected"),
    pytest.param("io.vmevents.device-conflict.resolved", b.device_conflict(), None,
                 {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": "default", "vm": "vm2",
                  "device": "harvester-ktmg4-000004102", "conflict": "taken-while-stopped", "cluster": "prod"},
                 True, "vmhostdeviceconflict", id="device-conflict-resolved-same-labels"),
    pytest.param("io.vmevents.device-conflict.detected",
                 b.device_conflict(holder=None, blocked=("ns2/vm-a", "ns2/vm-b"), kind="double-assigned",
                                   severity=None), None,
                 {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": "ns2", "vm": "vm-a",
                  "device": "harvester-ktmg4-000004102", "conflict": "double-assigned", "cluster": "prod"},
                 False, "vmhostdeviceconflict", id="double-assigned-no-holder-no-severity"),
    pytest.param("io.vmevents.migration-report.failed", b.migration_report(),
                 b.VMIM_PATH.format(ns="default", name="vm1-migration-abcde"),
                 {"alertname": "VMMigrationFailed", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "migration": "vm1-migration-abcde", "cluster": "prod"},
                 False, "vmmigrationfailed", id="migration-failed"),
    pytest.param("io.vmevents.migration-report.failed", {"vmi": "default/vm1", "category": "unknown",
                                                         "summary": "Migration failed."},
                 b.VMIM_PATH.format(ns="default", name="mig-from-subject"),
                 {"alertname": "VMMigrationFailed", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "migration": "mig-from-subject", "cluster": "prod"},
                 False, "vmmigrationfailed", id="migration-name-from-the-subject"),
    pytest.param("io.vmevents.migration-report.near-timeout",
                 b.migration_report(category=None, phase="Succeeded"), None,
                 {"alertname": "VMMigrationNearTimeout", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "migration": "vm1-migration-abcde", "cluster": "prod"},
                 False, "vmmigrationneartimeout", id="migration-near-timeout"),
    pytest.param("io.vmevents.io-pause-report.detected", b.io_pause(pvcs=("vm1-disk-1", "vm1-disk-0")), None,
                 {"alertname": "VMPausedOnIOError", "severity": "critical", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0,vm1-disk-1", "cluster": "prod"},
                 False, "vmpausedonioerror", id="io-pause-detected-volumes-sorted"),
    pytest.param("io.vmevents.io-pause-report.resolved", b.io_pause(pvcs=("vm1-disk-0", "vm1-disk-1")), None,
                 {"alertname": "VMPausedOnIOError", "severity": "critical", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0,vm1-disk-1", "cluster": "prod"},
                 True, "vmpausedonioerror", id="io-pause-resolved"),
    pytest.param("io.vmevents.io-pause-report.detected", b.io_pause(severity="Warn"), None,
                 {"alertname": "VMPausedOnIOError", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0", "cluster": "prod"},
                 False, "vmpausedonioerror", id="severity-from-the-finding-wins-aliases-understood"),
    pytest.param("io.vmevents.new-function.detected", {"vmi": "ns3/vm9", "summary": "Something new.",
                                                        "severity": "critical"}, None,
                 {"alertname": "VmeventsNewFunctionDetected", "severity": "critical", "namespace": "ns3", "vm": "vm9",
                  "cluster": "prod"},
                 False, "other-findings", id="unknown-type-forwarded-generically"),
    pytest.param("io.vmevents.new-function.resolved", {"vmi": "ns3/vm9", "severity": "critical"}, None,
                 {"alertname": "VmeventsNewFunctionDetected", "severity": "critical", "namespace": "ns3", "vm": "vm9",
                  "cluster": "prod"},
                 True, "other-findings", id="unknown-resolved-ends-its-detected"),
]


@pytest.mark.parametrize("type_,data,subject,labels,resolved,anchor", ROWS)
def test_each_finding_becomes_one_alert_with_stable_labels(type_, data, subject, labels, resolved, anchor):
    verdict = alerts_for(type_, data, subject=subject)
    assert verdict.action == "forward", verdict.reason
    (alert,) = verdict.alerts
    assert alert.labels == labels
    assert alert.resolved is resolved
    assert alert.starts_at == NOW
    until_resolved = type_.endswith(".detected") and type_.replace(".detected", ".resolved") in TABLE
    assert alert.ends_at == (NOW if resolved else NOW + (timedelta(days=7) if until_resolved else timedelta(hours=1)))
    assert alert.annotations["runbook_url"] == f"{BASE}#{anchor}"
    assert alert.annotations["summary"] and alert.annotations["description"]


def test_summaries_are_sentences_an_operator_can_act_on():
    conflict = alerts_for("io.vmevents.device-conflict.detected", b.device_conflict()).alerts[0].annotations
    assert conflict["summary"] == ("default/vm2 holds harvester-ktmg4-000004102 "
                                   "(intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION) on harvester-ktmg4; "
                                   "default/vm1 names it too and cannot start while it runs.")
    blocked = alerts_for("io.vmevents.device-conflict.detected", b.device_conflict(kind="start-blocked")).alerts[0]
    assert blocked.annotations["summary"].startswith("VM default/vm1 cannot start: default/vm2 holds")
    migration = alerts_for("io.vmevents.migration-report.failed", b.migration_report()).alerts[0].annotations
    assert migration["summary"].startswith("Migration default/vm1-migration-abcde of VMI default/vm1 failed")
    assert "- apply MigrationPolicy vm1-migration: Let KubeVirt auto-converge." in migration["description"]
    io = alerts_for("io.vmevents.io-pause-report.detected", b.io_pause()).alerts[0].annotations
    assert io["summary"] == "VM default/vm1 paused 3 time(s) on IO errors (rebuild-related)."
    assert "vm1-disk-0 → Longhorn volume pvc-0 (robustness degraded, rebuilding 42%)" in io["description"]
    assert "Disable fstrim.timer" in io["description"]


def test_a_finding_message_from_the_function_wins_over_ours():
    data = b.device_conflict(message="vm2 holds the NIC; stop vm2 or give vm1 another VF.")
    assert alerts_for("io.vmevents.device-conflict.detected", data).alerts[0].annotations["summary"] == data["message"]


def test_the_same_finding_again_gives_the_same_labels():
    first = alerts_for("io.vmevents.device-conflict.detected", b.device_conflict())
    again = decide("io.vmevents.device-conflict.detected",
                   findings(incoming("io.vmevents.device-conflict.detected", b.device_conflict())), AM,
                   NOW + timedelta(minutes=5))
    assert first.alerts[0].labels == again.alerts[0].labels
    assert again.alerts[0].ends_at == NOW + timedelta(minutes=5, days=7)


@pytest.mark.parametrize("type_,data,lasts", [
    ("io.vmevents.device-conflict.detected", b.device_conflict(), timedelta(days=7)),
    ("io.vmevents.io-pause-report.detected", b.io_pause(), timedelta(days=7)),
    ("io.vmevents.migration-report.failed", b.migration_report(), timedelta(hours=1)),
], ids=["device-conflict-until-resolved", "io-pause-until-resolved", "one-off-migration-failure-expires"])
def test_findings_reported_once_per_episode_stay_firing_until_resolved(type_, data, lasts):
    """device-conflict and io-pause-report do not repeat a finding while it lasts; they send .resolved."""
    assert alerts_for(type_, data).alerts[0].ends_at == NOW + lasts


# -- severities and drops ---------------------------------------------------------------------------
@pytest.mark.parametrize("type_,data,min_severity,action", [
    ("io.vmevents.vmi-cleanup.cleaned", b.cleaned(), "warning", "drop"),
    ("io.vmevents.vmi-cleanup.cleaned", b.cleaned(), "info", "forward"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(), "warning", "forward"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(), "critical", "drop"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(severity="critical"), "critical", "forward"),
    ("io.vmevents.device-conflict.resolved", b.device_conflict(severity="info"), "warning", "drop"),
    ("io.vmevents.io-pause-report.detected", b.io_pause(severity="bogus"), "critical", "forward"),
    ("io.vmevents.alert-forwarder.anything", {"x": 1}, "info", "drop"),
], ids=["cleaned-info-below-default", "cleaned-with-min-info", "conflict-warning", "conflict-below-critical",
        "conflict-critical-by-data", "resolved-below-min-dropped-too", "unknown-severity-uses-type-default",
        "own-events-never-loop"])
def test_min_severity_and_drops(type_, data, min_severity, action):
    settings = Settings(alertmanager=AM.alertmanager, min_severity=min_severity)
    assert alerts_for(type_, data, settings).action == action


def test_no_receiver_configured_drops_and_says_what_it_would_have_sent():
    verdict = alerts_for("io.vmevents.device-conflict.detected", b.device_conflict(), Settings())
    assert verdict.action == "drop"
    assert "no receiver configured" in verdict.reason and "VMHostDeviceConflict default/vm2" in verdict.reason


def test_a_rescan_summary_becomes_one_alert_per_finding_it_carries():
    cleaned = findings(incoming("io.vmevents.vmi-cleanup.scanned",
                                {"scanned": 5, "cleaned": [b.cleaned("default/a"), b.cleaned("default/b")]}))
    assert [(f.type, f.data["vmi"]) for f in cleaned] == [("io.vmevents.vmi-cleanup.cleaned", "default/a"),
                                                          ("io.vmevents.vmi-cleanup.cleaned", "default/b")]
    reported = findings(incoming("io.vmevents.migration-report.scanned", {"scanned": 9, "reported": [
        {"type": "io.vmevents.migration-report.failed", **b.migration_report()}]}))
    verdict = decide("io.vmevents.migration-report.scanned", reported, AM, NOW)
    assert [a.labels["alertname"] for a in verdict.alerts] == ["VMMigrationFailed"]
    assert verdict.alerts[0].labels["migration"] == "vm1-migration-abcde"


def test_a_batch_of_changes_becomes_one_alert_per_change():
    batch = findings(incoming("io.vmevents.device-conflict.batch", {
        "detected": [dict(b.device_conflict(device="dev-a"), id="1")],
        "resolved": [dict(b.device_conflict(device="dev-b"), id="2")]}))
    verdict = decide("io.vmevents.device-conflict.batch", batch, AM, NOW)
    assert [(a.labels["device"], a.resolved) for a in verdict.alerts] == [("dev-a", False), ("dev-b", True)]
    paused = findings(incoming("io.vmevents.io-pause-report.scanned", {"scanned": 3, "findings": [
        {"type": "io.vmevents.io-pause-report.detected", "subject": "/x", **b.io_pause()}]}))
    assert [(f.type, f.subject) for f in paused] == [("io.vmevents.io-pause-report.detected", "/x")]


@pytest.mark.parametrize("type_,data,fragment", [
    ("io.vmevents.device-conflict.detected", ["not", "an", "object"], "no JSON object as data"),
    ("io.vmevents.device-conflict.detected", None, "no JSON object as data"),
    ("io.vmevents.device-conflict.detected", "text", "no JSON object as data"),
    ("com.example.other", {}, "unsupported event type"),
    ("io.vmevents.vmi-cleanup.scanned", {"cleaned": "x"}, "must be a list of objects"),
    ("io.vmevents.migration-report.scanned", {"reported": [{"vmi": "a/b"}]}, "no io.vmevents.* type"),
], ids=["list", "no-data", "string", "foreign-type", "scanned-not-a-list", "scanned-item-without-type"])
def test_what_is_not_a_finding_is_refused(type_, data, fragment):
    with pytest.raises(BadEvent, match=re.escape(fragment)):
        findings(incoming(type_, data))


# -- the webhook formats ----------------------------------------------------------------------------
def test_json_webhook_is_alertmanagers_own_payload_with_the_finding():
    event = incoming("io.vmevents.device-conflict.detected", b.device_conflict(), "/some/path")
    alert = decide(event.type, findings(event), AM, NOW).alerts[0]
    payload = webhook_payload(alert, event, AM)
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert payload["alerts"][0]["labels"] == alert.labels
    assert payload["alerts"][0]["startsAt"] == "2026-11-30T12:00:00.000Z"
    assert payload["finding"]["type"] == event.type and payload["finding"]["data"] == event.data


def test_slack_message_reads_well_in_a_channel_and_escapes_mrkdwn():
    event = incoming("io.vmevents.io-pause-report.detected", b.io_pause(summary="VM <vm1> & friends paused."))
    alert = decide(event.type, findings(event), AM, NOW).alerts[0]
    message = slack_message(alert, event, AM)
    text = message["blocks"][0]["text"]["text"]
    assert text.startswith(":red_circle: *CRITICAL: VMPausedOnIOError* default/vm1 [volume=vm1-disk-0] on cluster prod")
    assert "VM &lt;vm1&gt; &amp; friends paused." in text
    assert f"<{BASE}#vmpausedonioerror|Runbook>" in text
    assert message["text"].startswith(":red_circle: CRITICAL: VMPausedOnIOError default/vm1")
    resolved = decide("io.vmevents.io-pause-report.resolved",
                      findings(incoming("io.vmevents.io-pause-report.resolved", b.io_pause())), AM, NOW).alerts[0]
    assert slack_message(resolved, event, AM)["blocks"][0]["text"]["text"].startswith(
        ":white_check_mark: *RESOLVED: VMPausedOnIOError*")


# -- settings ---------------------------------------------------------------------------------------
def test_settings_defaults_and_credentials_from_files(tmp_path):
    token, headers, ca = tmp_path / "token", tmp_path / "headers", tmp_path / "ca.crt"
    token.write_text("s3cret\n")
    headers.write_text("# a comment\nAuthorization: Bearer abc\n\nX-Team: vm-ops\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = Settings.from_env({"ALERTMANAGER_URL": "https://am-0:9093/, https://am-1:9093",
                                  "ALERTMANAGER_BEARER_TOKEN_FILE": str(token), "ALERTMANAGER_CA_FILE": str(ca),
                                  "WEBHOOK_URL": "https://hooks.example/x", "WEBHOOK_HEADERS_FILE": str(headers),
                                  "WEBHOOK_INSECURE_SKIP_VERIFY": "true", "WEBHOOK_FORMAT": "slack"})
    assert settings.alertmanager == Receiver(("https://am-0:9093", "https://am-1:9093"), str(token), str(ca))
    assert settings.webhook == Receiver(("https://hooks.example/x",), str(headers), False)
    assert read_headers(str(headers)) == {"Authorization": "Bearer abc", "X-Team": "vm-ops"}
    defaults = Settings.from_env({})
    assert (defaults.alertmanager, defaults.webhook, defaults.min_severity, defaults.alert_ttl) == \
        (None, None, "warning", timedelta(hours=1))
    assert Settings.from_env({"ALERTMANAGER_URL": "http://am:9093"}).alertmanager.verify is True


@pytest.mark.parametrize("environ,message", [
    ({"ALERTMANAGER_URL": "alertmanager:9093"}, "ALERTMANAGER_URL='alertmanager:9093' is not an http(s) URL"),
    ({"WEBHOOK_URL": "http://a,http://b"}, "WEBHOOK_URL holds several URLs"),
    ({"WEBHOOK_FORMAT": "teams"}, "WEBHOOK_FORMAT='teams' is not one of json, slack"),
    ({"MIN_SEVERITY": "high"}, "MIN_SEVERITY='high' is not one of info, warning, critical"),
    ({"ALERT_TTL": "0s"}, "ALERT_TTL must be longer than 0s"),
    ({"ALERTMANAGER_URL": "http://am", "ALERTMANAGER_BEARER_TOKEN_FILE": "/nonexistent/token"},
     "ALERTMANAGER_BEARER_TOKEN_FILE='/nonexistent/token' cannot be used"),
    ({"ALERTMANAGER_URL": "http://am", "ALERTMANAGER_INSECURE_SKIP_VERIFY": "maybe"},
     "ALERTMANAGER_INSECURE_SKIP_VERIFY='maybe' is not a boolean"),
], ids=["url-without-scheme", "two-webhooks", "unknown-format", "unknown-severity", "zero-ttl", "missing-token-file",
        "bad-boolean"])
def test_bad_settings_name_the_variable(environ, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.from_env(environ)


def test_a_headers_file_that_is_not_name_value_lines_stops_the_start(tmp_path):
    bad = tmp_path / "headers"
    bad.write_text("Bearer abc\n")
    with pytest.raises(SettingsError, match="line 1 is not `Name: value`"):
        Settings.from_env({"WEBHOOK_URL": "http://hook", "WEBHOOK_HEADERS_FILE": str(bad)})


# -- the runbooks exist -----------------------------------------------------------------------------
def github_anchors(markdown: str) -> set[str]:
    """GitHub's heading slugs: lowercase, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_every_runbook_url_points_at_a_readme_heading():
    anchors = github_anchors((REPO / "README.md").read_text())
    wanted = {rule.runbook for rule in TABLE.values()} | {generic_rule("io.vmevents.x.y").runbook}
    assert wanted <= anchors, sorted(wanted - anchors)

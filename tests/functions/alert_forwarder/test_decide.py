"""alert-forwarder's pure part: which finding becomes which alert (the table), severities and
MIN_SEVERITY, resolution, the webhook formats, settings, and the README runbook anchors."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder.decide import TABLE, Facts, Verdict, decide
from functions.alert_forwarder.received import findings
from functions.alert_forwarder.settings import Receiver, Settings, read_headers
from functions.alert_forwarder.wording import dropped, notes_of, slack_message, webhook_payload
from shared.errors import BadEvent
from shared.finding import digest
from shared.intake import Incoming
from shared.settings import SettingsError
from simcluster.builders import findings as b
from tests.conftest import REPO

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
AM = Settings(alertmanager=Receiver(("http://alertmanager:9093",)), cluster="prod")
BASE = "https://github.com/vmevents/vmevents/blob/main/README.md"
SUBJECT = "/api/v1/namespaces/ns4/things/x"


def incoming(type_, data, subject=None):
    return Incoming(id="e1", type=type_, source="/vmevents/test", subject=subject, data=data)


def alerts_for(type_, data, settings=AM, subject=None, now=NOW):
    return decide(Facts(type_, findings(incoming(type_, data, subject))), settings, now)


def sent(verdict: Verdict, settings=AM):
    """The alerts the first receiver is sent, with their annotations as Alertmanager gets them."""
    return [(alert, notes_of(alert, settings)) for plan in verdict.plans for alert in plan.sends[0].alerts]


# -- the table, one row per category ---------------------------------------------------------------
DEVICE = {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": "default", "vm": "vm2",
          "device": "harvester-ktmg4-000004102", "conflict": "taken-while-stopped", "cluster": "prod"}
ROWS = [
    pytest.param("io.vmevents.device-conflict.detected", b.device_conflict(), DEVICE, False, "vmhostdeviceconflict",
                 timedelta(minutes=4), id="device-conflict-detected"),
    pytest.param("io.vmevents.device-conflict.resolved", b.device_conflict(state="resolved"), DEVICE,
                 True, "vmhostdeviceconflict", -timedelta(minutes=1), id="device-conflict-resolved-same-labels"),
    pytest.param("io.vmevents.device-conflict.detected",
                 b.device_conflict(holder=None, blocked=("ns2/vm-a", "ns2/vm-b"), kind="double-assigned",
                                   severity=None),
                 {"alertname": "VMHostDeviceConflict", "severity": "warning", "namespace": "ns2", "vm": "vm-a",
                  "device": "harvester-ktmg4-000004102", "conflict": "double-assigned", "cluster": "prod"},
                 False, "vmhostdeviceconflict", timedelta(minutes=4), id="double-assigned-no-holder-no-severity"),
    pytest.param("io.vmevents.migration-report.detected", b.migration_report(),
                 {"alertname": "VMMigrationFailed", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "migration": "vm1-migration-abcde", "cluster": "prod"},
                 False, "vmmigrationfailed", timedelta(minutes=4), id="migration-failed"),
    pytest.param("io.vmevents.migration-report.detected", b.migration_report(category="near-timeout",
                                                                             phase="Succeeded"),
                 {"alertname": "VMMigrationNearTimeout", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "migration": "vm1-migration-abcde", "cluster": "prod"},
                 False, "vmmigrationneartimeout", timedelta(minutes=4), id="migration-near-timeout"),
    pytest.param("io.vmevents.io-pause-report.detected", b.io_pause(pvcs=("vm1-disk-1", "vm1-disk-0")),
                 {"alertname": "VMPausedOnIOError", "severity": "critical", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0,vm1-disk-1", "cluster": "prod"},
                 False, "vmpausedonioerror", timedelta(minutes=4), id="io-pause-detected-volumes-sorted"),
    pytest.param("io.vmevents.io-pause-report.resolved", b.io_pause(pvcs=("vm1-disk-0", "vm1-disk-1"),
                                                                    state="resolved"),
                 {"alertname": "VMPausedOnIOError", "severity": "critical", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0,vm1-disk-1", "cluster": "prod"},
                 True, "vmpausedonioerror", -timedelta(minutes=1), id="io-pause-resolved"),
    pytest.param("io.vmevents.io-pause-report.detected", b.io_pause(severity="Warn"),
                 {"alertname": "VMPausedOnIOError", "severity": "warning", "namespace": "default", "vm": "vm1",
                  "volume": "vm1-disk-0", "cluster": "prod"},
                 False, "vmpausedonioerror", timedelta(minutes=4),
                 id="severity-from-the-finding-wins-aliases-understood"),
    pytest.param("io.vmevents.vmi-cleanup.cleaned", b.cleaned(),
                 {"alertname": "VMICleanedUp", "severity": "info", "namespace": "default", "vm": "vm1",
                  "cluster": "prod"},
                 False, "vmicleanedup", timedelta(hours=1), id="reported-finding-expires"),
    pytest.param("io.vmevents.new-function.detected",
                 {"category": "disk-on-fire", "identity": {"namespace": "ns3", "vm": "vm9"},
                  "summary": "Something new.", "severity": "critical", "state": "detected"},
                 {"alertname": "VmeventsNewFunctionDiskOnFire", "severity": "critical", "namespace": "ns3",
                  "vm": "vm9", "cluster": "prod"},
                 False, "other-findings", timedelta(minutes=4), id="unknown-category-forwarded-generically"),
    pytest.param("io.vmevents.new-function.resolved",
                 {"category": "disk-on-fire", "identity": {"namespace": "ns3", "vm": "vm9"}, "severity": "critical",
                  "state": "resolved"},
                 {"alertname": "VmeventsNewFunctionDiskOnFire", "severity": "critical", "namespace": "ns3",
                  "vm": "vm9", "cluster": "prod"},
                 True, "other-findings", -timedelta(minutes=1), id="unknown-resolved-ends-its-detected"),
    pytest.param("io.vmevents.new-function.noticed", {"anything": 1},
                 {"alertname": "VmeventsNewFunctionNoticed", "severity": "warning", "namespace": "ns4", "name": "x",
                  "cluster": "prod"},
                 False, "other-findings", timedelta(hours=1), id="not-even-the-schema-still-an-alert"),
]


@pytest.mark.parametrize("type_,data,labels,resolved,anchor,lasts", ROWS)
def test_each_finding_becomes_one_alert_labelled_by_its_identity(type_, data, labels, resolved, anchor, lasts):
    settings = Settings(alertmanager=AM.alertmanager, cluster="prod", min_severity="info")
    verdict = alerts_for(type_, data, settings, subject=SUBJECT)
    assert verdict.action == "forward", dropped(verdict, settings)
    ((alert, annotations),) = sent(verdict, settings)
    function, _, what = type_.removeprefix("io.vmevents.").partition(".")
    assert alert.labels == {**labels, "finding": digest(data.get("function") or function, data.get("category") or what,
                                                        data.get("subject") or SUBJECT, data.get("key") or "")}
    assert alert.resolved is resolved
    # A detected or resolved finding's alert starts when its episode opened; a reported one when it is posted.
    opened = datetime.fromisoformat(data["openedAt"]) if data.get("openedAt") and lasts != timedelta(hours=1) else NOW
    assert alert.starts_at == min(opened, NOW + lasts)
    assert alert.ends_at == NOW + lasts
    assert annotations["runbook_url"] == f"{BASE}#{anchor}"
    assert annotations["summary"] and annotations["description"]


def test_summary_is_the_findings_sentence_and_the_description_its_advice_and_details():
    migration = sent(alerts_for("io.vmevents.migration-report.detected", b.migration_report()))[0][1]
    assert migration["summary"].startswith("Migration default/vm1-migration-abcde of VMI default/vm1 failed")
    assert "- apply MigrationPolicy vm1-migration: Let KubeVirt auto-converge." in migration["description"]
    io = sent(alerts_for("io.vmevents.io-pause-report.detected", b.io_pause()))[0][1]
    assert io["summary"] == "VMI default/vm1 pauses on IO errors (rebuild-related), 3 pause(s) so far."
    assert "Disable fstrim.timer" in io["description"] and '"pvc":"vm1-disk-0"' in io["description"]
    bare = sent(alerts_for("io.vmevents.device-conflict.detected", dict(b.device_conflict(), summary="")))[0][1]
    assert bare["summary"] == ("taken-while-stopped now on default/vm2 [conflict=taken-while-stopped, "
                                           "device=harvester-ktmg4-000004102] (device-conflict).")


def test_a_field_a_producer_adds_changes_nothing_but_the_description():
    (plain, plain_notes), = sent(alerts_for("io.vmevents.device-conflict.detected", b.device_conflict()))
    (more, more_notes), = sent(alerts_for("io.vmevents.device-conflict.detected", b.device_conflict(gpuModel="A100")))
    assert more.labels == plain.labels and more_notes["summary"] == plain_notes["summary"]
    assert "gpuModel: A100" in more_notes["description"]


def test_the_same_finding_again_gives_the_same_labels():
    (first, _), = sent(alerts_for("io.vmevents.device-conflict.detected", b.device_conflict()))
    (again, _), = sent(alerts_for("io.vmevents.device-conflict.detected", b.device_conflict(),
                                  now=NOW + timedelta(minutes=5)))
    assert first.labels == again.labels
    assert again.ends_at == NOW + timedelta(minutes=5 + 4), "ALERT_VALID_FOR after each post"


# -- severities and drops ---------------------------------------------------------------------------
@pytest.mark.parametrize("type_,data,min_severity,action", [
    ("io.vmevents.vmi-cleanup.cleaned", b.cleaned(), "warning", "drop"),
    ("io.vmevents.vmi-cleanup.cleaned", b.cleaned(), "info", "forward"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(), "warning", "forward"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(), "critical", "drop"),
    ("io.vmevents.device-conflict.detected", b.device_conflict(severity="critical"), "critical", "forward"),
    ("io.vmevents.device-conflict.resolved", b.device_conflict(severity="info", state="resolved"), "warning", "drop"),
    ("io.vmevents.io-pause-report.detected", b.io_pause(severity="bogus"), "critical", "forward"),
    ("io.vmevents.alert-forwarder.anything", {"x": 1}, "info", "drop"),
], ids=["cleaned-info-below-default", "cleaned-with-min-info", "conflict-warning", "conflict-below-critical",
        "conflict-critical-by-data", "resolved-below-min-dropped-too", "unknown-severity-uses-the-table-default",
        "own-events-never-loop"])
def test_min_severity_and_drops(type_, data, min_severity, action):
    settings = Settings(alertmanager=AM.alertmanager, min_severity=min_severity)
    assert alerts_for(type_, data, settings).action == action


def test_no_receiver_configured_drops_and_says_what_it_would_have_sent():
    verdict = alerts_for("io.vmevents.device-conflict.detected", b.device_conflict(), Settings())
    assert verdict.action == "drop"
    reason = dropped(verdict, Settings())
    assert "no receiver configured" in reason and "VMHostDeviceConflict default/vm2" in reason


def test_a_summary_becomes_one_alert_per_finding_it_carries():
    """Re-scan summaries and device-conflict's batch have one shape: {summary, scanned, findings[]}."""
    cleaned = findings(incoming("io.vmevents.vmi-cleanup.scanned", {"summary": "2 cleaned", "scanned": {"vmis": 5},
                                                                    "findings": [b.cleaned("default/a"),
                                                                                 b.cleaned("default/b")]}))
    assert [(f.category, f.identity["vm"]) for f in cleaned] == [("vmi-cleaned-up", "a"), ("vmi-cleaned-up", "b")]
    batch = findings(incoming("io.vmevents.device-conflict.batch", {"summary": "", "findings": [
        dict(b.device_conflict(device="dev-a"), id="1"), dict(b.device_conflict(device="dev-b", state="resolved"),
                                                              id="2")]}))
    verdict = decide(Facts("io.vmevents.device-conflict.batch", batch), AM, NOW)
    assert [(a.labels["device"], a.resolved) for a, _ in sent(verdict)] == [("dev-a", False), ("dev-b", True)]
    mixed = findings(incoming("io.vmevents.io-pause-report.scanned", {"findings": [
        b.io_pause(), b.migration_report()]}))
    assert [f.function for f in mixed] == ["io-pause-report", "migration-report"]


@pytest.mark.parametrize("type_,data,fragment", [
    ("io.vmevents.device-conflict.detected", ["not", "an", "object"], "no JSON object as data"),
    ("io.vmevents.device-conflict.detected", None, "no JSON object as data"),
    ("io.vmevents.device-conflict.detected", "text", "no JSON object as data"),
    ("com.example.other", {}, "unsupported event type"),
    ("io.vmevents.vmi-cleanup.scanned", {"findings": "x"}, "must be a list of objects"),
    ("io.vmevents.migration-report.scanned", {"findings": [1]}, "must be a list of objects"),
    ("io.vmevents.device-conflict.detected", {"details": __import__("functools").reduce(
        lambda inner, _: {"k": [inner]}, range(200), {})}, "data nested deeper than 64 levels"),
], ids=["list", "no-data", "string", "foreign-type", "summary-not-a-list", "summary-item-not-an-object",
        "nested-too-deep"])
def test_what_is_not_a_finding_is_refused(type_, data, fragment):
    with pytest.raises(BadEvent, match=re.escape(fragment)):
        findings(incoming(type_, data))


# -- the webhook formats ----------------------------------------------------------------------------
def test_json_webhook_is_alertmanagers_own_payload_with_the_finding():
    event = incoming("io.vmevents.device-conflict.detected", b.device_conflict(), "/some/path")
    ((alert, _),) = sent(decide(Facts(event.type, findings(event)), AM, NOW))
    payload = webhook_payload(alert, event, AM)
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert payload["alerts"][0]["labels"] == alert.labels
    assert payload["alerts"][0]["startsAt"] == "2026-11-30T11:58:00.000Z", "when its episode opened"
    assert payload["finding"]["type"] == event.type and payload["finding"]["data"] == event.data


def test_slack_message_reads_well_in_a_channel_and_escapes_mrkdwn():
    event = incoming("io.vmevents.io-pause-report.detected", dict(b.io_pause(), summary="VM <vm1> & friends paused."))
    ((alert, _),) = sent(decide(Facts(event.type, findings(event)), AM, NOW))
    message = slack_message(alert, event, AM)
    text = message["blocks"][0]["text"]["text"]
    assert text.startswith(":red_circle: *CRITICAL: VMPausedOnIOError* default/vm1 [volume=vm1-disk-0] on cluster prod")
    assert "VM &lt;vm1&gt; &amp; friends paused." in text
    assert f"<{BASE}#vmpausedonioerror|Runbook>" in text
    assert message["text"].startswith(":red_circle: CRITICAL: VMPausedOnIOError default/vm1")
    ((resolved, _),) = sent(alerts_for("io.vmevents.io-pause-report.resolved", b.io_pause(state="resolved")))
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
    wanted = {kind.runbook for kind in TABLE.values()} | {"other-findings"}
    assert wanted <= anchors, sorted(wanted - anchors)


# -- findings as the producers' own code builds them --------------------------------------------------------
def _producers_findings():
    """One finding from each producer's own wording.finding, as its reply data."""
    from functions.device_conflict.decide import find_conflicts
    from functions.device_conflict.index import Index
    from functions.device_conflict.wording import finding as device_finding
    from functions.io_pause_report.decide import Facts as IoFacts
    from functions.io_pause_report.decide import KubeVirtErrors, VolumeFacts
    from functions.io_pause_report.decide import decide as io_decide
    from functions.io_pause_report.settings import Settings as IoSettings
    from functions.io_pause_report.wording import advice, event_message
    from functions.io_pause_report.wording import finding as io_finding
    from functions.migration_report.decide import decide as migration_decide
    from functions.migration_report.settings import Settings as MigrationSettings
    from functions.migration_report.wording import finding as migration_finding
    from functions.migration_report.wording import reply_data
    from functions.vmi_cleanup.decide import Action, Verdict
    from functions.vmi_cleanup.wording import finding as cleanup_finding
    from simcluster.builders import io_pause, kubevirt, migration
    from simcluster.builders.devices import seed_vm1, seed_vm2
    from tests.functions.migration_report.test_decide import facts as migration_facts

    index = Index()
    for vm in (seed_vm1(), seed_vm2()):
        index.add_vm(vm)
    vmi2 = dict(seed_vm2(), kind="VirtualMachineInstance", spec=seed_vm2()["spec"]["template"]["spec"],
                status={"phase": "Running", "nodeName": "harvester-ktmg4"})
    index.add_vmi(vmi2)
    [conflict] = find_conflicts(index.workloads())
    yield "device-conflict", device_finding(conflict).data("detected")

    volume = VolumeFacts("disk-0", pvc="vm1-disk-0", pv="pv-1", longhorn_volume="pv-1", robustness="degraded",
                         rebuilding=True, progress=40)
    facts = IoFacts((volume,), KubeVirtErrors(2, ("disk-0",), None, io_pause.NOW), vmi=io_pause.make_vmi())
    io_verdict = io_decide(facts, IoSettings(), io_pause.NOW)
    advised = advice(io_verdict, facts, IoSettings())
    yield "io-pause-report", io_finding(io_verdict, "default/vm1", "default/vm1", "vmi-uid-1", advised,
                                        event_message(io_verdict, "default/vm1", advised)).data("detected")

    mfacts = migration_facts(reason=migration.STUCK.format(150))
    mverdict = migration_decide(mfacts, MigrationSettings(), migration.NOW)
    yield "migration-report", migration_finding(reply_data(mverdict, mfacts, MigrationSettings()), mfacts,
                                                "failed").data("detected")

    cleaned = kubevirt.make_vmi("vm3")
    yield "vmi-cleanup", cleanup_finding("deleted-vmi", cleaned, None,
                                         Verdict(Action.DELETE_VMI, "runStrategy Manual", "Manual")).data("reported")


def test_every_producers_finding_becomes_its_alert_through_the_one_schema():
    settings = Settings(alertmanager=AM.alertmanager, cluster="prod", min_severity="info")
    names = {}
    for function, data in _producers_findings():
        ((alert, annotations),) = sent(alerts_for(f"io.vmevents.{function}.{data['state']}", data, settings), settings)
        assert {k: v for k, v in alert.labels.items() if k not in ("alertname", "severity", "cluster")} == {
            k: v for k, v in data["identity"].items() if v}
        assert annotations["summary"] == data["summary"]
        names[function] = alert.labels["alertname"]
    assert names == {"device-conflict": "VMHostDeviceConflict", "io-pause-report": "VMPausedOnIOError",
                     "migration-report": "VMMigrationFailed", "vmi-cleanup": "VMICleanedUp"}


# -- the tick: what Alertmanager must hold, from the findings on record ------------------------------
def refresh(on_record, settings, now):
    return decide(Facts("dev.knative.sources.ping", on_record, tick=True), settings, now)


def test_a_tick_reposts_the_open_findings_and_the_recently_resolved_ones_only():
    from functions.alert_forwarder.received import on_record

    opened = NOW - timedelta(hours=2)
    open_one = on_record(b.device_conflict(), "detected", opened, None)
    just_ended = on_record(b.io_pause(state="resolved"), "resolved", opened, NOW - timedelta(minutes=5))
    long_ended = on_record(b.migration_report(state="resolved"), "resolved", opened, NOW - timedelta(minutes=16))
    info = on_record(b.cleaned(), "detected", opened, None)
    verdict = refresh([open_one, just_ended, long_ended, info], AM, NOW)
    assert verdict.action == "refresh"
    by_name = {a.labels["alertname"]: a for a in verdict.alerts}
    assert set(by_name) == {"VMHostDeviceConflict", "VMPausedOnIOError"}, "ended > ALERT_RESOLVED_FOR ago, or below"
    firing, ended = by_name["VMHostDeviceConflict"], by_name["VMPausedOnIOError"]
    assert (firing.starts_at, firing.ends_at, firing.resolved) == (opened, NOW + timedelta(minutes=4), False)
    assert (ended.ends_at, ended.resolved) == (NOW - timedelta(minutes=6), True), "its resolution less ALERT_CLOCK_SKEW"
    assert refresh([open_one], Settings(webhook=AM.alertmanager), NOW).action == "drop", "webhooks get notices only"


def test_one_body_holds_one_alert_per_label_set_the_firing_one_winning():
    from functions.alert_forwarder.decide import one_per_labels

    event = incoming("io.vmevents.device-conflict.scanned", {"findings": [
        b.device_conflict(), b.device_conflict(state="resolved"), b.device_conflict(blocked=("default/vm3",))]})
    alerts = [alert for alert, _ in sent(decide(Facts(event.type, findings(event)), AM, NOW))]
    assert len(alerts) == 3, "each finding is its own alert (and its own webhook message)"
    kept = one_per_labels(alerts)
    assert len(kept) == 2 and not any(a.resolved for a in kept)


@pytest.mark.parametrize("env,word", [({"ALERT_VALID_FOR": "1m"}, "ALERT_VALID_FOR"),
                                      ({"ALERT_RESOLVED_FOR": "30s"}, "ALERT_RESOLVED_FOR"),
                                      ({"ALERT_CLOCK_SKEW": "1h"}, "ALERT_CLOCK_SKEW")])
def test_alert_lifetimes_that_cannot_work_stop_the_start(env, word):
    with pytest.raises(SettingsError, match=word):
        Settings.from_env(env)

"""alert-forwarder through HTTP, as functions-framework serves it, against a local webhook receiver:
binary, structured and malformed CloudEvents; credentials from files; a receiver that is down (503)
or refuses (502). It has no Kubernetes client at all: KUBECONFIG points at a refusing server, and
nothing needs it."""
from __future__ import annotations

import json

import pytest
from cloudevents.conversion import to_binary, to_structured

from simcluster.alertmanager import Receiver
from simcluster.builders import findings as b
from tests.http_cases import MALFORMED, assert_refused, binary_headers, post

FINDING = "io.vmevents.device-conflict.detected"


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_a_finding_is_posted_once_to_the_webhook_and_answered_empty(app_with, receiver, mode):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook", CLUSTER_NAME="prod")
    response = post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()), mode)
    assert response.status_code == 204 and response.data == b""
    (body,) = receiver.bodies("/hook")
    alert = body["alerts"][0]
    assert body["status"] == "firing" and alert["labels"]["alertname"] == "VMHostDeviceConflict"
    assert alert["labels"]["cluster"] == "prod" and alert["labels"]["device"] == "harvester-ktmg4-000004102"


def test_info_findings_are_dropped_by_default_without_a_post(app_with, receiver):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook")
    assert post(client, b.finding_event("io.vmevents.vmi-cleanup.cleaned", b.cleaned())).status_code == 204
    assert receiver.posts == []


def test_with_min_severity_info_a_cleanup_is_forwarded(app_with, receiver):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook", MIN_SEVERITY="info")
    assert post(client, b.finding_event("io.vmevents.vmi-cleanup.cleaned", b.cleaned())).status_code == 204
    assert receiver.bodies()[0]["alerts"][0]["labels"]["alertname"] == "VMICleanedUp"


def test_slack_format_posts_a_slack_message(app_with, receiver):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/services/T0/B0/xyz", WEBHOOK_FORMAT="slack")
    assert post(client, b.finding_event("io.vmevents.io-pause-report.detected", b.io_pause())).status_code == 204
    (body,) = receiver.bodies()
    assert set(body) == {"text", "blocks"} and "VMPausedOnIOError" in body["text"]


def test_credentials_come_from_files_never_from_the_event(app_with, receiver, tmp_path):
    token, headers = tmp_path / "token", tmp_path / "headers"
    token.write_text("am-token\n")
    headers.write_text("Authorization: Bearer hook-token\n")
    client = app_with(ALERTMANAGER_URL=f"{receiver.url}/am", ALERTMANAGER_BEARER_TOKEN_FILE=str(token),
                      WEBHOOK_URL=f"{receiver.url}/hook", WEBHOOK_HEADERS_FILE=str(headers))
    forged = b.device_conflict(headers={"Authorization": "Bearer evil"}, token="evil")
    assert post(client, b.finding_event("io.vmevents.device-conflict.detected", forged)).status_code == 204
    by_path = {p["path"]: p["headers"] for p in receiver.posts}
    assert by_path["/am/api/v2/alerts"]["Authorization"] == "Bearer am-token"
    assert by_path["/hook"]["Authorization"] == "Bearer hook-token"
    token.write_text("rotated\n")  # a Secret update reaches the next POST without a restart
    assert post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict())).status_code == 204
    assert receiver.posts[-2]["headers"]["Authorization"] == "Bearer rotated"


def test_every_alertmanager_replica_gets_the_alert(app_with):
    replicas = [Receiver().start(), Receiver().start()]
    try:
        client = app_with(ALERTMANAGER_URL=",".join(r.url for r in replicas))
        event = b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict())
        assert post(client, event).status_code == 204
        for replica in replicas:
            (body,) = replica.bodies("/api/v2/alerts")
            assert body[0]["labels"]["alertname"] == "VMHostDeviceConflict" and body[0]["endsAt"] > body[0]["startsAt"]
    finally:
        for replica in replicas:
            replica.stop()


def test_a_receiver_that_is_down_answers_503_so_the_broker_retries(app_with, receiver):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook")
    receiver.stop()
    response = post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()))
    assert response.status_code == 503
    assert "is unreachable" in response.get_json()["error"] and "/hook" not in response.get_json()["error"]


@pytest.mark.parametrize("status,answer,fragment", [
    (500, 503, "answered 500"), (429, 503, "answered 429"), (401, 502, "check its credentials file"),
    (400, 502, "refused the alert: 400"),
], ids=["receiver-500", "receiver-429", "receiver-401", "receiver-400"])
def test_receiver_errors_become_5xx(app_with, receiver, status, answer, fragment):
    client = app_with(ALERTMANAGER_URL=receiver.url)
    receiver.fail_with(status)
    response = post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()))
    assert response.status_code == answer and fragment in response.get_json()["error"]


def test_one_receiver_failing_fails_the_event_even_if_the_other_accepted(app_with, receiver):
    down = Receiver()  # never started: connection refused
    client = app_with(ALERTMANAGER_URL=receiver.url, WEBHOOK_URL=f"{down.url}/hook")
    response = post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()))
    assert response.status_code == 503
    assert receiver.bodies("/api/v2/alerts"), "Alertmanager was still tried (a redelivery merges into the same alert)"


@pytest.mark.parametrize("headers,body,fragment", [
    *MALFORMED,
    (binary_headers(FINDING), b'["a list"]', "no JSON object as data"),
    (binary_headers(FINDING, content_type="text/plain"), b"vm2 holds the device", "no JSON object as data"),
    (binary_headers(FINDING), b"{not json", "not valid JSON"),
], ids=["not-a-cloudevent", "bad-structured", "foreign-type", "list-data", "text-data", "invalid-json"])
def test_malformed_input_is_a_400_and_nothing_is_posted(app_with, receiver, headers, body, fragment):
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook")
    assert_refused(client.post("/", headers=headers, data=body), fragment)
    assert receiver.posts == []


def test_no_receiver_configured_starts_and_drops_with_a_log_line(app_with, capfd):
    client = app_with()
    assert post(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict())).status_code == 204
    assert "no receiver configured" in capfd.readouterr().out


def test_bad_setting_stops_the_start_naming_the_variable(app_with, capsys):
    with pytest.raises(SystemExit) as stopped:
        app_with(MIN_SEVERITY="page-me")
    assert stopped.value.code == 2
    assert "MIN_SEVERITY='page-me' is not one of info, warning, critical" in capsys.readouterr().err


def test_probe_answers_without_handling(app_with):
    assert app_with().get("/").status_code == 200


def test_the_benchmark_runs_at_a_tiny_size(tmp_path):
    """`make bench`'s alert-forwarder entry end to end, tiny: both findings answered 2xx by both servers."""
    import contextlib

    from bench import alert_forwarder as bench
    from bench.load import Load

    with contextlib.ExitStack() as stack:
        report = bench.run_bench(1, Load(seconds=1, connections=2, max_requests=30), "auto", tmp_path, stack)
    assert len(report["events"]) == 2
    for row in report["events"].values():
        assert row["alert-forwarder"]["failed"] == 0 and row["no-op"]["failed"] == 0 and row["ratio"] > 0
    assert "ratio" in bench.render(report)


@pytest.mark.parametrize("depth", [130, 500])
def test_a_finding_nested_absurdly_deep_is_a_400_and_nothing_is_sent(app_with, receiver, depth):
    """JSON encoders recurse: data nested 1,000 deep (within what orjson decodes, 1,024) made the alert's
    description (and the webhook payload, which carries the finding) fail with a 500, and the broker retried it; the
    fuzz suite found 130 levels of {"k": [...]} failing the same way once orjson encoded it (it stops at 254). A
    finding is a few levels deep."""
    client = app_with(WEBHOOK_URL=f"{receiver.url}/hook")
    nested = b'{"k":[' * depth + b'"bottom"' + b']}' * depth  # written out: json.dumps cannot build it either
    body = json.dumps(b.device_conflict(deep="DEEP")).encode().replace(b'"DEEP"', nested)
    response = client.post("/", headers=binary_headers(FINDING), data=body)
    assert response.status_code == 400 and "nested deeper than 64 levels" in response.get_json()["error"]
    assert receiver.posts == []

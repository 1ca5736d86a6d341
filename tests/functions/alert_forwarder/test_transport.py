"""alert-forwarder's transport against hostile receivers (issue 14): a receiver that echoes the request does
not get the token into the reply or the log, credentials never follow a redirect to another host, and a URL is
only ever shown by scheme and host."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from functions.alert_forwarder.settings import load
from functions.alert_forwarder.transport import excerpt, post, redact
from shared.settings import SettingsError
from simcluster.builders import findings as b
from tests.http_cases import post as post_event

TOKEN = "s3cr3t-t0ken-abcdefghijklmnopqrstuvwxyz"


class Hostile:
    """A receiver answering `status` with the request's headers as its body, or redirecting to `location`;
    a POST to /final is recorded and answered 200."""

    def __init__(self, status=400, location=None):
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps(dict(self.headers.items())).encode()
                if self.path == "/final":
                    hostile.posts.append({"headers": dict(self.headers.items()), "body": json.loads(raw)})
                self.send_response(200 if self.path == "/final" else hostile.status)
                if hostile.location and self.path != "/final":
                    self.send_header("Location", hostile.location)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.status, self.location, self.posts = status, location, []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    servers = []

    def make(**kwargs):
        servers.append(Hostile(**kwargs))
        return servers[-1]
    yield make
    for server in servers:
        server.stop()


@pytest.mark.parametrize("status,answer", [(400, 502), (500, 503), (401, 502)])
def test_a_receiver_echoing_the_request_never_gets_the_token_into_the_reply_or_log(
        app_with, hostile, tmp_path, capfd, status, answer):
    echo = hostile(status=status)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    client = app_with(ALERTMANAGER_URL=f"{echo.url}/sub/path?key=q", ALERTMANAGER_BEARER_TOKEN_FILE=str(token))
    response = post_event(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()))
    logged = capfd.readouterr().out
    error = response.get_json()["error"]
    assert response.status_code == answer and f"answered {status}" in error or f"refused the alert: {status}" in error
    for secret in (TOKEN, "/sub/path", "key=q"):
        assert secret not in error and secret not in logged
    assert len(error) < 400


def test_an_excerpt_is_short_and_redacted():
    said = excerpt(f"denied: Authorization: Bearer {TOKEN} see https://x.example/a?b=c " + "z" * 500,
                   [f"Bearer {TOKEN}", TOKEN])
    assert TOKEN not in said and "x.example" not in said and len(said) <= 82 and said.startswith(": denied")
    assert excerpt("") == "" and excerpt("   ") == ""


@pytest.mark.parametrize("same_host", [True, False], ids=["same-host", "other-host"])
def test_credentials_do_not_follow_a_redirect_to_another_host(hostile, receiver, same_host):
    redirector = hostile(status=307, location="/final" if same_host else f"{receiver.url}/hook")
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": TOKEN, "X-Vmevents-Alert": "f1"}
    assert post("the webhook", f"{redirector.url}/start", {"a": 1}, headers, True, 5.0,
                credentials=("X-Api-Key",)) == []
    (arrived,) = redirector.posts if same_host else receiver.posts
    sent = {key.lower(): value for key, value in arrived["headers"].items()}
    assert arrived["body"] == {"a": 1} and sent["x-vmevents-alert"] == "f1"
    if same_host:
        assert sent["authorization"] == f"Bearer {TOKEN}" and sent["x-api-key"] == TOKEN
    else:
        assert "authorization" not in sent and "x-api-key" not in sent


def test_a_redirect_that_would_turn_the_post_into_a_get_is_a_refusal(hostile, receiver):
    redirector = hostile(status=302, location=f"{receiver.url}/hook")
    (error,) = post("the webhook", f"{redirector.url}/start", {"a": 1}, {}, True, 5.0)
    assert error.status == 502 and "302" in error.message and not receiver.posts


@pytest.mark.parametrize("url,shown", [
    ("hooks.slack.com/services/T000/B000/XXXX", "hooks.slack.com"),
    ("user:pass@hooks.example.com/secret?token=1", "hooks.example.com"),
    ("ftp://files.example.com/secret/path?q=1", "ftp://files.example.com"),
    ("alertmanager:9093", "alertmanager:9093"),
])
def test_a_bad_url_is_shown_by_scheme_and_host_only(url, shown):
    assert redact(url) == shown
    with pytest.raises(SettingsError) as caught:
        load({"WEBHOOK_URL": url})
    message = str(caught.value)
    assert f"WEBHOOK_URL={shown!r}" in message and "secret" not in message and "XXXX" not in message

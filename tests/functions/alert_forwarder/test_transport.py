"""alert-forwarder's transport against hostile receivers (issue 14): a receiver that echoes the request does
not get the token into the reply or the log, credentials never follow a redirect to another host, and a URL is
only ever shown by scheme and host."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

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
                credentials=("X-Api-Key",), allowed=(receiver.url,)) == []
    (arrived,) = redirector.posts if same_host else receiver.posts
    sent = {key.lower(): value for key, value in arrived["headers"].items()}
    assert arrived["body"] == {"a": 1} and sent["x-vmevents-alert"] == "f1"
    if same_host:
        assert sent["authorization"] == f"Bearer {TOKEN}" and sent["x-api-key"] == TOKEN
    else:
        assert "authorization" not in sent and "x-api-key" not in sent


def test_a_redirect_to_another_origin_is_not_followed_unless_allowed(hostile, receiver):
    """127.0.0.1 on another port is another origin: it stands for any other host (issue 26)."""
    redirector = hostile(status=307, location=f"{receiver.url}/hook")
    (error,) = post("the webhook", f"{redirector.url}/start", {"a": 1}, {}, True, 5.0)
    assert error.status == 502 and "another origin" in error.message and receiver.url in error.message
    assert "/hook" not in error.message and "REDIRECT_ALLOWED_ORIGINS" in error.message
    assert not receiver.posts, "nothing was sent there"
    assert post("the webhook", f"{redirector.url}/start", {"a": 1}, {}, True, 5.0, allowed=(receiver.url,)) == []
    assert len(receiver.posts) == 1


@pytest.mark.parametrize("location", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",  # the cloud's metadata endpoint
    "http://[fe80::1]/x",                                                  # IPv6 link-local
    "https://kubernetes.default.svc/api/v1/namespaces/kube-system/secrets",  # the API server
    "http://alertmanager-operated.monitoring.svc.cluster.local:9093/api/v2/alerts",  # a cluster Service
    "http://10.43.0.1/", "http://localhost:10250/pods",                    # a cluster IP, the kubelet
], ids=["metadata", "ipv6-link-local", "api-server", "service", "cluster-ip", "kubelet"])
def test_a_redirect_to_a_cluster_internal_or_link_local_host_is_refused_without_a_request(
        hostile, monkeypatch, location):
    from functions.alert_forwarder import transport

    redirector = hostile(status=308, location=location)
    asked, real = [], transport.session().post

    def recording(url, **kwargs):  # never lets a request leave loopback, whatever the code under test does
        asked.append(url)
        if not url.startswith(redirector.url):
            raise requests.ConnectionError("not sent: this test never leaves loopback")
        return real(url, **kwargs)
    monkeypatch.setattr(transport.session(), "post", recording)
    (error,) = post("Alertmanager", f"{redirector.url}/api/v2/alerts", [{"a": 1}], {}, True, 5.0)
    assert error.status == 502 and "another origin" in error.message
    assert asked == [f"{redirector.url}/api/v2/alerts"], "only the receiver itself was asked"
    assert "meta-data" not in error.message and "secrets" not in error.message


@pytest.mark.parametrize("value", ["hooks.example.com", "https://hooks.example.com/path", "ftp://x.example",
                                   "https://user:pw@x.example", "https://x.example:99999"])
def test_a_redirect_allow_list_that_is_not_origins_stops_the_start(value):
    with pytest.raises(SettingsError) as caught:
        load({"REDIRECT_ALLOWED_ORIGINS": f"https://ok.example,{value}"})
    assert "REDIRECT_ALLOWED_ORIGINS" in str(caught.value) and "pw" not in str(caught.value)
    assert load({"REDIRECT_ALLOWED_ORIGINS": " https://a.example , http://b.example:8080/ "}).redirect_origins == (
        "https://a.example", "http://b.example:8080")


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

"""A webhook URL, the user info in any URL and the values of WEBHOOK_HEADERS_FILE never appear, in full or in
part, in alert-forwarder's reply, its log line, or the dead-letter record of the finding (issue 23), on each
channel: the JSON webhook, the Slack webhook and Alertmanager. The receiver here is the worst case: it answers
with the whole request quoted back (request line with path and query, every header, the body), and on the
first POST redirects to another secret URL on the same host, which it also quotes. alert-forwarder writes no
Kubernetes Events (it has no API access), so there is no Event to check."""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from simcluster.builders import findings as b
from tests.http_cases import post as post_event
from tests.http_cases import source_of

# Each secret is short on purpose: the token-like pattern of the excerpt (24+ characters) does not catch it.
PATH_SECRET, QUERY_SECRET, USER, PASSWORD = "T0ps3cr", "q5ecret", "alice", "pw4alice"
HEADER_SECRET, TOKEN = "hdr5ecr", "tok3n5"
NEXT_SECRET = "nxt5ecr"  # the path a redirect names
SECRETS = (PATH_SECRET, QUERY_SECRET, USER, PASSWORD, HEADER_SECRET, TOKEN, NEXT_SECRET)


class Echo:
    """Answers every POST with `status` and the request quoted back; the first POST to a path without
    NEXT_SECRET is redirected (307, same host) to /hook/NEXT_SECRET?k=QUERY_SECRET, as a receiver may."""

    def __init__(self, status: int):
        echo = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                echo.requests.append(self.path)
                quoted = f"{self.command} {self.path} {dict(self.headers.items())} {raw.decode()}".encode()
                if NEXT_SECRET not in self.path:
                    self.send_response(307)
                    self.send_header("Location", f"{echo.url}/hook/{NEXT_SECRET}?k={QUERY_SECRET}")
                else:
                    self.send_response(status)
                self.send_header("Content-Length", str(len(quoted)))
                self.end_headers()
                self.wfile.write(quoted)

            def log_message(self, *args):
                pass

        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def secret_url(self) -> str:
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{self.server.server_address[1]}" \
               f"/services/{PATH_SECRET}?token={QUERY_SECRET}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def echo():
    servers: list[Echo] = []

    def make(status):
        servers.append(Echo(status))
        return servers[-1]
    yield make
    for server in servers:
        server.stop()


def channel_settings(channel: str, url: str, tmp_path) -> dict[str, str]:
    if channel == "alertmanager":
        (tmp_path / "token").write_text(TOKEN)
        return {"ALERTMANAGER_URL": url, "ALERTMANAGER_BEARER_TOKEN_FILE": str(tmp_path / "token")}
    (tmp_path / "headers").write_text(f"X-Api-Key: {HEADER_SECRET}\nAuthorization: Bearer {TOKEN}\n")
    return {"WEBHOOK_URL": url, "WEBHOOK_HEADERS_FILE": str(tmp_path / "headers"),
            "WEBHOOK_FORMAT": "slack" if channel == "slack" else "json"}


def dead_letter_record(serve, reply_status: int, reply_body: bytes, destination: str):
    """What dead-letter logs and answers for the finding the broker gave up on, with the error Knative attaches
    (knativeerrordata: the subscriber's answer, base64; knativeerrordest: the subscriber's URL)."""
    client = serve(source_of("dead_letter"))
    event = CloudEvent({"type": "io.vmevents.device-conflict.detected", "source": "s",
                        "knativeerrordest": destination, "knativeerrorcode": str(reply_status),
                        "knativeerrordata": base64.b64encode(reply_body).decode()}, {"a": 1})
    headers, body = to_binary(event)
    return client.post("/", headers=headers, data=body)


@pytest.mark.parametrize("status,answer", [(400, 502), (503, 503), (401, 502)])
@pytest.mark.parametrize("channel", ["webhook", "slack", "alertmanager"])
def test_no_part_of_a_secret_reaches_the_reply_the_log_or_the_dead_letter(
        serve, echo, tmp_path, capfd, channel, status, answer):
    receiver = echo(status)
    from tests.functions.alert_forwarder.conftest import SETTINGS, SOURCE

    client = serve(SOURCE, SETTINGS, **channel_settings(channel, receiver.secret_url(), tmp_path))
    response = post_event(client, b.finding_event("io.vmevents.device-conflict.detected", b.device_conflict()))
    assert response.status_code == answer
    assert any(NEXT_SECRET in path for path in receiver.requests), "the redirect was followed and echoed"
    error = response.get_json()["error"]
    assert f"at {receiver.url}" in error, "the receiver is named by its origin"
    dead = dead_letter_record(serve, answer, response.data,
                              f"http://{USER}:{PASSWORD}@alert-forwarder.vmevents.svc/{PATH_SECRET}")
    logged = capfd.readouterr()
    assert dead.status_code == 204
    # dead-letter writes its record on stderr in one write(2) (functions/dead_letter/main.py)
    (record,) = [json.loads(line) for line in logged.err.splitlines() if '"undelivered":true' in line]
    assert record["destination"] == "http://alert-forwarder.vmevents.svc" and record["status"] == str(answer)
    assert "answered" in record["error"] or "refused" in record["error"]
    shown = {"reply": error, "log lines": logged.out + logged.err, "dead-letter record": json.dumps(record)}
    for where, text in shown.items():
        leaked = [secret for secret in SECRETS if secret in text]
        assert not leaked, f"{leaked} in the {where}: {text}"


def test_a_setting_error_shows_the_url_by_origin_only(serve, capsys):
    from tests.functions.alert_forwarder.conftest import SETTINGS, SOURCE

    with pytest.raises(SystemExit):
        serve(SOURCE, SETTINGS, WEBHOOK_URL=f"ftp://{USER}:{PASSWORD}@hooks.example.com/{PATH_SECRET}?t={QUERY_SECRET}")
    err = capsys.readouterr().err
    assert "ftp://hooks.example.com" in err and not [s for s in SECRETS if s in err]

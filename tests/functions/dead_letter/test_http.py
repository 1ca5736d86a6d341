"""The dead-letter sink logs whatever the broker hands it and never refuses it (issue 26): the events that reach it
are often the very ones a function refused with 400, and refusing them again would lose their one log line."""
from __future__ import annotations

import base64
import json

import pytest

from functions.dead_letter.main import MAX_KEPT as MAX_BODY
from tests.http_cases import source_of

SOURCE = source_of("dead_letter")
KNATIVE = {"ce-knativeerrordest": "http://vmi-cleanup.vmevents.svc", "ce-knativeerrorcode": "400",
           "ce-knativeerrordata": base64.b64encode(b'{"error": "bad subject"}').decode()}


@pytest.fixture
def client(serve):
    return serve(SOURCE)


def lines(capfd) -> list[dict]:
    out, err = capfd.readouterr()
    return [json.loads(line) for line in (out + err).splitlines() if line.startswith("{")]


def undelivered(capfd) -> dict:
    [line] = [entry for entry in lines(capfd) if entry.get("undelivered")]
    return line


REFUSED_ELSEWHERE = [
    # what a function refuses with 400, as the broker then forwards it (binary mode, Knative's extensions)
    ("hostile-subject", {"ce-specversion": "1.0", "ce-id": "e1", "ce-source": "s", "ce-subject": "/../../secrets",
                         "ce-type": "dev.knative.apiserver.ref.update", "Content-Type": "application/json",
                         **KNATIVE}, b'{"kind": "VirtualMachineInstance", "name": "vm1?watch=1"}'),
    ("data-not-json", {"ce-specversion": "1.0", "ce-id": "e2", "ce-source": "s", "ce-type": "t",
                       "Content-Type": "application/json", **KNATIVE}, b"{not json"),
    ("no-specversion", {"ce-id": "e3", "ce-source": "s", "ce-type": "t", **KNATIVE}, b""),
    ("structured-wrong-types", {"Content-Type": "application/cloudevents+json"},
     json.dumps({"specversion": "1.0", "id": "e4", "source": "s", "type": "t", "kind": {"a": 1},
                 "subject": ["x"], "data": {"deep": [[["x"]]]}}).encode()),
    ("not-a-cloudevent", {"Content-Type": "text/plain"}, b"hello"),
    ("structured-not-json", {"Content-Type": "application/cloudevents+json"}, b"[[[" * 10000),
]


@pytest.mark.parametrize("what,headers,body", REFUSED_ELSEWHERE, ids=[r[0] for r in REFUSED_ELSEWHERE])
def test_whatever_arrives_is_logged_once_and_answered_2xx(client, capfd, what, headers, body):
    capfd.readouterr()
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 204, response.get_data()
    line = undelivered(capfd)
    assert line["function"] == "dead-letter" and line["level"] == "error"
    if headers.get("ce-id"):
        assert line["event_id"] == headers["ce-id"] and line["status"] == "400"
        assert line["error"] == '{"error": "bad subject"}'
        assert line["destination"] == "http://vmi-cleanup.vmevents.svc"


def test_a_structured_event_with_attributes_of_the_wrong_type_is_logged_with_them(client, capfd):
    capfd.readouterr()
    envelope = {"specversion": "1.0", "id": "e9", "source": "s", "type": "t", "subject": ["x"], "data": {"a": 1}}
    response = client.post("/", headers={"Content-Type": "application/cloudevents+json"},
                           data=json.dumps(envelope).encode())
    assert response.status_code == 204
    line = undelivered(capfd)
    assert line["shape"] == "structured" and line["event_id"] == "e9" and "x" in line["subject"]
    assert '"a": 1' in line["excerpt"]


def test_a_body_over_the_limit_is_read_up_to_it_and_the_line_stays_bounded(client, capfd):
    capfd.readouterr()
    body = b'{"x": "' + b"a" * (MAX_BODY * 2) + b'"}'
    response = client.post("/", headers={"ce-specversion": "1.0", "ce-id": "big", "ce-source": "s", "ce-type": "t",
                                         "Content-Type": "application/json"}, data=body)
    assert response.status_code == 204
    out, err = capfd.readouterr()
    [line] = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert line["bytes"] == MAX_BODY and line["cut"] is True and line["event_id"] == "big"
    assert max(len(x) for x in (out + err).splitlines()) < 5000, "one bounded line, whatever arrived"


def test_the_runtime_line_says_dead_lettered(client, capfd):
    capfd.readouterr()
    client.post("/", headers={"ce-specversion": "1.0", "ce-id": "r1", "ce-source": "s", "ce-type": "t", **KNATIVE},
                data=b"")
    out, _ = capfd.readouterr()
    [line] = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert line["verdict"] == "dead-lettered" and line["outcome"] == 204 and line["event_id"] == "r1"
    assert line["reason"] == "undeliverable to http://vmi-cleanup.vmevents.svc (status 400)"


def test_probes_get_200(client):
    assert client.get("/").status_code == 200

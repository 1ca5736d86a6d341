"""A function that RBAC refuses answers 500, so that after the broker's retries the event reaches the dead
letter, and its log line names the verb, the resource and the namespace refused: the operator learns which grant
is missing (issue 23). On both backends: the simulator's authorizer and kube-apiserver's own RBAC. Here
vmi-cleanup runs with alert-forwarder's ServiceAccount, which deploy/ grants nothing."""
from __future__ import annotations

import json

import pytest
from cloudevents.http import CloudEvent

from simcluster.builders.kubevirt import make_vmi
from tests import backends
from tests.http_cases import apiserver_event, post, source_of

DENIED_SA = "vmevents/alert-forwarder"


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    yield c
    c.stop()


def logged_line(capfd, status: int) -> dict:
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    (line,) = [line for line in lines if line.get("outcome") == status]
    return line


@pytest.mark.parametrize("event,refused", [
    (apiserver_event(make_vmi("vm-denied", phase="Succeeded")),
     'get virtualmachineinstances in API group "kubevirt.io" in namespace "default"'),
    (CloudEvent({"type": "dev.knative.sources.ping", "source": "/ping"}, {"reason": "tick"}),
     # a tick's first read: the intents of DELETEs whose answer was lost (functions/vmi_cleanup/intents.py)
     'get configmaps in the core API group in namespace "vmevents"'),
], ids=["event", "re-scan"])
def test_a_refused_request_answers_500_naming_what_was_refused(serve, cluster, capfd, event, refused):
    client = serve(source_of("vmi_cleanup"), KUBECONFIG=cluster.kubeconfig(service_account=DENIED_SA))
    capfd.readouterr()
    response = post(client, event)
    assert response.status_code == 500
    error = response.get_json()["error"]
    assert f"RBAC refused {refused}" in error and "grant it" in error
    line = logged_line(capfd, 500)
    assert line["verdict"] == "error" and f"RBAC refused {refused}" in line["reason"]


def test_a_re_scan_visit_refused_fails_the_tick_after_every_other_visit():
    from datetime import timedelta

    from shared import rescan
    from shared.kube import Forbidden

    visited = []

    def visit(name):
        visited.append(name)
        if name == "b":
            raise Forbidden("RBAC refused delete virtualmachineinstances in namespace \"x\"")
        return name

    with pytest.raises(Forbidden) as refused:
        rescan.run(["a", "b", "c"], visit, rescan.Settings(budget=timedelta(seconds=30), workers=1))
    assert sorted(visited) == ["a", "b", "c"], "the other visits are still made"
    assert "RBAC refused delete" in refused.value.message and "1 of 3 visit(s) refused" in refused.value.message

"""vmi-cleanup against odd values (issue 14): an over-large `vmevents.io/cleanup-after` opts that VM out with a
Warning Event and leaves every other VMI's cleanup alone; a hostile launcher pod's owner or uid is a 400 before
any API call."""
from __future__ import annotations

from datetime import timedelta

import pytest

from functions.vmi_cleanup.decide import AFTER_ANNOTATION, Action, Facts, decide
from functions.vmi_cleanup.handler import rescan
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared.kubeconfig import connect
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.apiserver import SimCluster
from simcluster.builders.kubevirt import FINISHED, make_launcher_pod, make_vmi
from tests.http_cases import apiserver_event, assert_refused, post, source_of

HUGE = "99999999999d"


@pytest.mark.parametrize("value", [HUGE, "366d", "1" * 400])
def test_an_over_large_cleanup_after_opts_the_vm_out_with_a_warning(value):
    vmi = make_vmi(annotations={AFTER_ANNOTATION: value})
    verdict = decide(Facts(vmi, None), Settings(), FINISHED + timedelta(days=400))
    assert verdict.action is Action.SKIP and verdict.warning and "nothing will be cleaned up" in verdict.warning
    assert len(verdict.warning) < 300


def test_one_vm_with_a_huge_annotation_does_not_stop_the_rescan_of_the_others(monkeypatch):
    with SimCluster() as cluster:
        cluster.create(make_vmi("odd", annotations={AFTER_ANNOTATION: HUGE}))
        cluster.create(make_vmi("plain"))
        monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig())
        kube = connect()
        ctx = KubeContext(FUNCTION, Settings(), lambda: FINISHED + timedelta(hours=1), kube, Recorder(kube, FUNCTION))
        outcome = rescan(ctx)
        assert outcome.reply is not None
        assert [c["details"]["vmi"] for c in outcome.reply.data["findings"]] == ["default/plain"]
        assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "odd") is not None
        warnings = [e for e in cluster.list("v1", "Event", "default") if e["type"] == "Warning"]
        assert [e["involvedObject"]["name"] for e in warnings] == ["odd"] and "365d" in warnings[0]["message"]


@pytest.mark.parametrize("owner,uid,fragment", [
    ("../../secrets", None, "not a valid VirtualMachineInstance name"),
    ("vm1?watch=true", None, "not a valid VirtualMachineInstance name"),
    (None, "x,reason=y", "is not a Kubernetes uid"),
])
def test_a_hostile_launcher_pod_is_a_400_before_any_api_call(serve, owner, uid, fragment):
    pod = make_launcher_pod(make_vmi(), with_owner=owner is not None)
    if owner is not None:
        pod["metadata"]["ownerReferences"][0]["name"] = owner
    else:
        pod["metadata"]["labels"]["kubevirt.io/created-by"] = uid
    client = serve(source_of("vmi_cleanup"))  # its API server refuses connections: a 400, not a 503
    assert_refused(post(client, apiserver_event(pod, kind="Pod")), fragment)

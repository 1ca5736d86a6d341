"""`vmevents explain <namespace>/<vm>` on both backends (cli/explain.py): for each function, what its own reads and
decide say of the VM now, the findings on record and the Events written; read-only (what a function would delete
stays, no Event is written); --output json for scripts; the console script's errors are one line."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from cli import explain
from cli.__main__ import main
from shared.finding import Finding
from shared.kube import Kube
from shared.ledger import Ledger
from simcluster.builders.io_pause import make_pvc
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.play import virtctl_start
from simcluster.stories.vmi_cleanup import seed_vm
from tests import backends
from tests.conftest import REPO
from tests.e2e import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SETTINGS = {"vmi-cleanup": {"CLEANUP_AFTER": "0s"}, "vm-stuck-report": {"VM_STUCK_AFTER": "1s"}}


@pytest.fixture(params=backends.params())
def world(request):
    cluster = backends.cluster(request.param, "1.3.1")
    node = KubeVirtSim(cluster, step_delay=0.01, volumes=True).start()
    try:
        yield cluster, node, request.param
    finally:
        node.stop()
        cluster.stop()


def _phase(cluster, name):
    vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")


def test_explain_says_what_each_function_would_do_and_changes_nothing(world):
    cluster, node, backend = world
    # off: a guest that powered itself off (vmi-cleanup would delete its VMI); stuck: a VM whose disk's
    # StorageClass does not exist (vm-stuck-report names it).
    cluster.create(make_pvc("off-disk-0", "pvc-off-disk-0"))
    cluster.create(seed_vm("off", "Manual"))
    virtctl_start(cluster, "default", "off")
    eventually(lambda: _phase(cluster, "off") == "Running", what="off Running")
    node.guest_power_off("default", "off")
    eventually(lambda: _phase(cluster, "off") == "Succeeded", what="off Succeeded")
    cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "stuck-disk", "namespace": "default"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "nowhere",
                             "resources": {"requests": {"storage": "1Gi"}}}})
    stuck = seed_vm("stuck", "Always")
    stuck["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "stuck-disk"
    cluster.create(stuck)
    eventually(lambda: ((cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "stuck") or {}).get("status")
                        or {}).get("printableStatus") == "ErrorUnschedulable", what="stuck unschedulable")
    vm = cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "stuck")
    Ledger(Kube(cluster.api_client()), "vm-stuck-report", reason="VMStuck").sighted(
        Finding("vm-stuck-report", "stuck-starting", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/stuck",
                "u", {"namespace": "default", "vm": "stuck", "state": "starting"}, summary="VM default/stuck is stuck"),
        vm, "ce-1", datetime.now(UTC))
    events_before = len(cluster.list("v1", "Event", "default"))

    off = explain.explain(Kube(cluster.api_client()), "default", "off", overrides=SETTINGS)
    answers = {a.function: a for a in off.answers}
    assert answers["vmi-cleanup"].verdict == "delete-vmi" and "runStrategy Manual" in answers["vmi-cleanup"].reason
    assert answers["vm-stuck-report"].verdict.startswith(("settled", "wait", "skip"))
    assert answers["migration-report"].verdict == "none" and answers["alert-forwarder"].verdict == "none"
    # given where SETTINGS names the function; else its Knative Service's (deploy/ is applied on the real control
    # plane), or its defaults where there is none (the simulator serves no Knative Service)
    assert {a.settings for a in off.answers} == {"given", "cluster" if backend == backends.REAL else "defaults"}
    assert _phase(cluster, "off") == "Succeeded", "explain deleted what vmi-cleanup would delete"

    def stuck_now():  # past VM_STUCK_AFTER (1s) since KubeVirt wrote ErrorUnschedulable
        found = explain.explain(Kube(cluster.api_client()), "default", "stuck", overrides=SETTINGS)
        answer = next(a for a in found.answers if a.function == "vm-stuck-report")
        return found if answer.verdict != "wait" else None
    found = eventually(stuck_now, timeout=60, interval=0.5, what="vm-stuck-report past its threshold")
    answers = {a.function: a for a in found.answers}
    assert answers["vm-stuck-report"].verdict == "report volume-unbound", answers["vm-stuck-report"]
    assert any("next:" in line for line in answers["vm-stuck-report"].lines)
    assert answers["vmi-cleanup"].verdict == "skip"
    assert answers["alert-forwarder"].verdict == "drop" and "stuck-starting" in answers["alert-forwarder"].lines[0]
    assert [f["category"] for f in found.findings] == ["stuck-starting"]
    assert [e["reason"] for e in found.events] == ["VMStuck"]
    assert len(cluster.list("v1", "Event", "default")) == events_before, "explain wrote an Event"
    said = explain.text(found)
    assert said.splitlines()[0].startswith("default/stuck, as vmevents sees it at ")
    assert "vm-stuck-report    report volume-unbound: " in said and "findings on record: 1" in said
    assert json.loads(explain.as_json(found))["answers"][4]["function"] == "vm-stuck-report"


def test_a_write_is_refused_before_it_is_sent(world):
    cluster, _, _ = world
    kube = explain.read_only(Kube(cluster.api_client()))
    with pytest.raises(explain.WriteRefused):
        kube.request("POST", "/api/v1/namespaces/default/events", body={})
    assert kube.request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"


def test_the_console_script_answers_in_json_and_fails_in_one_line(world, tmp_path, capsys):
    cluster, _, _ = world
    assert main(["explain", "default/nothing-here", "--kubeconfig", cluster.kubeconfig(), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vm"] == "default/nothing-here" and [a["verdict"] for a in out["answers"]][0] == "none"
    assert main(["explain", "nothing-here"]) == 2
    done = subprocess.run([sys.executable, "-m", "cli", "explain", "default/x", "--kubeconfig",
                           str(tmp_path / "missing")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "no Kubernetes configuration" in done.stderr

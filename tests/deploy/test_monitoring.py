"""deploy/components/monitoring (catalog/monitoring.py; docs/monitoring.md): the PodMonitor scrapes exactly the
functions deploy/ runs, on the port Knative gives their container; every rule is one promtool accepts, named as
alert-forwarder names the same finding's alert, with a runbook in README; the dashboard is the ConfigMap
rancher-monitoring's Grafana loads. On the real control plane, the Prometheus Operator's CRDs vendored in upstream/
accept the objects (kube-apiserver's own validation)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from catalog import declarations, monitoring
from tests.backends import in_ci
from tests.conftest import REPO
from tests.deploy.kustomize import knative_services, kubectl, render

UPSTREAM = REPO / "upstream" / "prometheus-operator" / "v0.72.0"


def watching() -> dict[str, dict]:
    return {o["kind"]: o for o in render("monitoring") if o not in render("default")}


def test_the_pod_monitor_scrapes_every_function_on_its_user_port():
    monitor = watching()["PodMonitor"]
    [selector] = monitor["spec"]["selector"]["matchExpressions"]
    assert selector["key"] == "serving.knative.dev/service" and selector["operator"] == "In"
    assert sorted(selector["values"]) == sorted(s["metadata"]["name"] for s in knative_services(render("default")))
    assert monitor["metadata"]["namespace"] == "vmevents"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "user-port", "path": "/metrics", "interval": "15s"}


def test_every_rule_is_accepted_by_promtool(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool is missing (Debian's prometheus package; .ci/run installs it)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": watching()["PrometheusRule"]["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_finding_alerts_are_named_as_alert_forwarder_names_them_and_every_runbook_exists():
    groups = {g["name"]: g["rules"] for g in watching()["PrometheusRule"]["spec"]["groups"]}
    named = {r["alert"] for r in groups["vmevents.findings"]}
    declared = {a.name for f in declarations() if "detected" in f.replies for a in f.alerts}
    assert named == declared
    headings = {line[4:].strip().lower() for line in (REPO / "README.md").read_text().splitlines()
                if line.startswith("### ")}  # GitHub's anchor of a one-word heading: the word, lower-case
    for rule in groups["vmevents.findings"] + groups["vmevents.self"]:
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == rule["alert"].lower() and anchor in headings, f"{rule['alert']}: README has no runbook"
        assert rule["expr"] == next(r.expr for r in monitoring.rules(declarations()) if r.alert == rule["alert"])


def test_the_dashboard_is_a_configmap_rancher_monitorings_grafana_loads():
    config = watching()["ConfigMap"]
    assert config["metadata"]["namespace"] == "cattle-dashboards"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["vmevents.json"])
    assert dashboard["uid"] == "vmevents"
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert queries == [p.query for p in monitoring.PANELS] and all(queries)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.fixture(scope="module")
def real_cluster():
    from tests import backends

    missing = backends.real_missing()
    if missing and not backends.in_ci():
        pytest.skip(f"real control plane: {missing}")
    from controlplane.cluster import RealCluster

    cluster = RealCluster(backends.control_plane()).start()
    yield cluster
    cluster.stop()


def kubectl_admin(cluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([kubectl(), "--kubeconfig", str(cluster.plane.admin_kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=300)
    if check and done.returncode:
        raise AssertionError(f"kubectl {' '.join(args[:2])} failed:\n{done.stderr}")
    return done


@pytest.mark.real
@pytest.mark.timeout(300)
def test_the_prometheus_operators_crds_accept_the_objects_on_the_real_control_plane(real_cluster):
    cluster = real_cluster
    for crd in ("podmonitors", "prometheusrules"):
        kubectl_admin(cluster, "apply", "--server-side", "-f", str(UPSTREAM / f"{crd}.crd.yaml"))
        kubectl_admin(cluster, "wait", "--for=condition=Established", f"crd/{crd}.monitoring.coreos.com",
                      "--timeout=60s")
    kubectl_admin(cluster, "create", "namespace", "cattle-dashboards", check=False)
    objects = list(watching().values())
    try:
        # The schema is enforced: a PodMonitor endpoint with a field of the wrong type is refused.
        broken = json.loads(json.dumps(watching()["PodMonitor"]))
        broken["spec"]["podMetricsEndpoints"][0]["interval"] = 15
        refused = kubectl_admin(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(broken), check=False)
        assert refused.returncode != 0 and "interval" in refused.stderr
        kubectl_admin(cluster, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump_all(objects))
        for obj in objects:
            live = json.loads(kubectl_admin(cluster, "get", "-n", obj["metadata"]["namespace"],
                                            f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}"
                                            if "/" in obj["apiVersion"] else obj["kind"].lower(),
                                            obj["metadata"]["name"], "-o", "json").stdout)
            assert live.get("spec", live.get("data")) == obj.get("spec", obj.get("data"))
    finally:
        kubectl_admin(cluster, "delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(objects),
                      check=False)
        kubectl_admin(cluster, "delete", "namespace", "cattle-dashboards", "--ignore-not-found", "--wait=false",
                      check=False)

"""deploy/chart/vmevents, rendered by a real helm (v3.19.0, built from helm.sh/helm/v3 by controlplane/build.py):
its default render is `kustomize build deploy/overlays/dry-run` object for object, and with the one setting that
goes live the default overlay's (with prevention on, the prevent overlays'; with monitoring on, the monitoring
overlay's), its values carry every function's settings with deploy/'s defaults but the dry run, a value
changes what it names and nothing else, a misspelt value fails the render, and `helm install` succeeds on
the real control plane. The Harvester Add-on (deploy/harvester/addon.yaml) is applied there against the
Addon CRD vendored from harvester/harvester, and its valuesContent renders with the chart."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from catalog import declared
from controlplane import build
from tests import backends
from tests.conftest import REPO
from tests.deploy.kustomize import container, knative_services, kubectl, render

CHART = REPO / "deploy" / "chart" / "vmevents"
ADDON = REPO / "deploy" / "harvester" / "addon.yaml"
ADDON_CRD = REPO / "upstream" / "harvester" / "addons.crd.yaml"
RUNTIME_ONLY = {"FUNCTION_TARGET", "FUNCTION_SOURCE"}
pytestmark = pytest.mark.built  # helm, built from its Go module (controlplane/build.py)


@pytest.fixture(scope="module")
def helm() -> str:
    if not build.go_available() and not (build.binary_dir(build.HELM) / "helm").is_file():
        if backends.in_ci():
            pytest.fail("helm cannot be built: no Go toolchain (CI must have one)")
        pytest.skip("helm: no Go toolchain to build it (install Go >= 1.25; controlplane/build.py builds helm)")
    return str(build.ensure(build.HELM) / "helm")


def run_helm(helm: str, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([helm, *args], capture_output=True, text=True, timeout=300, env=env)
    if check and done.returncode:
        raise AssertionError(f"helm {' '.join(args[:2])} failed:\n{done.stderr}")
    return done


def template(helm: str, *args: str) -> list[dict]:
    out = run_helm(helm, "template", "vmevents", str(CHART), *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def key(obj: dict) -> tuple:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def by_key(objects: list[dict]) -> dict[tuple, str]:
    found = {key(o): json.dumps(o, sort_keys=True) for o in objects}
    assert len(found) == len(objects), "two objects of the same kind and name"
    return found


def assert_same_objects(helm_objects: list[dict], kustomize_objects: list[dict]):
    chart, kz = by_key(helm_objects), by_key(kustomize_objects)
    assert sorted(chart) == sorted(kz), \
        f"only in the chart: {set(chart) - set(kz)}; only in kustomize: {set(kz) - set(chart)}"
    differ = [k for k in kz if chart[k] != kz[k]]
    assert not differ, "objects that differ: " + "; ".join(f"{k}:\nchart {chart[k]}\nkustomize {kz[k]}"
                                                          for k in differ[:2])


LIVE = ("--set", "functions.vmi-cleanup.env.CLEANUP_DRY_RUN=false")  # the one setting that goes live
MONITORING_CRDS = ("--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--api-versions",
                   "monitoring.coreos.com/v1/PrometheusRule")


def test_the_default_render_is_the_dry_run_overlay_object_for_object(helm):
    """The chart starts in dry run (as README advises), and one value goes live: then it is the default overlay."""
    assert_same_objects(template(helm), render("dry-run"))
    assert_same_objects(template(helm, *LIVE), render("default"))


def test_prevention_renders_the_prevent_overlays(helm):
    assert_same_objects(template(helm, *LIVE, "--set", "prevention.enabled=true"), render("prevent"))
    deny = template(helm, *LIVE, "--set", "prevention.enabled=true", "--set", "prevention.validationActions={Deny}")
    assert_same_objects(deny, render("prevent-deny"))


def test_monitoring_renders_the_monitoring_overlay_where_the_crds_are_and_fails_naming_them_elsewhere(helm):
    assert_same_objects(template(helm, *LIVE, "--set", "monitoring.enabled=true", *MONITORING_CRDS),
                        render("monitoring"))
    moved = template(helm, "--set", "monitoring.enabled=true", "--set", "monitoring.dashboardNamespace=monitoring",
                     *MONITORING_CRDS)
    assert [o["metadata"]["namespace"] for o in moved if o["kind"] == "ConfigMap"
            and o["metadata"]["name"] == "vmevents-dashboard"] == ["monitoring"]
    done = run_helm(helm, "template", "vmevents", str(CHART), "--set", "monitoring.enabled=true", check=False)
    assert done.returncode != 0 and "monitoring.coreos.com/v1 PodMonitor and PrometheusRule" in done.stderr


def test_the_values_hold_every_functions_settings_with_deploys_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []
    for svc in knative_services(render("dry-run")):  # the chart starts in dry run
        name, c = svc["metadata"]["name"], container(svc)
        wanted = {"env": {e["name"]: e["value"] for e in c.get("env", []) if e["name"] not in RUNTIME_ONLY},
                  "resources": c["resources"]}
        got = values["functions"].get(name)
        if got is None:
            missing.append(f"  {name}:\n" + yaml.safe_dump(wanted, sort_keys=False, default_style=None).replace(
                "\n", "\n    ").rstrip().join(["    ", ""]))
            continue
        env = {k: str(v) for k, v in (got.get("env") or {}).items()}
        assert env == wanted["env"], f"{name}: env differs from deploy/"
        assert got.get("resources") == wanted["resources"], f"{name}: resources differ from deploy/"
    assert not missing, "deploy/chart/vmevents/values.yaml lacks functions:\n" + "\n".join(missing)
    kz = yaml.safe_load((REPO / "deploy" / "base" / "kustomization.yaml").read_text())["images"][0]
    assert (values["image"]["repository"], values["image"]["tag"]) == (kz["newName"], kz["newTag"])


def test_a_value_changes_what_it_names_and_nothing_else(helm):
    default = by_key(template(helm))
    changed = template(helm, "--set", "functions.vmi-cleanup.env.CLEANUP_AFTER=1h", "--set", "image.tag=0.2.0",
                       "--set", "broker.class=Kafka")
    for obj in changed:
        if obj["kind"] == "Service" and obj["apiVersion"] == "serving.knative.dev/v1":
            c = container(obj)
            assert c["image"] == "registry.example.com/vmevents/vmevents:0.2.0"
            env = {e["name"]: e["value"] for e in c["env"]}
            if obj["metadata"]["name"] == "vmi-cleanup":
                assert env["CLEANUP_AFTER"] == "1h"
                declared_after = declared("vmi-cleanup").setting("CLEANUP_AFTER").default
                c["env"] = [dict(e, value=declared_after) if e["name"] == "CLEANUP_AFTER" else e for e in c["env"]]
            c["image"] = "registry.example.com/vmevents/vmevents:0.1.0"
        if obj["kind"] == "Broker":
            assert obj["metadata"]["annotations"]["eventing.knative.dev/broker.class"] == "Kafka"
            obj["metadata"]["annotations"]["eventing.knative.dev/broker.class"] = "MTChannelBasedBroker"
    assert by_key(changed) == default


@pytest.mark.parametrize("value, message", [
    ("functions.vmi-cleanup.env.CLEANUP_AFTR=1h",
     "functions.vmi-cleanup.env.CLEANUP_AFTR: vmi-cleanup has no such setting"),
    ("functions.vmi-cleaner.env.CLEANUP_AFTER=1h",
     "functions.vmi-cleaner: deploy/ has no Knative Service of that name"),
])
def test_a_misspelt_value_fails_the_render(helm, value, message):
    done = run_helm(helm, "template", "vmevents", str(CHART), "--set", value, check=False)
    assert done.returncode != 0 and message in done.stderr


def test_the_addons_values_render_with_the_chart(helm, tmp_path):
    addon = yaml.safe_load(ADDON.read_text())
    assert addon["apiVersion"] == "harvesterhci.io/v1beta1" and addon["kind"] == "Addon"
    assert addon["metadata"]["labels"]["addon.harvesterhci.io/experimental"] == "true"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (addon["spec"]["chart"], addon["spec"]["version"]) == (chart["name"], chart["version"])
    values = tmp_path / "values.yaml"
    values.write_text(addon["spec"]["valuesContent"])
    # The Add-on's values are the chart's defaults (it lists them so operators see where to change them).
    assert by_key(template(helm, "-f", str(values))) == by_key(template(helm))


# -- on the real control plane ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_cluster():
    missing = backends.real_missing()
    if missing and not backends.in_ci():
        pytest.skip(f"real control plane: {missing}")
    from controlplane.cluster import RealCluster

    cluster = RealCluster(backends.control_plane()).start()
    yield cluster
    cluster.stop()


def admin_env(cluster) -> dict:
    import os

    return {**os.environ, "KUBECONFIG": str(cluster.plane.admin_kubeconfig), "HELM_CACHE_HOME": "/tmp/vmevents-helm",
            "HELM_CONFIG_HOME": "/tmp/vmevents-helm", "HELM_DATA_HOME": "/tmp/vmevents-helm"}


def kubectl_admin(cluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([kubectl(), "--kubeconfig", str(cluster.plane.admin_kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=300)
    if check and done.returncode:
        raise AssertionError(f"kubectl {' '.join(args[:2])} failed:\n{done.stderr}")
    return done


@pytest.mark.real
@pytest.mark.timeout(900)  # deleting and re-creating the vmevents namespace twice on a loaded machine
def test_helm_install_puts_every_object_of_the_chart_on_the_real_control_plane(helm, real_cluster):
    cluster = real_cluster
    # RealCluster applied deploy/ with kubectl; helm takes over only what it created, so remove that first.
    kubectl_admin(cluster, "delete", "-k", str(REPO / "deploy" / "overlays" / "default"), "--ignore-not-found",
                  "--wait=true", "--timeout=120s")
    env = admin_env(cluster)
    try:
        run_helm(helm, "install", "vmevents", str(CHART), "--namespace", "default", "--set", "prevention.enabled=true",
                 env=env)
        status = json.loads(run_helm(helm, "status", "vmevents", "--namespace", "default", "-o", "json",
                                     env=env).stdout)
        assert status["info"]["status"] == "deployed"
        for obj in template(helm, "--set", "prevention.enabled=true"):
            meta = obj["metadata"]
            scope = ["-n", meta["namespace"]] if meta.get("namespace") else []
            live = json.loads(kubectl_admin(cluster, "get", *scope, f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}"
                                            if "/" in obj["apiVersion"] else obj["kind"], meta["name"], "-o",
                                            "json").stdout)
            assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == "vmevents", key(obj)
        done = run_helm(helm, "uninstall", "vmevents", "--namespace", "default", env=env)
        assert "uninstalled" in done.stdout
    finally:
        run_helm(helm, "uninstall", "vmevents", "--namespace", "default", check=False, env=env)
        _wait_gone(cluster, "namespace", "vmevents")
        cluster.apply_deploy()  # as RealCluster.start left it, for whatever runs next on this control plane


def _wait_gone(cluster, kind: str, name: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while kubectl_admin(cluster, "get", kind, name, check=False).returncode == 0:
        assert time.monotonic() < deadline, f"{kind} {name} still there after {timeout:.0f}s"
        time.sleep(0.5)


@pytest.mark.real
@pytest.mark.timeout(300)
def test_the_addon_manifest_is_accepted_by_the_addon_crds_schema(real_cluster, tmp_path: Path):
    cluster = real_cluster
    kubectl_admin(cluster, "apply", "--server-side", "-f", str(ADDON_CRD))
    kubectl_admin(cluster, "wait", "--for=condition=Established", "crd/addons.harvesterhci.io", "--timeout=60s")
    kubectl_admin(cluster, "create", "namespace", "harvester-system", check=False)
    try:
        # The schema is enforced: an Add-on without the fields Harvester requires is refused.
        broken = yaml.safe_load(ADDON.read_text())
        del broken["spec"]["version"]
        refused = kubectl_admin(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(broken), check=False)
        assert refused.returncode != 0 and "spec.version: Required value" in refused.stderr
        kubectl_admin(cluster, "apply", "-f", str(ADDON))
        live = json.loads(kubectl_admin(cluster, "get", "-n", "harvester-system", "addon", "vmevents", "-o",
                                        "json").stdout)
        assert live["spec"] == yaml.safe_load(ADDON.read_text())["spec"]
    finally:
        kubectl_admin(cluster, "delete", "-f", str(ADDON), "--ignore-not-found", check=False)
        kubectl_admin(cluster, "delete", "namespace", "harvester-system", "--ignore-not-found", "--wait=false",
                      check=False)

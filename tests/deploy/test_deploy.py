"""deploy/ is right the first time: every kustomization (base and each overlay) is rendered with a
real kubectl and every object is checked against the upstream schemas, then against each other.

- Knative objects against the CRDs in upstream/ (Serving knative-v1.22.1, Eventing
  knative-v1.22.2), with unknown fields rejected as `kubectl apply` does (its default
  --validate=strict); Kubernetes core and RBAC objects, and each Knative Service's pod spec, against
  the Kubernetes OpenAPI schemas of the `kubernetes-validate` package (strict).
- Cross-references: brokers, sinks, subscribers and dead-letter sinks exist; every function has a
  Trigger, credentials (or none at all) and least-privilege RBAC; every ApiServerSource's
  ServiceAccount may get/list/watch exactly what it watches; every env var is one its function
  reads, with a value it accepts (its own settings loader decides, not a list kept here).
Nothing here names a function: a new `deploy/base/<function>.yaml` is checked by the same rules.
"""
from __future__ import annotations

import copy
import functools
import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared.settings import SettingsError
from simcluster.paths import DEPLOY_DIR, UPSTREAM_DIR
from simcluster.schemas import to_json_schema
from simcluster.store import type_for_kind
from tests.conftest import REPO
from tests.deploy.kustomize import (
    KUSTOMIZATIONS,
    RUNTIME_ENV,
    container,
    env_of,
    ident,
    knative_services,
    of_kind,
    read_settings,
    readable_settings,
    render,
)
from tests.rbac import granted

# The Kubernetes versions the schemas are checked against: the oldest a supported Harvester runs
# (v1.4 ships Kubernetes 1.30) and the newest the package knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
KNATIVE_CRDS = {
    ("serving.knative.dev", "Service"): "knative-serving/knative-v1.22.1/service.crd.yaml",
    ("eventing.knative.dev", "Broker"): "knative-eventing/knative-v1.22.2/broker.crd.yaml",
    ("eventing.knative.dev", "Trigger"): "knative-eventing/knative-v1.22.2/trigger.crd.yaml",
    ("sources.knative.dev", "ApiServerSource"): "knative-eventing/knative-v1.22.2/apiserversource.crd.yaml",
    ("sources.knative.dev", "PingSource"): "knative-eventing/knative-v1.22.2/pingsource.crd.yaml",
    # deploy/components/monitoring: the Prometheus Operator's, as rancher-monitoring 104.1.2 installs them
    ("monitoring.coreos.com", "PodMonitor"): "prometheus-operator/v0.72.0/podmonitors.crd.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "prometheus-operator/v0.72.0/prometheusrules.crd.yaml",
}
# Fields of a Knative RevisionSpec that are not a Kubernetes PodSpec's (knative.dev/serving
# pkg/apis/serving/v1/revision_types.go RevisionSpec).
REVISION_ONLY = ("containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds")
# RSS of one function pod, measured: 104 MiB idle and 101 MiB after `make bench`'s load (gunicorn
# master + worker, the kubernetes client loaded); a memory request below it gets the pod evicted
# or OOM-killed on a busy node. dead-letter loads no Kubernetes client (its own main.py): 64 MiB idle from
# the image (bench/image.py), what a no-op function costs.
MEASURED_RSS_MIB = 104
MEASURED_RSS_MIB_OF = {"vmevents-dead-letter": 64}
DOCKERFILE = REPO / "Dockerfile"


def all_objects():
    return [(k, i, obj) for k in KUSTOMIZATIONS for i, obj in enumerate(render(k))]


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(quantity)).groups()
    scale = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 ** 2, "K": 1e3 / 2 ** 20, "M": 1e6 / 2 ** 20,
             "G": 1e9 / 2 ** 20, "T": 1e12 / 2 ** 20, None: 1 / 2 ** 20}[unit]
    return float(number) * scale


# -- rendering --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_kustomization_renders_the_whole_system(kustomization):
    objects = render(kustomization)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "Broker", "Trigger", "Service", "ApiServerSource", "PingSource", "ServiceAccount",
            "ClusterRole", "ClusterRoleBinding"} <= kinds
    names = [ident(o) + " " + o["apiVersion"] for o in objects]
    assert len(names) == len(set(names)), "an object is rendered twice"


def test_every_function_file_in_base_is_listed_in_the_kustomization():
    listed = set(yaml.safe_load((DEPLOY_DIR / "base" / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in (DEPLOY_DIR / "base").glob("*.yaml") if p.name != "kustomization.yaml"}
    assert present <= listed, f"deploy/base files not in kustomization.yaml resources: {sorted(present - listed)}"


# -- schemas ----------------------------------------------------------------------------------------
@functools.cache
def crd_schema(group: str, kind: str, version: str) -> dict:
    path = UPSTREAM_DIR / KNATIVE_CRDS[(group, kind)]
    for crd in yaml.safe_load_all(path.read_text()):
        if crd and crd.get("kind") == "CustomResourceDefinition":
            for v in crd["spec"]["versions"]:
                if v["name"] == version:
                    assert v.get("served"), f"{group}/{version} {kind} is not served by {path.name}"
                    return v["schema"]["openAPIV3Schema"]
    raise AssertionError(f"{path} has no {kind} {version}")


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Fields a structural schema does not declare: the API server would drop them, and kubectl's
    default strict field validation rejects them."""
    if isinstance(value, list):
        return [f for i, item in enumerate(value)
                for f in unknown_fields(item, schema.get("items") or {}, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    properties, additional = schema.get("properties") or {}, schema.get("additionalProperties")
    found = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key in properties:
            if where != "metadata":
                found += unknown_fields(item, properties[key], where)
        elif isinstance(additional, dict):
            found += unknown_fields(item, additional, where)
        elif additional is not True and where not in ("apiVersion", "kind", "metadata"):
            found.append(where)
    return found


def has_knative_crd(obj) -> bool:
    return (obj["apiVersion"].split("/")[0], obj["kind"]) in KNATIVE_CRDS


def has_kubernetes_schema(obj) -> bool:
    return "/" not in obj["apiVersion"] or obj["apiVersion"].startswith(("rbac.", "admissionregistration."))


def distinct(rows):
    """One row per distinct object, the first kustomization that renders it in its id with how many more do (base+7):
    an overlay repeats most of base's objects unchanged (the 274 Kubernetes objects of the eight kustomizations are
    39 distinct ones), and a schema judges the object, not the kustomization it came from."""
    first: dict[str, list] = {}
    for kustomization, index, obj in rows:
        key = json.dumps(obj, sort_keys=True)
        if key in first:
            first[key][3] += 1
        else:
            first[key] = [kustomization, index, obj, 0]
    return ([(k, i, obj) for k, i, obj, _ in first.values()],
            [f"{k}{f'+{more}' if more else ''}:{ident(obj)}" for k, _, obj, more in first.values()])


KNATIVE_ROWS, KNATIVE_IDS = distinct(r for r in all_objects() if has_knative_crd(r[2]))
CORE_ROWS, CORE_IDS = distinct(r for r in all_objects() if has_kubernetes_schema(r[2]))


def test_every_rendered_object_is_checked_against_a_schema():
    unchecked = [f"{k}:{ident(o)} ({o['apiVersion']})" for k, _, o in all_objects()
                 if not has_knative_crd(o) and not has_kubernetes_schema(o)]
    assert not unchecked, f"no schema checks these objects; add one: {unchecked}"


@pytest.mark.parametrize("kustomization,index,obj", KNATIVE_ROWS, ids=KNATIVE_IDS)
def test_knative_objects_match_the_upstream_crd(kustomization, index, obj):
    group, version = obj["apiVersion"].split("/")
    schema = crd_schema(group, obj["kind"], version)
    assert not unknown_fields(obj, schema), f"{ident(obj)}: fields the CRD does not know: {unknown_fields(obj, schema)}"
    converted = to_json_schema(schema)
    converted.setdefault("properties", {})["metadata"] = {"type": "object"}
    errors = sorted(jsonschema.Draft4Validator(converted).iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{ident(obj)}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization,index,obj", CORE_ROWS, ids=CORE_IDS)
def test_kubernetes_objects_match_the_openapi_schema(kustomization, index, obj, version):
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{ident(obj)} against Kubernetes {e.version}: {'.'.join(map(str, e.path))}: {e.message}")


POD_ROWS, POD_IDS = distinct(r for r in all_objects() if knative_services([r[2]]))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization,index,svc", POD_ROWS, ids=POD_IDS)
def test_knative_services_pod_spec_is_a_valid_kubernetes_pod_spec(kustomization, index, svc, version):
    """Knative Serving turns the revision template into a Deployment's pod template: it must be a
    valid PodSpec once Knative's own fields are taken out."""
    spec = {k: v for k, v in copy.deepcopy(svc["spec"]["template"]["spec"]).items() if k not in REVISION_ONLY}
    for c in spec["containers"]:  # what Knative fills in: its container name, the probes' port
        c.setdefault("name", "user-container")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "httpGet" in c.get(probe, {}):
                c[probe]["httpGet"].setdefault("port", (c.get("ports") or [{}])[0].get("containerPort", 8080))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": svc["metadata"]["name"]}, "spec": spec}
    try:
        kubernetes_validate.validate(pod, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{ident(svc)} pod spec against Kubernetes {e.version}: "
                    f"{'.'.join(map(str, e.path))}: {e.message}")


# -- cross-references -------------------------------------------------------------------------------
def index_by_ident(objects):
    return {(o["apiVersion"].split("/")[0] if "/" in o["apiVersion"] else "", o["kind"],
             o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}


def resolves(ref: dict, namespace: str, objects) -> bool:
    group = ref["apiVersion"].split("/")[0] if "/" in ref["apiVersion"] else ""
    return (group, ref["kind"], ref.get("namespace", namespace), ref["name"]) in index_by_ident(objects)


def destinations(obj):
    """Every Knative Destination in an object: (what, destination)."""
    spec = obj.get("spec") or {}
    if "sink" in spec:
        yield "sink", spec["sink"]
    if "subscriber" in spec:
        yield "subscriber", spec["subscriber"]
    if (spec.get("delivery") or {}).get("deadLetterSink"):
        yield "deadLetterSink", spec["delivery"]["deadLetterSink"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_reference_resolves(kustomization):
    objects = render(kustomization)
    missing = []
    for obj in objects:
        ns = obj["metadata"].get("namespace")
        for what, dest in destinations(obj):
            if not dest.get("ref") or not resolves(dest["ref"], ns, objects):
                missing.append(f"{ident(obj)} {what} {dest}")
        if obj["kind"] == "Trigger":
            broker = {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": obj["spec"]["broker"]}
            if not resolves(broker, ns, objects):
                missing.append(f"{ident(obj)} broker {obj['spec']['broker']}")
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = obj["roleRef"]
            if not resolves({"apiVersion": f"{ref['apiGroup']}/v1", "kind": ref["kind"], "name": ref["name"]},
                            ns if ref["kind"] == "Role" else None, objects):
                missing.append(f"{ident(obj)} roleRef {ref}")
            for subject in obj.get("subjects") or ():
                if subject["kind"] == "ServiceAccount" and not resolves(
                        {"apiVersion": "v1", "kind": "ServiceAccount", "name": subject["name"]},
                        subject.get("namespace", ns), objects):
                    missing.append(f"{ident(obj)} subject {subject}")
        sa = (obj.get("spec") or {}).get("serviceAccountName") or \
            ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("serviceAccountName")
        if sa and not resolves({"apiVersion": "v1", "kind": "ServiceAccount", "name": sa}, ns, objects):
            missing.append(f"{ident(obj)} serviceAccountName {sa}")
    assert not missing, "references to objects that are not rendered:\n" + "\n".join(missing)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_function_has_a_trigger_credentials_and_a_service(kustomization):
    objects = render(kustomization)
    subscribed = {t["spec"]["subscriber"]["ref"]["name"] for t in of_kind(objects, "eventing.knative.dev", "Trigger")}
    sinks = {dest["ref"]["name"] for o in objects for what, dest in destinations(o) if what == "deadLetterSink"}
    problems = []
    for svc in knative_services(objects):
        name, pod = svc["metadata"]["name"], svc["spec"]["template"]["spec"]
        if name not in subscribed | sinks:
            problems.append(f"{ident(svc)} is no Trigger's subscriber and no deadLetterSink: it gets no events")
        if not pod.get("serviceAccountName") and pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{ident(svc)} has no ServiceAccount of its own: name one, or set "
                            "automountServiceAccountToken: false if it calls no API")
    for trigger in of_kind(objects, "eventing.knative.dev", "Trigger"):
        delivery = trigger["spec"].get("delivery") or {}
        for key in ("retry", "backoffPolicy", "backoffDelay", "timeout", "deadLetterSink"):
            if key not in delivery:
                problems.append(f"{ident(trigger)} delivery has no {key}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_api_server_sources_may_get_list_and_watch_exactly_what_they_watch(kustomization):
    """Knative's ApiServerSource controller checks get, list and watch for each resource before it
    starts its adapter; the adapter lists and watches. Nothing more is needed."""
    objects = render(kustomization)
    needed: dict[str, set] = {}
    for src in of_kind(objects, "sources.knative.dev", "ApiServerSource"):
        sa = f"{src['metadata']['namespace']}/{src['spec'].get('serviceAccountName', 'default')}"
        for res in src["spec"]["resources"]:
            rt = type_for_kind(res["apiVersion"], res["kind"])
            needed.setdefault(sa, set()).update((verb, rt.group, rt.plural) for verb in ("get", "list", "watch"))
    assert needed
    for sa, grants in needed.items():
        have = granted(sa, objects)
        assert not grants - have, f"{sa} may not {sorted(grants - have)}: the source will not start"
        assert not have - grants, f"{sa} is granted more than its sources watch: {sorted(have - grants)}"


def test_every_service_account_with_a_role_is_checked_for_exact_rbac():
    """Each ServiceAccount bound to a (Cluster)Role is either an ApiServerSource's (checked above)
    or a function's, whose e2e module ends with assert_exact_rbac(..., "<namespace>/<name>")."""
    objects = render("base")
    sources = {f"{s['metadata']['namespace']}/{s['spec'].get('serviceAccountName', 'default')}"
               for s in of_kind(objects, "sources.knative.dev", "ApiServerSource")}
    bound = {f"{s.get('namespace', b['metadata'].get('namespace'))}/{s['name']}"
             for b in objects if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             for s in b.get("subjects") or () if s["kind"] == "ServiceAccount"}
    checked = set()
    for module in (REPO / "tests").rglob("test_*.py"):
        text = module.read_text()
        constants = dict(re.findall(r'^(\w+)\s*=\s*"([\w-]+/[\w-]+)"', text, re.M))
        for arg in re.findall(r"assert_exact_rbac\([^,]+,\s*([^,)\s]+)\s*[,)]", text):
            checked.add(constants.get(arg, arg.strip("\"'")))
    unchecked = bound - sources - checked
    assert not unchecked, (f"ServiceAccounts with roles that no e2e module checks with assert_exact_rbac: "
                           f"{sorted(unchecked)} (end the function's e2e module with it, see tests/rbac.py)")


# -- Knative Services -------------------------------------------------------------------------------
def dockerfile_env(name: str) -> str:
    match = re.search(rf"\b{name}=(\S+)", DOCKERFILE.read_text())
    assert match, f"the Dockerfile sets no {name}"
    return match.group(1)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_knative_services_are_private_bounded_sized_and_probed(kustomization):
    services = knative_services(render(kustomization))
    problems = []
    images = {container(svc)["image"] for svc in services}
    if len(images) != 1:
        problems.append(f"one image for every function, not {sorted(images)}")
    for svc in services:
        who, tpl = ident(svc), svc["spec"]["template"]
        c, annotations = container(svc), (tpl.get("metadata") or {}).get("annotations") or {}
        if svc["metadata"].get("labels", {}).get("networking.knative.dev/visibility") != "cluster-local":
            problems.append(f"{who}: not cluster-local (label networking.knative.dev/visibility)")
        threads = env_of(svc).get("THREADS", dockerfile_env("THREADS"))
        if str(tpl["spec"].get("containerConcurrency")) != threads:
            problems.append(f"{who}: containerConcurrency must equal gunicorn's THREADS ({threads})")
        for key in ("autoscaling.knative.dev/min-scale", "autoscaling.knative.dev/max-scale"):
            if key not in annotations:
                problems.append(f"{who}: no {key}")
        low, high = int(annotations.get("autoscaling.knative.dev/min-scale", 0)), \
            int(annotations.get("autoscaling.knative.dev/max-scale", 0))
        if not 0 <= low <= high or high < 1:
            problems.append(f"{who}: scale bounds {low}..{high}")
        resources = c.get("resources") or {}
        request = mebibytes((resources.get("requests") or {}).get("memory", "0"))
        limit = mebibytes((resources.get("limits") or {}).get("memory", "0"))
        measured = MEASURED_RSS_MIB_OF.get(svc["metadata"]["name"], MEASURED_RSS_MIB)
        if request < measured or limit < request:
            problems.append(f"{who}: memory request {request:g}Mi must be ≥ the measured {measured} MiB RSS "
                            f"and ≤ the limit ({limit:g}Mi)")
        if "cpu" not in (resources.get("requests") or {}):
            problems.append(f"{who}: no CPU request")
        for probe in ("readinessProbe", "livenessProbe"):
            get = (c.get(probe) or {}).get("httpGet") or {}
            if get.get("path") != "/" or get.get("port") not in (None, c["ports"][0]["containerPort"]):
                problems.append(f"{who}: {probe} must GET / on the serving port")
        sc = c.get("securityContext") or {}
        if not (sc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem")
                and sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"]):
            problems.append(f"{who}: securityContext must be non-root, read-only, no escalation, drop ALL")
        if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            # Pod Security's restricted level asks for it, and Knative Serving's webhook warns without it.
            problems.append(f"{who}: securityContext.seccompProfile.type must be RuntimeDefault")
    assert not problems, "\n".join(problems)


def test_scale_and_concurrency_carry_a_stated_reason():
    """A number without its reason gets changed blindly: each is preceded by a comment in the file."""
    missing = []
    for path in sorted((DEPLOY_DIR / "base").glob("*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*(containerConcurrency|autoscaling\.knative\.dev/min-scale):", line):
                above = lines[max(0, i - 8):i]
                if not any(text.strip().startswith("#") for text in above):
                    missing.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not missing, "say why (a comment above): " + ", ".join(missing)


# -- env: every variable is one its function reads, with a valid value ------------------------------
SERVICE_ROWS = [(k, svc) for k in KUSTOMIZATIONS for svc in knative_services(render(k))]


@pytest.mark.parametrize("kustomization,svc", SERVICE_ROWS, ids=[f"{k}:{ident(s)}" for k, s in SERVICE_ROWS])
def test_env_is_what_the_function_reads_with_valid_values(kustomization, svc):
    env = env_of(svc)
    assert env.get("FUNCTION_TARGET") == "handle"
    source = REPO / env["FUNCTION_SOURCE"]
    assert source.is_file(), f"FUNCTION_SOURCE {env['FUNCTION_SOURCE']} does not exist"
    assert (source.parent / "__init__.py").is_file(), f"{source.parent} is not a package: the image would not ship it"
    assert all("value" in e for e in container(svc)["env"]), "literal values only (valueFrom cannot be checked here)"
    try:
        _, read = read_settings(svc)
    except SettingsError as exc:
        pytest.fail(f"{ident(svc)} would not start: {exc}")
    unread = set(env) - readable_settings(svc) - RUNTIME_ENV
    assert not unread, f"{ident(svc)} sets variables its function never reads: {sorted(unread)}"
    unset = read - set(env) - RUNTIME_ENV
    assert not unset, f"{ident(svc)}: its function reads {sorted(unset)}; list every setting in the manifest"


def test_dry_run_overlay_turns_every_destructive_action_off():
    wrong = []
    for svc in knative_services(render("dry-run")):
        _, read = read_settings(svc)
        for name in sorted(n for n in read if n.endswith("_DRY_RUN")):
            if env_of(svc).get(name) != "true":
                wrong.append(f"{ident(svc)} {name}={env_of(svc).get(name)!r}")
    assert not wrong, ("the dry-run overlay leaves these off; add the Service to the replacements in "
                       f"deploy/overlays/dry-run/kustomization.yaml: {wrong}")
    assert any(n.endswith("_DRY_RUN") for svc in knative_services(render("dry-run")) for n in env_of(svc))


def test_overlays_change_only_what_they_are_for():
    """default = base + the Broker class; kafka = base + Kafka Broker class and config + Trigger
    delivery order; dry-run = default + `*_DRY_RUN=true`; prevent = default + the admission policy (Warn);
    prevent-deny = prevent refusing. Nothing else differs."""
    def strip(objects, *, broker=False, triggers=False, dry_run=False):
        out = copy.deepcopy(objects)
        for o in out:
            if broker and o["kind"] == "Broker":
                o["metadata"].pop("annotations", None)
                o["spec"].pop("config", None)
            if triggers and o["kind"] == "Trigger":
                o["metadata"].pop("annotations", None)
            if dry_run and o["kind"] == "Service" and o["apiVersion"].startswith("serving."):
                for e in container(o).get("env") or []:
                    if e["name"].endswith("_DRY_RUN"):
                        e["value"] = "*"
        return out

    base = render("base")
    # default and kafka = base + deploy/components/own-configmaps (each function creates only its own ConfigMap)
    own = [o for o in render("default") if o["apiVersion"].startswith("admissionregistration.")]
    assert sorted(o["metadata"]["name"] for o in own) == ["vmevents-own-configmaps"] * 2

    def without_own(objects):
        return [o for o in objects if o not in own]
    assert [o for o in render("kafka") if o in own] == own
    assert strip(without_own(render("default")), broker=True) == strip(base, broker=True)
    assert strip(without_own(render("kafka")), broker=True, triggers=True) == strip(base, broker=True, triggers=True)
    assert strip(render("dry-run"), dry_run=True) == strip(render("default"), dry_run=True)
    classes = {k: of_kind(render(k), "eventing.knative.dev", "Broker")[0]["metadata"]["annotations"]
               ["eventing.knative.dev/broker.class"] for k in ("default", "kafka")}
    assert classes == {"default": "MTChannelBasedBroker", "kafka": "Kafka"}
    # prevent = default + the admission policy and its binding (Warn); prevent-deny = prevent with Deny.
    policy = [o for o in render("prevent") if o["apiVersion"].startswith("admissionregistration.") and o not in own]
    assert sorted(o["kind"] for o in policy) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert [o for o in render("prevent") if o not in policy] == render("default")
    deny = render("prevent-deny")
    for o in deny:
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o not in own:
            assert o["spec"]["validationActions"] == ["Deny"]
            o["spec"]["validationActions"] = ["Warn"]
    assert deny == render("prevent")
    # monitoring = default + the PodMonitor, the PrometheusRule and the dashboard's ConfigMap.
    watching = [o for o in render("monitoring") if o not in render("default")]
    assert sorted((o["kind"], o["metadata"]["namespace"]) for o in watching) == [
        ("ConfigMap", "cattle-dashboards"), ("PodMonitor", "vmevents"), ("PrometheusRule", "vmevents")]
    assert [o for o in render("monitoring") if o not in watching] == render("default")
    kafka_broker = of_kind(render("kafka"), "eventing.knative.dev", "Broker")[0]
    assert kafka_broker["spec"]["config"] == {"apiVersion": "v1", "kind": "ConfigMap",
                                              "name": "kafka-broker-config", "namespace": "knative-eventing"}


def test_the_simulator_runs_what_base_declares():
    """The e2e tests load deploy/base file by file (localknative/runtime.py); kustomize must agree."""
    from localknative.runtime import load_manifests

    def key(o):
        return (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
    rendered = {key(o): o for o in render("base")}
    loaded = {key(o): o for o in load_manifests(DEPLOY_DIR)}
    assert set(rendered) == set(loaded)
    for k, obj in loaded.items():
        if obj["kind"] == "Service" and obj["apiVersion"].startswith("serving."):
            assert env_of(obj) == env_of(rendered[k])


def test_image_name_is_the_one_make_image_builds():
    images = {container(s)["image"] for s in knative_services(render("base"))}
    kustomization = yaml.safe_load((DEPLOY_DIR / "base" / "kustomization.yaml").read_text())
    image = kustomization["images"][0]
    assert images == {f"{image['newName']}:{image['newTag']}"}
    default = re.search(r"^IMAGE \?= (\S+)", (REPO / "Makefile").read_text(), re.M)
    assert default and default.group(1) == f"{image['newName']}:{image['newTag']}", \
        "make image must build the image deploy/base names (Makefile IMAGE)"

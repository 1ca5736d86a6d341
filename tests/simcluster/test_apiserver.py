"""The simulated API server behaves like the real one where vmevents depends on it.

Every test talks to it with the real `kubernetes` client (CoreV1Api, CustomObjectsApi, watch.Watch), so a
difference between the simulator and a cluster shows up here before it hides a bug in a function.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from simcluster import paths, schemas
from simcluster.apiserver import SimCluster

pytestmark = pytest.mark.timeout(30)

KV = ("kubevirt.io", "v1")
CLEANUP_SA = "vmevents/vmi-cleanup"


# ---------------------------------------------------------------------------------------------------------------
# Builders and fixtures.

def make_pod(name: str, namespace: str = "default", labels: dict | None = None, **status) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}]}, "status": status}


def make_vm(name: str, namespace: str = "default", run_strategy: str | None = "RerunOnFailure", **spec) -> dict:
    """A VM shaped like the seed issue's Harvester VM (a disk, a NIC, a cloud-init volume)."""
    template = {"metadata": {"labels": {"harvesterhci.io/vmName": name}},
                "spec": {"domain": {"cpu": {"cores": 2},
                                    "devices": {"disks": [{"name": "disk-0", "disk": {"bus": "virtio"}},
                                                          {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}],
                                                "interfaces": [{"name": "default", "masquerade": {}}]},
                                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}},
                         "evictionStrategy": "LiveMigrate",
                         "networks": [{"name": "default", "pod": {}}],
                         "terminationGracePeriodSeconds": 120,
                         "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}},
                                     {"name": "cloudinitdisk",
                                      "cloudInitNoCloud": {"userData": "#cloud-config\npackage_update: true"}}]}}
    body = {"template": template, **spec}
    if run_strategy is not None:
        body["runStrategy"] = run_strategy
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {"harvesterhci.io/vmRunStrategy": "RerunOnFailure"}},
            "spec": body}


def make_vmi(name: str, namespace: str = "default", phase: str = "Running", finalizers=()) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": namespace, "finalizers": list(finalizers)},
            "spec": {"domain": {"devices": {}}}, "status": {"phase": phase}}


@pytest.fixture
def cluster():
    with SimCluster() as running:
        yield running


@pytest.fixture
def core(cluster):
    return client.CoreV1Api(cluster.api_client())


@pytest.fixture
def custom(cluster):
    return client.CustomObjectsApi(cluster.api_client())


def raw_client(cluster: SimCluster, retries=None, token: str | None = None) -> client.ApiClient:
    """An ApiClient with urllib3 retries switched off (or a made-up token); the caller closes it."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig(), client_configuration=configuration)
    configuration.retries = retries
    if token:
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
        configuration.refresh_api_key_hook = None  # the kubeconfig loader would put the real token back
    return client.ApiClient(configuration)


def status_of(error: ApiException) -> dict:
    return json.loads(error.body)


def lifecycle_put(api_client, namespace: str, name: str, action: str, body: dict | None = None):
    """PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachines/NAME/<action>, as virtctl does."""
    request = api_client.param_serialize(
        "PUT", f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/{action}",
        header_params={"Content-Type": "application/json", "Accept": "application/json"}, body=body or {},
        auth_settings=["BearerToken"])
    response = api_client.call_api(*request)
    response.read()
    return api_client.response_deserialize(response, {"202": None})


# ---------------------------------------------------------------------------------------------------------------
# Start-up, CRUD, resourceVersion.

def test_start_seeds_namespaces_and_the_kubevirt_cr(cluster, custom):
    kubevirt = custom.get_namespaced_custom_object(*KV, "kubevirt", "kubevirts", "kubevirt")
    assert kubevirt["status"]["observedKubeVirtVersion"] == "v1.3.1"
    assert kubevirt["status"]["phase"] == "Deployed"
    assert {"default", "kubevirt", "vmevents"} <= {n["metadata"]["name"] for n in cluster.list("v1", "Namespace")}


def test_crud_round_trip_bumps_resource_version(core):
    created = core.create_namespaced_pod("default", make_pod("p1", phase="Running"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.status.phase == "Pending"  # pod strategy PrepareForCreate resets the status

    created.metadata.labels = {"x": "1"}
    replaced = core.replace_namespaced_pod("p1", "default", created)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    assert core.read_namespaced_pod("p1", "default").metadata.labels == {"x": "1"}

    core.delete_namespaced_pod("p1", "default")
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("p1", "default")
    assert gone.value.status == 404
    assert status_of(gone.value)["reason"] == "NotFound"
    assert status_of(gone.value)["message"] == 'pods "p1" not found'


def test_generate_name_and_already_exists(core):
    generated = core.create_namespaced_pod("default", {"metadata": {"generateName": "virt-launcher-vm1-"},
                                                       "spec": {"containers": []}})
    assert len(generated.metadata.name) == len("virt-launcher-vm1-") + 5
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_pod("default", {"metadata": {"name": generated.metadata.name},
                                              "spec": {"containers": []}})
    assert (exists.value.status, status_of(exists.value)["reason"]) == (409, "AlreadyExists")


def test_update_with_a_stale_resource_version_conflicts(cluster, custom):
    vm = custom.create_namespaced_custom_object(*KV, "default", "virtualmachines", make_vm("vm1"))
    custom.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1",
                                          {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as stale:
        custom.replace_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1", vm)
    assert stale.value.status == 409
    assert status_of(stale.value)["message"] == ('Operation cannot be fulfilled on virtualmachines.kubevirt.io "vm1": '
                                                 "the object has been modified; please apply your changes to the "
                                                 "latest version and try again")


# ---------------------------------------------------------------------------------------------------------------
# Lists: pagination and selectors.

def test_pagination_with_limit_and_continue(cluster, core):
    for index in range(7):
        cluster.create(make_pod(f"p{index}", namespace="ns-b" if index % 2 else "ns-a"))
    pages, token = [], None
    while True:
        page = core.list_pod_for_all_namespaces(limit=3, _continue=token)
        pages.append([(p.metadata.namespace, p.metadata.name) for p in page.items])
        token = page.metadata._continue
        if not token:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    flat = [item for page in pages for item in page]
    assert flat == sorted(flat)  # stable order by namespace/name, nothing lost or repeated
    assert len(set(flat)) == 7


@pytest.mark.parametrize("selector, expected", [
    ("app=vm", ["a", "b"]),
    ("app==vm,tier=web", ["a"]),
    ("tier!=web", ["b", "c"]),          # != also matches pods without the key
    ("tier in (db, cache)", ["b"]),
    ("tier notin (web)", ["b", "c"]),
    ("tier", ["a", "b"]),
    ("!tier", ["c"]),
], ids=["equals", "double-equals-and", "not-equals", "in", "notin", "exists", "not-exists"])
def test_label_selectors(cluster, core, selector, expected):
    cluster.create(make_pod("a", labels={"app": "vm", "tier": "web"}))
    cluster.create(make_pod("b", labels={"app": "vm", "tier": "db"}))
    cluster.create(make_pod("c", labels={"app": "other"}))
    found = core.list_namespaced_pod("default", label_selector=selector).items
    assert sorted(p.metadata.name for p in found) == expected


def test_field_selectors_and_unsupported_fields(cluster, core):
    cluster.create(make_pod("done", phase="Succeeded"))
    cluster.create(make_pod("busy", phase="Running"))
    succeeded = core.list_namespaced_pod("default", field_selector="status.phase=Succeeded").items
    assert [p.metadata.name for p in succeeded] == ["done"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="metadata.name!=done").items] \
        == ["busy"]
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_pod("default", field_selector="spec.hostname=x")
    assert (bad.value.status, status_of(bad.value)["message"]) == (400, "field label not supported: spec.hostname")


# ---------------------------------------------------------------------------------------------------------------
# Watch.

def test_watch_from_a_resource_version_streams_only_later_changes(cluster, custom):
    vmi = cluster.create(make_vmi("vm1"))
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1", {"status": {"phase": "Succeeded"}})
    cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1")
    stream = watch.Watch().stream(custom.list_cluster_custom_object, *KV, "virtualmachineinstances",
                                  resource_version=vmi["metadata"]["resourceVersion"], timeout_seconds=5)
    events = [next(stream), next(stream)]
    stream.close()
    assert [(e["type"], e["object"]["status"]["phase"]) for e in events] == [("MODIFIED", "Succeeded"),
                                                                             ("DELETED", "Succeeded")]


def test_watch_without_resource_version_starts_with_the_current_state(cluster, core):
    cluster.create(make_pod("existing"))
    stream = watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=2)
    first = next(stream)
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "existing")
    threading.Timer(0.2, lambda: cluster.create(make_pod("later"))).start()
    second = next(stream)
    assert (second["type"], second["object"].metadata.name) == ("ADDED", "later")
    stream.close()


def test_watch_from_a_compacted_resource_version_gets_410_gone(cluster, custom):
    old = cluster.create(make_vmi("vm1"))["metadata"]["resourceVersion"]
    cluster.patch("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1", {"metadata": {"labels": {"a": "b"}}})
    cluster.compact()
    with pytest.raises(ApiException) as expired:
        list(watch.Watch().stream(custom.list_cluster_custom_object, *KV, "virtualmachineinstances",
                                  resource_version=old, timeout_seconds=1))
    assert expired.value.status == 410
    assert "Expired: too old resource version" in expired.value.reason


def test_watch_with_a_label_selector_sees_objects_leave_the_selection(cluster, core):
    pod = cluster.create(make_pod("p", labels={"kubevirt.io": "virt-launcher"}))
    cluster.patch("v1", "Pod", "default", "p", {"metadata": {"labels": {"kubevirt.io": None}}})
    stream = watch.Watch().stream(core.list_pod_for_all_namespaces, label_selector="kubevirt.io=virt-launcher",
                                  resource_version=pod["metadata"]["resourceVersion"], timeout_seconds=5)
    assert next(stream)["type"] == "DELETED"
    stream.close()


def test_stop_ends_open_watches_and_frees_the_port():
    cluster = SimCluster().start()
    port = int(cluster.url.rsplit(":", 1)[1])
    core = client.CoreV1Api(cluster.api_client())
    ended = threading.Event()

    def watch_forever():
        try:
            for _ in watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version="1"):
                pass
        except Exception:  # noqa: BLE001 - the connection going away is one legitimate way to end
            pass
        ended.set()

    threading.Thread(target=watch_forever, daemon=True).start()
    time.sleep(0.3)
    started = time.monotonic()
    cluster.stop()
    assert ended.wait(3)
    assert time.monotonic() - started < 2
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


# ---------------------------------------------------------------------------------------------------------------
# Delete: preconditions, finalizers.

@pytest.mark.parametrize("preconditions, label", [
    ({"uid": "00000000-0000-0000-0000-000000000000"}, "UID"),
    ({"resourceVersion": "1"}, "ResourceVersion"),
], ids=["uid", "resourceVersion"])
def test_delete_precondition_mismatch_conflicts_and_leaves_the_object(cluster, custom, preconditions, label):
    vmi = cluster.create(make_vmi("vm1", phase="Succeeded"))
    with pytest.raises(ApiException) as failed:
        custom.delete_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1",
                                               body=client.V1DeleteOptions(preconditions=preconditions))
    message = status_of(failed.value)["message"]
    assert failed.value.status == 409
    assert message.startswith('Operation cannot be fulfilled on virtualmachineinstances.kubevirt.io "vm1": ')
    wanted, actual = (preconditions.get("uid"), vmi["metadata"]["uid"]) if label == "UID" else \
        (preconditions.get("resourceVersion"), vmi["metadata"]["resourceVersion"])
    assert f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}" in message
    assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1") == vmi


def test_delete_with_matching_preconditions_and_absent_objects(cluster, custom):
    vmi = cluster.create(make_vmi("vm1"))
    preconditions = {"uid": vmi["metadata"]["uid"], "resourceVersion": vmi["metadata"]["resourceVersion"]}
    custom.delete_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1",
                                           body=client.V1DeleteOptions(preconditions=preconditions))
    assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1") is None
    with pytest.raises(ApiException) as absent:
        custom.delete_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1")
    assert (absent.value.status, status_of(absent.value)["reason"]) == (404, "NotFound")


def test_finalizers_hold_deletion_until_emptied(cluster, custom):
    cluster.create(make_vmi("vm1", finalizers=["kubevirt.io/virtualMachineControllerFinalize"]))
    held = custom.delete_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["deletionGracePeriodSeconds"] == 0
    assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1") is not None
    with pytest.raises(ApiException) as added:
        finalizers = ["a", "kubevirt.io/virtualMachineControllerFinalize"]
        custom.patch_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1",
                                              {"metadata": {"finalizers": finalizers}})
    assert added.value.status == 422
    custom.patch_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1",
                                          {"metadata": {"finalizers": None}})
    assert cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", "vm1") is None


# ---------------------------------------------------------------------------------------------------------------
# Patches and the status subresource.

def test_json_patch_failed_test_is_rejected_and_changes_nothing(cluster, custom):
    before = cluster.create(make_vm("vm1"))
    with pytest.raises(ApiException) as rejected:
        custom.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1", [
            {"op": "test", "path": "/spec/runStrategy", "value": "Always"},
            {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"}],
            _content_type="application/json-patch+json")
    # handlers/patch.go: 422 via NewGenericServerResponse, the generic message, no causes.
    assert (rejected.value.status, status_of(rejected.value)["reason"]) == (422, "Invalid")
    assert cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "vm1") == before


def test_merge_patch_sets_and_removes_fields_and_honours_resource_version(cluster, custom):
    vm = cluster.create(make_vm("vm1"))
    patched = custom.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1", {
        "metadata": {"annotations": {"harvesterhci.io/vmRunStrategy": None, "note": "x"}},
        "spec": {"runStrategy": "Halted"}})
    assert patched["metadata"]["annotations"] == {"note": "x"}
    assert patched["spec"]["runStrategy"] == "Halted" and patched["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as stale:
        custom.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1", {
            "metadata": {"resourceVersion": vm["metadata"]["resourceVersion"]}, "spec": {"runStrategy": "Always"}})
    assert stale.value.status == 409


def test_status_subresource_separates_spec_and_status_writes(cluster, custom):
    cluster.create(make_vm("vm1"))
    main = custom.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1",
                                                 {"status": {"printableStatus": "Running"}})
    assert "status" not in main and main["metadata"]["generation"] == 1
    status = custom.patch_namespaced_custom_object_status(*KV, "default", "virtualmachines", "vm1", {
        "spec": {"runStrategy": "Halted"}, "status": {"printableStatus": "Stopped"}})
    assert status["status"] == {"printableStatus": "Stopped"}
    assert status["spec"]["runStrategy"] == "RerunOnFailure" and status["metadata"]["generation"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Schema validation.

def test_schema_accepts_the_seed_like_vm_and_rejects_a_numeric_run_strategy(custom):
    custom.create_namespaced_custom_object(*KV, "default", "virtualmachines", make_vm("seed"))
    with pytest.raises(ApiException) as invalid:
        custom.create_namespaced_custom_object(*KV, "default", "virtualmachines", make_vm("bad", run_strategy=5))
    body = status_of(invalid.value)
    assert (invalid.value.status, body["reason"]) == (422, "Invalid")
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.runStrategy"]
    assert body["message"].startswith('VirtualMachine.kubevirt.io "bad" is invalid: spec.runStrategy: Invalid value')


def test_schema_prunes_unknown_fields_and_checks_longhorn_kinds(cluster, custom):
    vm = custom.create_namespaced_custom_object(*KV, "default", "virtualmachines",
                                                make_vm("vm1", runStrategyy="Always"))
    assert "runStrategyy" not in vm["spec"]  # pruned silently, as the server-default fieldValidation does
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "longhorn-system"}})
    with pytest.raises(ApiException) as invalid:
        custom.create_namespaced_custom_object("longhorn.io", "v1beta2", "longhorn-system", "volumes", {
            "apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "metadata": {"name": "pvc-1"},
            "spec": {"numberOfReplicas": "three"}})
    assert status_of(invalid.value)["details"]["causes"][0]["field"] == "spec.numberOfReplicas"


@pytest.mark.parametrize("version, release", [("1.1.1", "v1.3.1"), ("1.3.1", "v1.3.1"), ("1.4.0", "v1.8.3"),
                                              ("1.8.3", "v1.8.3")])
def test_kubevirt_schema_follows_the_cluster_version(version, release):
    assert schemas.kubevirt_schema_dir(version).parent.name == release


def test_upstream_pcidevice_sample_is_accepted(cluster):
    sample = yaml.safe_load((paths.UPSTREAM_DIR / "harvester-pcidevices" / "sample-pcidevice.yaml").read_text())
    stored = cluster.create(sample)
    assert stored["status"]["resourceName"] == "intel.com/ETHERNET_CONNECTION_11_I219LM"
    assert cluster.list("devices.harvesterhci.io/v1beta1", "PCIDevice")[0]["metadata"]["name"] == "pcidevice-sample"


def test_events_keep_count_and_timestamps_as_given(core):
    core.create_namespaced_event("default", {
        "metadata": {"name": "vm1.cleanup"}, "reason": "VMICleaned", "type": "Normal", "count": 3,
        "firstTimestamp": "2024-02-21T01:47:04Z", "lastTimestamp": "2024-02-21T02:00:00Z",
        "involvedObject": {"kind": "VirtualMachine", "namespace": "default", "name": "vm1"}})
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=vm1").items
    assert [(e.count, e.first_timestamp.isoformat(), e.last_timestamp.isoformat()) for e in found] == \
        [(3, "2024-02-21T01:47:04+00:00", "2024-02-21T02:00:00+00:00")]


# ---------------------------------------------------------------------------------------------------------------
# RBAC from deploy/base.

@pytest.mark.parametrize("call, allowed", [
    (lambda c, k: c.list_cluster_custom_object(*KV, "virtualmachineinstances"), True),
    (lambda c, k: c.get_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1"), True),
    (lambda c, k: c.patch_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1",
                                                   {"spec": {"runStrategy": "Halted"}}), True),
    (lambda c, k: c.delete_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1"), True),
    (lambda c, k: c.list_cluster_custom_object(*KV, "kubevirts"), True),
    (lambda c, k: k.create_namespaced_event("default", {
        "metadata": {"name": "e1"}, "reason": "Cleaned",
        "involvedObject": {"kind": "VirtualMachine", "name": "vm1"}}), True),
    (lambda c, k: c.delete_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1"), False),
    (lambda c, k: c.patch_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1",
                                                   {"metadata": {"labels": {"a": "b"}}}), False),
    (lambda c, k: c.get_namespaced_custom_object(*KV, "default", "virtualmachineinstances", "vm1"), True),
    (lambda c, k: c.get_namespaced_custom_object(*KV, "kubevirt", "kubevirts", "kubevirt"), False),
    (lambda c, k: k.list_namespaced_pod("default"), False),
    (lambda c, k: c.patch_namespaced_custom_object_status(*KV, "default", "virtualmachines", "vm1",
                                                          {"status": {}}), False),
], ids=["list-vmis", "get-vm", "patch-vm", "delete-vmi", "list-kubevirts", "create-event", "delete-vm",
        "patch-vmi", "get-vmi", "get-kubevirt", "list-pods", "patch-vm-status"])
def test_rbac_grants_exactly_what_deploy_base_grants(cluster, call, allowed):
    cluster.create(make_vm("vm1"))
    cluster.create(make_vmi("vm1"))
    api = cluster.api_client(CLEANUP_SA)
    try:
        call(client.CustomObjectsApi(api), client.CoreV1Api(api))
        denied = None
    except ApiException as error:
        denied = error
    assert (denied is None) == allowed, denied and denied.body
    if not allowed:
        assert (denied.status, status_of(denied)["reason"]) == (403, "Forbidden")
    assert cluster.requests[-1].allowed == allowed


def test_forbidden_message_is_the_real_one(cluster):
    cluster.create(make_vm("vm1"))
    api = client.CustomObjectsApi(cluster.api_client(CLEANUP_SA))
    with pytest.raises(ApiException) as denied:
        api.delete_namespaced_custom_object(*KV, "default", "virtualmachines", "vm1")
    assert status_of(denied.value)["message"] == (
        'virtualmachines.kubevirt.io "vm1" is forbidden: User "system:serviceaccount:vmevents:vmi-cleanup" '
        'cannot delete resource "virtualmachines" in API group "kubevirt.io" in the namespace "default"')
    assert cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "vm1") is not None


def test_unknown_token_is_unauthorized(cluster):
    with raw_client(cluster, token="not-a-token") as api:
        with pytest.raises(ApiException) as unauthorized:
            client.CoreV1Api(api).list_namespace()
    assert (unauthorized.value.status, status_of(unauthorized.value)["reason"]) == (401, "Unauthorized")
    assert cluster.requests[-1].service_account is None


# ---------------------------------------------------------------------------------------------------------------
# Faults.

def test_fault_status_503_then_recovery(cluster, core):
    cluster.faults.add(method="GET", path=r"/namespaces/default/pods$", status=503)
    with pytest.raises(ApiException) as unavailable:
        core.list_namespaced_pod("default")
    assert (unavailable.value.status, status_of(unavailable.value)["reason"]) == (503, "ServiceUnavailable")
    assert core.list_namespaced_pod("default").items == []  # times=1: the next call goes through


def test_fault_429_carries_retry_after(cluster):
    cluster.faults.add(status=429, retry_after=3, service_account="admin")
    with raw_client(cluster, retries=False) as api:
        with pytest.raises(ApiException) as throttled:
            client.CoreV1Api(api).list_namespace()
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "3"
    assert status_of(throttled.value)["details"]["retryAfterSeconds"] == 3


def test_default_client_retries_a_429_after_retry_after(cluster, core):
    # urllib3's default Retry honours Retry-After on 429/503: one throttled answer costs time, not an error.
    cluster.faults.add(status=429, retry_after=1)
    started = time.monotonic()
    assert core.list_namespace().items
    assert time.monotonic() - started >= 1
    assert [r.status for r in cluster.requests] == [429, 200]


def test_fault_only_hits_the_matching_caller(cluster):
    cluster.faults.add(status=500, service_account=CLEANUP_SA, times=None)
    assert client.CoreV1Api(cluster.api_client()).list_namespace().items
    with pytest.raises(ApiException) as failed:
        client.CustomObjectsApi(cluster.api_client(CLEANUP_SA)).list_cluster_custom_object(*KV, "kubevirts")
    assert failed.value.status == 500


def test_fault_drop_is_a_connection_error(cluster, core):
    cluster.faults.add(kind="drop", times=None)
    with pytest.raises((urllib3.exceptions.HTTPError, ConnectionError)):
        core.list_namespace()
    assert cluster.requests[-1].status == 0
    cluster.faults.clear()
    assert core.list_namespace().items


def test_fault_latency_delays_the_answer(cluster, core):
    cluster.faults.add(kind="latency", delay=0.3)
    started = time.monotonic()
    core.list_namespace()
    assert time.monotonic() - started >= 0.3


def test_direct_access_bypasses_faults(cluster):
    cluster.faults.add(status=503, times=None)
    assert cluster.create(make_pod("p"))["metadata"]["name"] == "p"
    assert cluster.requests == []


# ---------------------------------------------------------------------------------------------------------------
# KubeVirt start/stop (pkg/virt-api/rest/lifecycle.go).

@pytest.mark.parametrize("action, spec, vmi_phase, code, expect", [
    ("stop", {"runStrategy": "Always"}, "Running", 202, {"runStrategy": "Halted"}),
    ("stop", {"runStrategy": "Once"}, "Succeeded", 202, {"runStrategy": "Halted"}),
    ("stop", {"runStrategy": "Halted"}, None, 409, "VM is not running"),
    ("stop", {"runStrategy": "RerunOnFailure"}, "Succeeded", 409, "VM is not running"),
    ("stop", {"runStrategy": "Manual"}, None, 409, "VM is not running"),
    ("stop", {"runStrategy": "RerunOnFailure"}, "Running", 202, [{"action": "Stop", "uid": "<vmi>"}]),
    ("stop", {"running": True}, "Running", 202, {"running": False}),
    ("start", {"runStrategy": "Halted"}, None, 202, {"runStrategy": "Always"}),
    ("start", {"running": False}, None, 202, {"running": True}),
    ("start", {"runStrategy": "Manual"}, None, 202, [{"action": "Start"}]),
    ("start", {"runStrategy": "RerunOnFailure"}, "Succeeded", 202,
     [{"action": "Stop", "uid": "<vmi>"}, {"action": "Start"}]),
    ("start", {"runStrategy": "Always"}, None, 409, "Always does not support manual start requests"),
    ("start", {"runStrategy": "Manual"}, "Running", 409, "VM is already running"),
], ids=["stop-always", "stop-once", "stop-halted", "stop-rerun-final", "stop-manual-novmi", "stop-rerun-running",
        "stop-legacy-running", "start-halted", "start-legacy-stopped", "start-manual", "start-rerun-succeeded",
        "start-always", "start-manual-running"])
def test_start_stop_subresources(cluster, action, spec, vmi_phase, code, expect):
    vm = make_vm("vm1", run_strategy=None)
    vm["spec"].update(spec)
    cluster.create(vm)
    vmi = cluster.create(make_vmi("vm1", phase=vmi_phase)) if vmi_phase else None
    api = cluster.api_client()
    if code != 202:
        with pytest.raises(ApiException) as refused:
            lifecycle_put(api, "default", "vm1", action)
        assert refused.value.status == code
        assert status_of(refused.value)["message"] == \
            f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "vm1": {expect}'
        return
    assert lifecycle_put(api, "default", "vm1", action).status_code == 202
    after = cluster.get("kubevirt.io/v1", "VirtualMachine", "default", "vm1")
    if isinstance(expect, dict):
        assert {k: after["spec"].get(k) for k in expect} == expect
    else:
        wanted = [dict(r, uid=vmi["metadata"]["uid"]) if r.get("uid") else r for r in expect]
        assert after["status"]["stateChangeRequests"] == wanted


def test_stop_needs_its_own_rbac_grant(cluster):
    cluster.create(make_vm("vm1", run_strategy="Always"))
    with pytest.raises(ApiException) as denied:
        lifecycle_put(cluster.api_client(CLEANUP_SA), "default", "vm1", "stop")
    assert 'cannot update resource "virtualmachines/stop" in API group "subresources.kubevirt.io"' in \
        status_of(denied.value)["message"]


# ---------------------------------------------------------------------------------------------------------------
# Concurrency.

def test_concurrent_writers_get_distinct_resource_versions(cluster):
    api = client.CoreV1Api(cluster.api_client())
    versions, errors = [], []

    def write(index):
        try:
            versions.append(api.create_namespaced_pod("default", make_pod(f"p{index}")).metadata.resource_version)
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(set(versions)) == 16

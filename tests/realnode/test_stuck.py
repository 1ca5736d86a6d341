"""vm-stuck-report on what the real scheduler and kubelet write (issue 33, story 2), on `make cluster NODE=real`.

Each case sets a cause up as an operator meets it, on the real node: KubeVirt 1.3 (virt-operator, useEmulation) makes
the launcher pod, kube-scheduler refuses or places it, the kubelet pulls its images under containerd, and KubeVirt's
VM controller prints what it reads of them. vm-stuck-report runs as `make run` runs it (localknative: the functions
of deploy/ as processes with their own ServiceAccounts' tokens, the broker, the sources), its PingSource ticked by
the test. Each cause is named once (one `.detected` notice, one `VMStuck` Event) with its real evidence, and resolved
once it is fixed (one `.resolved`, one `VMStuckResolved`):

- (a) a VM asking more memory than the node has: kube-scheduler's FailedScheduling, cause insufficient-resources;
  resolved when the VM's memory is lowered and KubeVirt restarts it (virt-api's `restart`), and it runs;
- (b) a containerDisk whose image does not exist: the kubelet's ErrImagePull / ImagePullBackOff in KubeVirt's init
  container `volume<name>-init`, cause image-pull; resolved when the VM is stopped;
- (c) a taint the VM does not tolerate (`kubectl taint`): cause node-placement; resolved when the taint is removed
  and the VM runs;
- (d) a PVC whose StorageClass names a provisioner nothing runs: kube-scheduler's "pod has unbound immediate
  PersistentVolumeClaims", cause volume-unbound; resolved when an operator makes a PersistentVolume by hand, the
  PV controller binds the claim, and the guest boots from it.

VM_STUCK_AFTER is 2 s for the states these causes put a VM in, as in the function's e2e tests; `Starting` keeps
5 minutes (VM_STUCK_AFTER_BY_STATE), so that a healthy guest's boot under TCG on a loaded machine, which takes tens
of seconds, is not itself reported. Every wait is for a condition, with a generous bound."""
from __future__ import annotations

import itertools
import json
import re
import secrets
import time

import pytest

from controlplane.node import NODE_NAME
from localknative.paths import DEPLOY_DIR
from localknative.runtime import LocalKnative, load_manifests
from tests import e2e
from tests.realnode.guests import (
    NAMESPACE,
    boots,
    describe_pods,
    guest_vm,
    launcher_pods,
    remove,
    wait_for,
    with_boot_disk,
)

pytestmark = [pytest.mark.realnode, pytest.mark.real, pytest.mark.timeout(2700)]
FUNCTION = "vm-stuck-report"
AFTER = 2.0   # VM_STUCK_AFTER, seconds
VM = ("kubevirt.io/v1", "VirtualMachine")
_names = itertools.count(1)
_RUN = secrets.token_hex(2)   # this session's


class Report:
    """vm-stuck-report (and the rest of deploy/) run locally against the real-node cluster, as `make run` does;
    vmi-cleanup in its dry run. The PingSource fires when the test ticks it."""

    def __init__(self, real_node):
        self.real_node = real_node
        self.cluster = real_node.cluster
        cluster = self.cluster
        self.knative = LocalKnative(
            load_manifests(DEPLOY_DIR),
            kubeconfig_for=lambda sa: cluster.kubeconfig(service_account=sa),
            api_client_for=lambda sa: cluster.api_client(service_account=sa),
            api_server_url=cluster.url, time_scale=0.01,
            env_overrides={FUNCTION: {"VM_STUCK_AFTER": f"{AFTER:.0f}s", "VM_STUCK_AFTER_BY_STATE": "Starting=5m"},
                           "vmi-cleanup": {"CLEANUP_DRY_RUN": "true"}},
        ).start()

    def stop(self) -> None:
        self.knative.stop()

    def tick(self) -> None:
        self.knative.wait_idle(timeout=60)
        self.knative.ping.tick()
        self.knative.wait_idle(timeout=60)

    # -- what was announced and recorded --------------------------------------------------------------
    def notices(self, name: str, state: str = "detected") -> list[dict]:
        found = []
        for event in list(self.knative.broker.received):
            if event["source"] != f"/vmevents/{FUNCTION}":
                continue
            data = e2e.data_of(event)
            for item in data.get("findings", [data]):
                if item.get("details", {}).get("vm") == f"{NAMESPACE}/{name}" and item.get("state") == state:
                    found.append(item)
        return found

    def events(self, name: str) -> list[dict]:
        return [e for e in self.cluster.list("v1", "Event", NAMESPACE)
                if (e.get("source") or {}).get("component") == FUNCTION and e["involvedObject"]["name"] == name]

    def finding(self, name: str) -> dict:
        """The finding on record about VM `name`, as its Event holds it now (docs/findings.md)."""
        [event] = [e for e in self.events(name) if "vmevents.io/finding" in (e["metadata"].get("annotations") or {})]
        return json.loads(event["metadata"]["annotations"]["vmevents.io/finding"])

    def reported(self, name: str, cause: str) -> dict:
        """Ticks until the one `.detected` notice; then, as on a loaded machine the first report may precede the
        facts that explain it (the cause then follows on record, with no second notice), ticks until the finding on
        record names `cause`. Two more ticks announce nothing."""
        notice = wait_for(f"a .detected notice about {name}", lambda: (self.tick(), self.notices(name))[1],
                          timeout=180)
        finding = wait_for(f"the finding's cause {cause}",
                           lambda: (self.tick(), self.finding(name))[1]["details"]["cause"] == cause
                           and self.finding(name), timeout=180,
                           explain=lambda: f"on record: {self.finding(name)['details']}")
        self.tick()
        self.tick()
        assert len(self.notices(name)) == 1, ("a stuck VM is announced once per episode",
                                              [n["details"] for n in self.notices(name)])
        [event] = self.events(name)
        assert (event["reason"], event["type"]) == ("VMStuck", "Warning"), event
        return finding if notice[0]["details"]["cause"] != cause else notice[0]

    def resolved(self, name: str) -> dict:
        """Ticks until the one `.resolved` notice; a further tick announces nothing; `kubectl describe vm` shows the
        episode and its end."""
        [notice] = wait_for(f"a .resolved notice about {name}",
                            lambda: (self.tick(), self.notices(name, "resolved"))[1], timeout=180)
        self.tick()
        assert len(self.notices(name, "resolved")) == 1 and len(self.notices(name)) == 1, \
            [(n["details"]["state"], n["key"], n.get("episode")) for n in self.notices(name)]
        stuck, end = sorted(self.events(name), key=lambda e: e["reason"])
        assert (stuck["reason"], stuck["type"]) == ("VMStuck", "Warning")
        assert (end["reason"], end["type"], end["count"]) == ("VMStuckResolved", "Normal", 1)
        assert end["message"] == notice["summary"]
        return notice


@pytest.fixture(scope="module")
def report(real_node):
    watcher = Report(real_node)
    try:
        yield watcher
    finally:
        watcher.stop()


@pytest.fixture
def vms(real_node):
    """Names for a test's VMs, new on each run (a reused cluster keeps an earlier run's Events about its VMs for
    kube-apiserver's --event-ttl), each VM and its VMI and pods removed after the test."""
    made: list[str] = []

    def name(base: str) -> str:
        made.append(f"{base}-{_RUN}{next(_names)}")
        return made[-1]

    yield name
    remove(real_node, made)


def status(cluster, name: str) -> str | None:
    vm = cluster.get(*VM, NAMESPACE, name) or {}
    return (vm.get("status") or {}).get("printableStatus")


def wait_status(real_node, name: str, *wanted: str, timeout: float = 300) -> str:
    cluster = real_node.cluster
    return wait_for(f"VM {name} {'/'.join(wanted)}", lambda: status(cluster, name) in wanted and status(cluster, name),
                    timeout=timeout, explain=lambda: f"VM reads {status(cluster, name)}; pods: "
                    f"{describe_pods(cluster, name)}\n{real_node.logs(1500)}")


def check(notice: dict, cause: str, evidence: str, step: str) -> dict:
    d = notice["details"]
    assert d["cause"] == cause, (d["cause"], d["evidence"], d["checked"])
    assert any(evidence in e for e in d["evidence"]), (evidence, d["evidence"])
    assert step.lower() in d["nextStep"].lower(), d["nextStep"]
    return d


def scheduler_event(cluster, name: str) -> dict:
    """kube-scheduler's newest FailedScheduling Event on the VM's launcher pod."""
    failed = [e for e in cluster.list("v1", "Event", NAMESPACE) if e["reason"] == "FailedScheduling"
              and e["involvedObject"]["name"].startswith(f"virt-launcher-{name}-")]
    assert failed, f"no FailedScheduling Event on {name}'s launcher pod"
    return failed[-1]


def test_a_vm_asking_more_memory_than_the_node_has(real_node, report, vms):
    cluster, name = real_node.cluster, vms("mem")
    started = time.monotonic()
    cluster.create(guest_vm(name, run_strategy="RerunOnFailure", memory="1Ti"))
    wait_status(real_node, name, "ErrorUnschedulable")
    notice = report.reported(name, "insufficient-resources")
    d = check(notice, "insufficient-resources", "1 Insufficient memory", "lower the VM's request")
    failed = scheduler_event(cluster, name)
    print(f"\n{name}: kube-scheduler wrote {failed['message']!r}\nevidence: {d['evidence']}\n"
          f"next step: {d['nextStep']}")
    assert failed["message"].startswith("0/1 nodes are available: 1 Insufficient memory. preemption: "), failed
    assert any(failed["message"] in e for e in d["evidence"]), d["evidence"]   # the scheduler's own words
    reported = time.monotonic()

    # the fix: a memory the node has, and a restart (virt-api's) so that KubeVirt makes the VMI again from it
    cluster.patch(*VM, NAMESPACE, name, {"spec": {"template": {"spec": {"domain": {
        "resources": {"requests": {"memory": "128Mi"}}}}}}})
    cluster.vm_subresource(NAMESPACE, name, "restart")
    wait_status(real_node, name, "Running")
    # The episode is the refused VMI's: it ends when a tick (or the VM's update, through the ApiServerSource) sees the
    # VM running, or sees that VMI replaced by the restart, whichever comes first; the new VMI runs, and is not
    # announced (one .detected, checked by resolved())
    because = report.resolved(name)["details"]["because"]
    assert "Running" in because or "the VMI it was about is gone or was replaced" in because, because
    print(f"{name}: resolved because {because}")
    print(f"{name}: reported {reported - started:.0f}s, resolved {time.monotonic() - started:.0f}s after creation")


def test_a_container_disk_whose_image_does_not_exist(real_node, report, vms):
    """KubeVirt pulls a containerDisk's image in the launcher's init container `volume<name>-init`; the kubelet
    leaves it waiting ErrImagePull, then ImagePullBackOff, and KubeVirt copies the reason to the VMI's Synchronized
    condition and prints it (docs/facts.md §7, §9)."""
    cluster, name = real_node.cluster, vms("pull")
    image = "registry.example.invalid/vms/fedora:41"
    started = time.monotonic()
    vm = guest_vm(name, run_strategy="RerunOnFailure",
                  disks=[{"name": "containerdisk", "disk": {"bus": "virtio"}}],
                  volumes=[{"name": "containerdisk", "containerDisk": {"image": image,
                                                                      "imagePullPolicy": "IfNotPresent"}}])
    cluster.create(vm)
    wait_status(real_node, name, "ErrImagePull", "ImagePullBackOff")
    notice = report.reported(name, "image-pull")
    d = check(notice, "image-pull", f"init container volumecontainerdisk-init (image {image}) waits: ",
              f"cannot pull image {image}")
    evidence = "\n".join(d["evidence"])
    print(f"\n{name}: evidence:\n{evidence}\nnext step: {d['nextStep']}\npods: {describe_pods(cluster, name)}")
    assert re.search(rf"VirtualMachineInstance/{name}: Synchronized=False \((ErrImagePull|ImagePullBackOff)\)",
                     evidence), evidence
    assert f'Failed to pull image "{image}"' in evidence, evidence   # the kubelet's Event
    assert "containerDisk volume containerdisk" in d["nextStep"], d["nextStep"]
    reported = time.monotonic()

    cluster.patch(*VM, NAMESPACE, name, {"spec": {"runStrategy": "Halted"}})
    wait_status(real_node, name, "Stopped")
    report.resolved(name)
    print(f"{name}: reported {reported - started:.0f}s, resolved {time.monotonic() - started:.0f}s after creation")


def test_a_taint_the_vm_does_not_tolerate(real_node, report, vms):
    cluster, name = real_node.cluster, vms("taint")
    taint = "dedicated=gpu:NoSchedule"
    real_node.kubectl("taint", "nodes", NODE_NAME, f"{taint}-", check=False)   # an interrupted run's
    started = time.monotonic()
    real_node.kubectl("taint", "nodes", NODE_NAME, taint)
    try:
        cluster.create(guest_vm(name, run_strategy="RerunOnFailure"))
        wait_status(real_node, name, "ErrorUnschedulable")
        notice = report.reported(name, "node-placement")
        d = check(notice, "node-placement", "1 node(s) had untolerated taint {dedicated: gpu}", "toleration")
        failed = scheduler_event(cluster, name)
        print(f"\n{name}: kube-scheduler wrote {failed['message']!r}\nevidence: {d['evidence']}\n"
              f"next step: {d['nextStep']}")
        assert any(failed["message"] in e for e in d["evidence"]), d["evidence"]
        reported = time.monotonic()
    finally:
        real_node.kubectl("taint", "nodes", NODE_NAME, f"{taint}-", check=False)
    wait_status(real_node, name, "Running")
    report.resolved(name)
    print(f"{name}: reported {reported - started:.0f}s, resolved {time.monotonic() - started:.0f}s after creation")
    assert launcher_pods(cluster, name)



def test_a_pvc_no_provisioner_binds(real_node, report, vms):
    from controlplane import node as realnode

    cluster, name = real_node.cluster, vms("nfs")
    klass, provisioner, size = "vmevents-slow-nfs", "nfs.csi.k8s.io", "64Mi"
    started = time.monotonic()
    cluster.delete("storage.k8s.io/v1", "StorageClass", None, klass)
    cluster.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": klass},
                    "provisioner": provisioner, "volumeBindingMode": "Immediate", "reclaimPolicy": "Retain"})
    try:
        cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": klass,
                                 "volumeMode": "Filesystem", "resources": {"requests": {"storage": size}}}})
        cluster.create(with_boot_disk(guest_vm(name, run_strategy="RerunOnFailure"), name))
        wait_status(real_node, name, "WaitingForVolumeBinding", "ErrorUnschedulable")
        notice = report.reported(name, "volume-unbound")
        d = check(notice, "volume-unbound", f"StorageClass {klass}: provisioner {provisioner}",
                  f"Check provisioner {provisioner}")
        print(f"\n{name}: VM reads {status(cluster, name)}\nevidence: {d['evidence']}\nnext step: {d['nextStep']}")
        failed = wait_for("kube-scheduler's FailedScheduling", lambda: _failed_scheduling(cluster, name), timeout=180)
        print(f"{name}: kube-scheduler wrote {failed['message']!r}")
        assert failed["message"] == ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
                                     "preemption: 0/1 nodes are available: 1 Preemption is not helpful for "
                                     "scheduling."), failed
        reported = time.monotonic()

        # the fix: an operator makes the volume by hand, in the claim's class; the PV controller binds the claim
        folder = realnode.host_path(real_node.workdir, f"{realnode.DISKS}/{name}")
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)   # the non-root launcher (qemu, 107) makes disk.img here
        cluster.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NAMESPACE}-{name}"},
                        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                                 "storageClassName": klass, "persistentVolumeReclaimPolicy": "Retain",
                                 "volumeMode": "Filesystem",
                                 "hostPath": {"path": f"{realnode.DISKS}/{name}", "type": "Directory"}}})
        wait_status(real_node, name, "Running")
        report.resolved(name)
        wait_for(f"guest {name}'s first boot counted", lambda: boots(real_node, name) == 1)
        print(f"{name}: reported {reported - started:.0f}s, resolved {time.monotonic() - started:.0f}s after "
              f"creation")
    finally:
        remove(real_node, [name])
        cluster.delete("storage.k8s.io/v1", "StorageClass", None, klass)


def _failed_scheduling(cluster, name: str) -> dict | None:
    try:
        return scheduler_event(cluster, name)
    except AssertionError:
        return None

"""VMs whose guest is the node's own (controlplane/images.py `guest`: Debian's cloud kernel and a busybox initramfs,
booted by KubeVirt's kernelBoot from a container image), and what the tests read of them."""
from __future__ import annotations

import time

from controlplane import images

NAMESPACE = "default"


def guest_image() -> str:
    return images.guest().name


def guest_vm(name: str, run_strategy: str = "Manual", memory: str = "128Mi", kernel_args: str = "",
             annotations: dict | None = None, image: str | None = None, namespace: str = NAMESPACE,
             volumes: list | None = None, disks: list | None = None, resources: dict | None = None,
             tolerations: list | None = None, host_devices: list | None = None) -> dict:
    """A VirtualMachine booting the node's guest under TCG (the cluster's useEmulation), with a serial console and no
    network (the guest needs none). kernel_args: e.g. `vmevents.poweroff=20` (controlplane/guest/rc)."""
    domain: dict = {
        "cpu": {"cores": 1},
        "resources": resources or {"requests": {"memory": memory}},
        "firmware": {"kernelBoot": {
            "kernelArgs": f"console=ttyS0 quiet {kernel_args}".strip(),
            "container": {"image": image or guest_image(), "kernelPath": "/boot/vmlinuz",
                          "initrdPath": "/boot/initramfs", "imagePullPolicy": "IfNotPresent"}}},
        "devices": {"autoattachPodInterface": False, "disks": disks or []},
    }
    if host_devices:
        domain["devices"]["hostDevices"] = host_devices
    spec: dict = {"domain": domain, "terminationGracePeriodSeconds": 0, "volumes": volumes or []}
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"runStrategy": run_strategy,
                     "template": {"metadata": {"labels": {"vmevents.io/guest": name}}, "spec": spec}}}


def wait_for(what: str, check, timeout: float = 300.0, explain=lambda: ""):
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}. {explain()}")


def vmi_phase(cluster, name: str, namespace: str = NAMESPACE) -> str | None:
    vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", namespace, name)
    return (vmi or {}).get("status", {}).get("phase")


def describe_pods(cluster, name: str, namespace: str = NAMESPACE) -> str:
    """The launcher pods of VMI `name`, each with its phase and every container's state, for a failure's message."""
    from controlplane.kubevirt_node import pod_summary

    return "; ".join(pod_summary(p) for p in launcher_pods(cluster, name, namespace)) or "no launcher pod"


CONSOLE_LOG_WAIT = 20   # virt-tail's wait for the serial console's socket (v1.3.0 cmd/virt-tail/main.go)


def launcher_end(real_node, name: str, namespace: str = NAMESPACE) -> str | None:
    """How the launcher pod of VMI `name` ended after its guest powered off, in one of the three ways KubeVirt 1.3
    ends it (docs/facts.md §9), or None while it is still on its way:

    - `completed`: every container ended with 0, the pod is Succeeded (`0/3 Completed`);
    - `console-log-gave-up`: the pod is Failed because `guest-console-log` (virt-tail) alone exited 1, about 20 s
      after it started, before the guest's serial console existed (virt-handler handed the domain over later than
      virt-tail waits); every other container ended with 0. kubectl shows it `0/3 Completed` too;
    - `monitor-missed-exit`: `compute` still runs because virt-launcher-monitor, its first process, reaped another
      child instead of virt-launcher, which stays a zombie (one wait per SIGCHLD; kubevirt PR #15676). kubectl shows
      `2/3 NotReady` until the pod is deleted.
    Each is checked on its evidence: the container statuses, and for the last the node's own process table."""
    from controlplane import node as realnode

    pods = launcher_pods(real_node.cluster, name, namespace)
    if len(pods) != 1:
        return None
    pod = pods[0]
    statuses = {s["name"]: s for s in pod["status"].get("containerStatuses") or []}
    ended = {n: (s.get("state") or {}).get("terminated") for n, s in statuses.items()}
    phase = pod["status"].get("phase")
    if phase == "Succeeded" and all(t and t["exitCode"] == 0 for t in ended.values()):
        return "completed"
    if phase == "Failed" and all(ended.values()):
        failed = {n: t for n, t in ended.items() if t["exitCode"] != 0}
        console = failed.get("guest-console-log")
        if set(failed) == {"guest-console-log"} and console["exitCode"] == 1 and \
                _seconds(console["startedAt"], console["finishedAt"]) >= CONSOLE_LOG_WAIT - 1:
            return "console-log-gave-up"
        return f"failed otherwise: {failed}"
    if phase == "Running" and (statuses.get("compute") or {}).get("state", {}).get("running"):
        uid = pod["metadata"]["labels"].get("kubevirt.io/created-by", "")
        children = realnode.launcher_children(int(real_node.state["node_init_pid"]), uid) or []
        if ("virt-launcher", "Z") in children:
            return "monitor-missed-exit"
    return None


def _seconds(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end.replace("Z", "+00:00")) -
            datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def launcher_pods(cluster, name: str, namespace: str = NAMESPACE) -> list[dict]:
    return cluster.list("v1", "Pod", namespace, label_selector=f"kubevirt.io=virt-launcher,vm.kubevirt.io/name={name}")


def boot_disk(real_node, name: str, size: str = "64Mi", namespace: str = NAMESPACE) -> tuple[dict, dict]:
    """A PersistentVolume on the node (hostPath under controlplane/node.py DISKS) and its PVC, bound to each other as an
    operator binds a pre-made volume; KubeVirt makes the disk.img in it at the VM's first start. The guest counts its
    boots in its first 16 bytes (controlplane/guest/rc): `boots()` reads them."""
    import os

    from controlplane import node as realnode

    folder = realnode.host_path(real_node.workdir, f"{realnode.DISKS}/{name}")
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o777)   # the non-root launcher (qemu, 107) makes disk.img here
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-{name}"},
          "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                   "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem",
                   "hostPath": {"path": f"{realnode.DISKS}/{name}", "type": "Directory"},
                   "claimRef": {"namespace": namespace, "name": name}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv["metadata"]["name"],
                    "volumeMode": "Filesystem", "resources": {"requests": {"storage": size}}}}
    return real_node.cluster.create(pv), real_node.cluster.create(pvc)


def boots(real_node, name: str) -> int:
    """The guest's boot count, as it wrote it on its disk (0 if it never booted)."""
    from controlplane import node as realnode

    image = realnode.host_path(real_node.workdir, f"{realnode.DISKS}/{name}/disk.img")
    if not image.exists():
        return 0
    with open(image, "rb") as disk:
        digits = disk.read(16).decode(errors="replace").strip()
    return int(digits) if digits.isdigit() else 0


def with_boot_disk(vm: dict, claim: str) -> dict:
    spec = vm["spec"]["template"]["spec"]
    spec["domain"]["devices"]["disks"].append({"name": "boots", "disk": {"bus": "virtio"}})
    spec["volumes"].append({"name": "boots", "persistentVolumeClaim": {"claimName": claim}})
    return vm


def remove(real_node, names, namespace: str = NAMESPACE) -> None:
    """Delete these VMs, their disks' PVCs and PVs and the disks themselves, waiting until their VMIs and launcher pods
    are gone (a test's own leftovers, or an earlier run's on a reused cluster)."""
    import shutil

    from controlplane import node as realnode

    cluster = real_node.cluster
    for name in names:
        cluster.delete("kubevirt.io/v1", "VirtualMachine", namespace, name)
        cluster.delete("kubevirt.io/v1", "VirtualMachineInstance", namespace, name)
    for name in names:
        wait_for(f"{name}'s VMI and launcher pods gone", lambda n=name: not launcher_pods(cluster, n, namespace)
                 and cluster.get("kubevirt.io/v1", "VirtualMachineInstance", namespace, n) is None, timeout=180)
        cluster.delete("v1", "PersistentVolumeClaim", namespace, name)
        cluster.delete("v1", "PersistentVolume", None, f"{namespace}-{name}")
    for name in names:
        wait_for(f"{name}'s PV gone", lambda n=name: cluster.get("v1", "PersistentVolume", None, f"{namespace}-{n}")
                 is None, timeout=120)
        shutil.rmtree(realnode.host_path(real_node.workdir, f"{realnode.DISKS}/{name}"), ignore_errors=True)

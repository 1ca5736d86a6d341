"""Stands in for what a Harvester node writes: its kubelet (the Node object, launcher pods' phases, image pulls,
volume attaches, removing deleted pods) and virt-handler (the guest started, shut down, powered off or crashed). It
decides what each of them reports for a VMI's launcher pods, and nothing runs on a node whose Node is not Ready.

With KubeVirt's real virt-controller (`node_only`), `NodeAgent._sync_node` is all `KubeVirtSim` does besides
migrations and IO faults (simcluster/kubevirt/migration.py, io_faults.py).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime

from simcluster.kubevirt.client import http_status
from simcluster.kubevirt.migration import migrating
from simcluster.kubevirt.objects import (
    CREATED_BY_LABEL,
    FINAL_PHASES,
    FINAL_POD_PHASES,
    VMIS,
    Key,
    as_pod,
    condition_is,
    drop_condition,
    is_deleting,
    meta_of,
    owner_name,
    rfc3339,
    set_condition,
    status_of,
    vmi_phase,
    with_phase,
)

DEFAULT_NODES: Mapping[str, Mapping[str, int]] = {"harvester-node-0": {}}
# virt-handler's permanent device plugins advertise 1000 of each (cmd/virt-handler/virt-handler.go maxDevices,
# pkg/virt-handler/device-manager/device_controller.go PermanentHostDevicePlugins); launcher pods request them.
PERMANENT_DEVICES = {"devices.kubevirt.io/kvm": 1000, "devices.kubevirt.io/tun": 1000,
                     "devices.kubevirt.io/vhost-net": 1000}


def unpullable(image: str) -> bool:
    """An image the simulated kubelet cannot pull: its registry host is under `.invalid`, a top-level domain that
    never resolves (RFC 2606); the stand-in for an unreachable registry or a wrong image name."""
    host = image.split("/", 1)[0] if "/" in image else ""
    return host.split(":", 1)[0].endswith(".invalid")


def pull_error(image: str) -> str:
    """The error the kubelet reports for an image whose registry does not resolve: containerd's, as the waiting
    container's message (pkg/kubelet/images/image_manager.go evalCRIPullErr keeps the runtime's error), without
    gRPC's "rpc error: code = Unknown desc = ", which the kubelet's CRI client strips (k8s.io/cri-client v0.33.13
    pkg/remote_image.go PullImage; measured on the real node, docs/facts.md §9)."""
    host, _, rest = image.partition("/")
    repository, _, tag = rest.rpartition(":")
    return (f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": failed to do request: '
            f'Head "https://{host}/v2/{repository}/manifests/{tag}": dial tcp: lookup {host}: no such host')


def blocked_on_pull(spec: Mapping, now: str) -> tuple[dict, str, str] | None:
    """What the kubelet reports for a bound pod with an image it cannot pull, and that container and image: it runs
    the init containers one at a time, in order (pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions),
    so those before the first unpullable one ended (Completed), that one waits ErrImagePull, and every container
    after it waits PodInitializing; a main container's image is pulled only once every init container is done
    (docs/facts.md §7). None when every image can be pulled."""
    inits, containers = list(spec.get("initContainers") or []), list(spec.get("containers") or [])
    at = next((i for i, c in enumerate(inits + containers) if unpullable(str(c.get("image") or ""))), None)
    if at is None:
        return None
    bad = (inits + containers)[at]
    waiting = {"reason": "ErrImagePull", "message": pull_error(str(bad["image"]))}

    def state(index: int) -> dict:
        if index < at:
            return {"terminated": {"exitCode": 0, "reason": "Completed"}} if index < len(inits) else \
                {"waiting": {"reason": "ContainerCreating"}}
        return {"waiting": waiting} if index == at else {"waiting": {"reason": "PodInitializing"}}

    def statuses(group: list[dict], offset: int) -> list[dict]:
        return [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
                 "state": state(offset + i)} for i, c in enumerate(group)]

    status = {"phase": "Pending",
              "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                              "lastTransitionTime": now}],
              "initContainerStatuses": statuses(inits, 0), "containerStatuses": statuses(containers, len(inits))}
    if not inits:
        status.pop("initContainerStatuses")
    path = f"spec.{'initContainers' if at < len(inits) else 'containers'}{{{bad['name']}}}"
    return status, path, str(bad["image"])


class NodeAgent:
    """The kubelet's and virt-handler's I/O, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py)."""

    # -- guest actions (what virt-handler reports when the guest does something)
    def guest_power_off(self, namespace: str, vmi_name: str) -> None:
        """The guest ran `poweroff`: VMI Succeeded, launcher pod Succeeded (Completed), devices freed."""
        self._call(lambda: self._guest_exit(namespace, vmi_name, "Succeeded"))

    def guest_crash(self, namespace: str, vmi_name: str) -> None:
        """The guest crashed (or qemu died): VMI Failed, launcher pod Failed."""
        self._call(lambda: self._guest_exit(namespace, vmi_name, "Failed"))

    def set_phase_time(self, namespace: str, vmi_name: str, phase: str, when: datetime) -> None:
        """Rewrite (or add) the phaseTransitionTimestamp of `phase`, e.g. to age a Succeeded VMI."""
        self._call(lambda: self._rewrite_phase_time(namespace, vmi_name, phase, when))

    # -- the node stand-in (node_only: KubeVirt's virt-controller does the rest)
    def register_nodes(self) -> None:
        """The Node objects, as each node's kubelet registers it (virt-controller's migration controller
        looks the VMI's node up): allocatable devices, Ready, and virt-handler's schedulable label (every launcher
        pod's nodeSelector names it, pkg/virt-controller/services/template.go). kube-apiserver's
        TaintNodesByCondition puts `node.kubernetes.io/not-ready` on a new Node; the node lifecycle controller
        (not run here) lifts it from a Ready one: the stand-in does."""
        for name, devices in self.nodes.items():
            now = rfc3339(self.clock())
            resources = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "500Gi", "pods": "250",
                         **{k: str(v) for k, v in devices.items()}}
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                          "kubevirt.io/schedulable": "true"}},
                    "status": {"capacity": resources, "allocatable": resources, "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                         "lastTransitionTime": now}]}}
            try:
                self._kube.core.create_node(body)
            except Exception as exc:  # noqa: BLE001
                if http_status(exc) != 409:  # registered by an earlier world: its devices may differ
                    raise
            self._kube.core.patch_node_status(name, {"status": body["status"]})
            self._kube.core.patch_node(name, {"metadata": {"labels": body["metadata"]["labels"]},
                                              "spec": {"taints": None, "unschedulable": None}})

    def _sync_node(self, key: Key, vmi: dict | None) -> float | None:
        """One step of scheduler, kubelet and virt-handler for the VMI of `key` and its launcher pods. Nothing
        runs on a node whose Node object is not Ready: its kubelet and virt-handler are down."""
        ns, name = key
        phase = vmi_phase(vmi) if vmi is not None else ""
        if vmi is not None and is_deleting(vmi) and phase in ("Scheduled", "Running") and not self._node_down(vmi):
            # virt-handler shuts the guest of a deleted VMI down gracefully (the VMI controller deletes the pod).
            now = self.clock()
            self._patch_vmi_status(vmi, with_phase(vmi, "Succeeded", now))
            return 0.0
        uid = meta_of(vmi).get("uid") if vmi is not None else None
        down = self._nodes_down()
        for pod in self._kube.pods(ns):
            if owner_name(pod, "VirtualMachineInstance") != name:
                continue
            pod_meta, pod_phase = meta_of(pod), status_of(pod).get("phase")
            if (pod.get("spec") or {}).get("nodeName") in down:
                continue  # its kubelet does not report
            if is_deleting(pod):
                # kubelet: the containers are stopped and the pod object removed.
                self._kube.delete_pod(ns, pod_meta["name"], pod_meta.get("uid"))
            elif pod_phase in FINAL_POD_PHASES:
                continue
            elif vmi is None or pod_meta.get("labels", {}).get(CREATED_BY_LABEL) != uid:
                continue  # the garbage collector deletes the pods of a VMI that is gone
            elif phase in FINAL_PHASES:
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")  # launcher exits
            elif self._failed_target(vmi, pod):
                self._finish_pod(pod, "Succeeded")  # the target launcher of an aborted migration exits
            elif not (pod.get("spec") or {}).get("nodeName"):
                self._schedule_pod(pod, vmi)
            elif pod_phase == "Pending":
                self._run_pod(pod, vmi)
        if vmi is None or is_deleting(vmi) or self._node_down(vmi):
            return None
        if phase == "Running":
            wait = self._step_wait(key)
            if wait > 0 and migrating(vmi):
                return wait
            if self._migration_step(key, vmi):
                self._last_step[key] = time.monotonic()
                return self.step_delay
            if self._failed_target_pending(vmi):
                return max(self.step_delay, 0.5)
        if phase == "Scheduled":
            wait = self._step_wait(key)
            if wait > 0:
                return wait
            # virt-handler: the domain started (the VMI controller derives Ready from the pod's). It reports the
            # launcher's SELinux context, "none" on a node without SELinux; the migration controller needs it
            # for the target pod (migration.go setTargetPodSELinuxLevel).
            self._patch_vmi_status(vmi, {**with_phase(vmi, "Running", self.clock()), "selinuxContext": "none"})
            self._last_step[key] = time.monotonic()
        return None

    def _nodes_down(self) -> set[str]:
        return {meta_of(n)["name"] for n in self._kube.nodes() if not condition_is(n, "Ready", "True")}

    def _run_pod(self, pod: dict, vmi: Mapping) -> None:
        """kubelet: every container of a bound launcher pod runs and is ready; the pod is Running. Unless an image
        cannot be pulled (the container waits ErrImagePull; the VMI controller copies the reason to the VMI's
        Synchronized condition, pkg/virt-controller/watch/vmi.go checkForContainerImageError) or, with `volumes`,
        a faulted Longhorn volume fails the attach (the attach/detach controller's FailedAttachVolume)."""
        meta, now = meta_of(pod), rfc3339(self.clock())
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or []
        blocked = blocked_on_pull(spec, now)
        faulted = self._faulted_volume(vmi) if self.volumes and blocked is None else None
        if blocked is not None or faulted is not None:
            if (pod.get("status") or {}).get("containerStatuses"):
                return  # already reported: the kubelet's back-off retries change nothing here
            if blocked is not None:
                status, path, image = blocked
                self._pull_failed(pod, image, path)
                self._kube.patch_pod(meta["namespace"], meta["name"], {"status": status}, status=True)
                return
            message = (f'AttachVolume.Attach failed for volume "{faulted}" : rpc error: code = Aborted desc = '
                       f'volume {faulted} is not ready for workloads')
            self._kube.record_counted(as_pod(pod), "Warning", "FailedAttachVolume", message,
                                      "attachdetach-controller", self.clock())
            creating = [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                         "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}} for c in containers]
            self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {
                "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                                    "lastTransitionTime": now}],
                "containerStatuses": creating}}, status=True)
            return
        self._kube.patch_pod(meta["namespace"], meta["name"], {"status": {
            "phase": "Running", "startTime": now, "hostIP": "10.0.0.1", "podIP": "10.52.0.10",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                                   "imageID": "", "state": {"running": {"startedAt": now}}} for c in containers],
        }}, status=True)

    def _pull_failed(self, pod: Mapping, image: str, path: str) -> None:
        """The kubelet's Events of a failed pull, on the container (pkg/kubelet/images/image_manager.go,
        kuberuntime_container.go startContainer): Pulling, Failed "Failed to pull image …", Failed "Error: …"."""
        now, message = self.clock(), pull_error(image)
        self._kube.record_counted(as_pod(pod), "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", now, path)
        self._kube.record_counted(as_pod(pod), "Warning", "Failed", f'Failed to pull image "{image}": {message}',
                                  "kubelet", now, path)
        self._kube.record_counted(as_pod(pod), "Warning", "Failed", "Error: ErrImagePull", "kubelet", now, path)

    def _kubelet_blocked(self, vmi: dict, pod: dict, node: str, now: datetime) -> bool:
        """The kubelet stand-in on a bound pod: an image it cannot pull (a containerDisk's, in its init container)
        leaves that container waiting ErrImagePull and those after it PodInitializing (blocked_on_pull); the VMI
        controller copies the reason and message to the VMI's Synchronized condition (vmi.go, lifecycle.go
        checkForContainerImageError) and names no node yet (it does at the hand-over). With `volumes`, a faulted
        Longhorn volume fails the attach (the attach/detach controller's FailedAttachVolume). Either keeps the VMI
        Scheduling; once it clears, the pod starts."""
        ns, pod_name = meta_of(vmi)["namespace"], meta_of(pod)["name"]
        blocked = blocked_on_pull(pod.get("spec") or {}, rfc3339(now))
        if blocked is not None:
            status, path, image = blocked
            if not condition_is(vmi, "Synchronized", "False", "ErrImagePull"):
                self._kube.patch_pod(ns, pod_name, {"status": status}, status=True)
                self._pull_failed(pod, image, path)
                self._patch_vmi_status(vmi, {"conditions": set_condition(
                    drop_condition(status_of(vmi).get("conditions"), "PodScheduled"),
                    {"type": "Synchronized", "status": "False", "reason": "ErrImagePull",
                     "message": pull_error(image)}, now)})
            return True
        faulted = self._faulted_volume(vmi) if self.volumes else None
        if faulted is not None:
            message = (f'AttachVolume.Attach failed for volume "{faulted}" : rpc error: code = Aborted desc = volume '
                       f'{faulted} is not ready for workloads')
            if status_of(pod).get("phase") != "Pending" or (pod.get("status") or {}).get("containerStatuses") is None:
                scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                             "lastTransitionTime": rfc3339(now)}
                creating = {"name": "compute", "ready": False, "restartCount": 0, "image": "virt-launcher",
                            "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}
                self._kube.patch_pod(ns, pod_name, {"status": {"phase": "Pending", "conditions": [scheduled],
                                                               "containerStatuses": [creating]}}, status=True)
                self._patch_vmi_status(vmi, {"conditions": drop_condition(status_of(vmi).get("conditions"),
                                                                          "PodScheduled")})
                self._kube.record_counted(as_pod(pod), "Warning", "FailedAttachVolume", message,
                                          "attachdetach-controller", now)
            return True
        if condition_is(vmi, "Synchronized", "False", "ErrImagePull"):
            self._patch_vmi_status(vmi, {"conditions": drop_condition(status_of(vmi).get("conditions"),
                                                                      "Synchronized")})
        return False

    def _faulted_volume(self, vmi: Mapping) -> str | None:
        ns = meta_of(vmi)["namespace"]
        for claim in self._claims(vmi):
            name = ((self._kube.pvc(ns, claim) or {}).get("spec") or {}).get("volumeName")
            csi = (((self._kube.pv(name) or {}) if name else {}).get("spec") or {}).get("csi") or {}
            if csi.get("driver") == "driver.longhorn.io" and csi.get("volumeHandle"):
                volume = self._kube.longhorn_volume(csi["volumeHandle"])
                if status_of(volume).get("robustness") == "faulted":
                    return str(csi["volumeHandle"])
        return None

    def _node_down(self, vmi: Mapping) -> bool:
        """The VMI's node has a Node object that is not Ready: its virt-handler does nothing (a node the simulator
        does not know as an object is always up). A VMI not yet handed over names no node: deleted, the VMI
        controller fails it at once (its launcher pod is going down), whatever that pod's node (docs/facts.md §7)."""
        name = status_of(vmi).get("nodeName")
        node = next((n for n in self._kube.nodes() if meta_of(n).get("name") == name), None) if name else None
        return node is not None and not condition_is(node, "Ready", "True")

    def _finish_pod(self, pod: dict, phase: str) -> None:
        if status_of(pod).get("phase") == phase:
            return
        now = rfc3339(self.clock())
        reason, code = ("Completed", 0) if phase == "Succeeded" else ("Error", 1)
        self._kube.patch_pod(meta_of(pod)["namespace"], meta_of(pod)["name"], {"status": {
            "phase": phase,
            "conditions": [{"type": t, "status": "False", "reason": "PodCompleted", "lastProbeTime": None,
                            "lastTransitionTime": now} for t in ("Ready", "ContainersReady")],
            # Every container of the pod ends, not compute alone: a KubeVirt 1.3 launcher pod also runs
            # guest-console-log (and a kernel-boot or containerDisk container), and the real node ends each
            # `Completed` after a power-off (docs/facts.md §9): kubectl reads 0/3, not 0/1.
            "containerStatuses": [{"name": c.get("name", "compute"), "ready": False, "restartCount": 0,
                                   "image": c.get("image", "virt-launcher"), "imageID": "", "state": {"terminated": {
                                       "exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}}}
                                  for c in ((pod.get("spec") or {}).get("containers") or [{"name": "compute"}])],
        }}, status=True)

    # -- guest actions, run on the worker
    def _guest_exit(self, ns: str, name: str, phase: str) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None:
            raise LookupError(f"VMI {ns}/{name} does not exist; a guest can only stop in a VMI that exists.")
        if vmi_phase(vmi) != "Running":
            raise RuntimeError(f"VMI {ns}/{name} is {vmi_phase(vmi) or 'new'}, not Running; "
                               "wait for Running (kv.wait_idle()) before acting as the guest.")
        now = self.clock()
        status = with_phase(vmi, phase, now)
        status["conditions"] = set_condition(status_of(vmi).get("conditions"), {
            "type": "Ready", "status": "False", "reason": "PodTerminating"}, now)
        self._patch_vmi_status(vmi, status)
        for pod in self._kube.pods(ns, f"{CREATED_BY_LABEL}={meta_of(vmi)['uid']}"):
            self._finish_pod(pod, phase)
        self._enqueue((ns, name))
        self._resync_now.set()  # devices were freed: blocked VMIs may schedule now

    def _rewrite_phase_time(self, ns: str, name: str, phase: str, when: datetime) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None:
            raise LookupError(f"VMI {ns}/{name} does not exist.")
        stamps = [dict(s) for s in status_of(vmi).get("phaseTransitionTimestamps") or []]
        hits = [s for s in stamps if s.get("phase") == phase]
        if hits:
            hits[-1]["phaseTransitionTimestamp"] = rfc3339(when)
        else:
            stamps.append({"phase": phase, "phaseTransitionTimestamp": rfc3339(when)})
        self._patch_vmi_status(vmi, {"phaseTransitionTimestamps": stamps})
        self._enqueue((ns, name))

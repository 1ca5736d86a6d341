"""Stands in for virt-controller's VMI controller (pkg/virt-controller/watch/vmi.go) and the virt-launcher pod it
renders (pkg/virt-controller/services/template.go): it decides when a VMI gets its launcher pod, when it waits for a
PVC or a NetworkAttachmentDefinition, how it walks Pending → Scheduling → Scheduled → Running, when it fails, and how
a deleted VMI is torn down.

Without KubeVirt's real virt-controller (`node_only` off) `VMILifecycle._sync_vmi` also plays virt-handler's start
and shutdown of the guest, as one part of `KubeVirtSim`.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping

from simcluster.kubevirt.objects import (
    CREATED_BY_LABEL,
    FINAL_PHASES,
    KUBEVIRT_API,
    LAUNCHER_LABELS,
    VM_CONTROLLER_FINALIZER,
    VM_NAME_LABEL,
    VMI_FINALIZER,
    VMIS,
    VMS,
    Key,
    condition_is,
    drop_condition,
    finalizer_patch,
    has_finalizer,
    is_deleting,
    meta_of,
    owner_name,
    set_condition,
    status_of,
    vmi_phase,
    with_phase,
)


def device_requests(vmi_spec: Mapping) -> Counter:
    """1 unit of each host device's / GPU's deviceName per entry (FACTS §3)."""
    devices = ((vmi_spec.get("domain") or {}).get("devices") or {})
    wanted: Counter = Counter()
    for dev in list(devices.get("hostDevices") or []) + list(devices.get("gpus") or []):
        if dev.get("deviceName"):
            wanted[dev["deviceName"]] += 1
    return wanted


def launcher_pod(vmi: Mapping, version: str) -> dict:
    """The virt-launcher pod (pkg/virt-controller/services/template.go), cut down to what is observed."""
    meta, spec = meta_of(vmi), vmi.get("spec") or {}
    resources = (spec.get("domain") or {}).get("resources") or {}
    requests = {k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}
    limits = {k: v for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")}
    for name, count in device_requests(spec).items():
        requests[name] = limits[name] = str(count)
    labels = dict(meta.get("labels") or {})
    # template.go: podLabels[VirtualMachineNameLabel] = hostName (spec.hostname, else the VMI name).
    labels.update(LAUNCHER_LABELS)
    labels[CREATED_BY_LABEL] = meta["uid"]
    labels[VM_NAME_LABEL] = spec.get("hostname") or meta["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"virt-launcher-{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {"kubevirt.io/domain": meta["name"]},
            "ownerReferences": [{
                "apiVersion": KUBEVIRT_API, "kind": "VirtualMachineInstance", "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "restartPolicy": "Never",
            **_container_disks(spec, f"registry.suse.com/suse/sles/15.5/virt-launcher:{version}",
                               {"name": "compute", "image": f"registry.suse.com/suse/sles/15.5/virt-launcher:{version}",
                                "resources": {"requests": requests, "limits": limits}}),
        },
    }


def _container_disks(spec: Mapping, launcher_image: str, compute: dict) -> dict:
    """The containers of a launcher pod: with a containerDisk volume, the init container `container-disk-binary`
    (the launcher image), then one init container `volume<name>-init` per containerDisk with its image (they pull
    it before virt-launcher starts), and beside `compute` one container `volume<name>` with the image
    (pkg/virt-controller/services/template.go; pkg/container-disk/container-disk.go generateContainerFromVolume,
    toContainerName; v1.3.1 and v1.8.3). docs/facts.md §7."""
    disks = [(str(v.get("name")), str(v["containerDisk"]["image"])) for v in spec.get("volumes") or []
             if (v.get("containerDisk") or {}).get("image")]
    if not disks:
        return {"containers": [compute]}
    return {"initContainers": [{"name": "container-disk-binary", "image": launcher_image}]
            + [{"name": f"volume{name}-init", "image": image} for name, image in disks],
            "containers": [compute] + [{"name": f"volume{name}", "image": image} for name, image in disks]}


class VMILifecycle:
    """The VMI controller's I/O, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py)."""

    def _sync_vmi(self, key: Key, vmi: dict | None) -> float | None:
        """One step for the VMI of `key`; answers a delay when the next phase step is due later."""
        ns, name = key
        if vmi is None:
            # Launcher pods of a VMI that is gone (the API server may have no garbage collector).
            for pod in self._kube.pods(ns):
                if owner_name(pod, "VirtualMachineInstance") == name:
                    self._kube.delete_pod(ns, meta_of(pod)["name"], meta_of(pod).get("uid"))
            return None
        uid = meta_of(vmi)["uid"]
        pods = [p for p in self._kube.pods(ns, f"{CREATED_BY_LABEL}={uid}") if not is_deleting(p)]
        phase = vmi_phase(vmi)
        if is_deleting(vmi):
            return self._tear_down(vmi, pods)
        if phase in FINAL_PHASES:
            for pod in pods:  # the launcher exits with the guest
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")
            return None
        if phase == "Pending" and not pods and any(condition_is(vmi, "Synchronized", "False", r)
                                                   for r in ("FailedPvcNotFound", "FailedCreate")):
            return self._admit(vmi, pods)  # waiting for its PVC or NetworkAttachmentDefinition (KubeVirt retries)
        if phase in ("Pending", "Scheduling", "Scheduled", "Running") and not pods:
            # The launcher pod vanished under a live VMI: the VMI fails (virt-handler / VMI controller).
            self._patch_vmi_status(vmi, with_phase(vmi, "Failed", self.clock()))
            return None
        wait = self._step_wait(key)
        if phase == "":
            return self._admit(vmi, pods)
        if wait > 0:
            return wait
        if phase == "Pending":
            self._patch_vmi_status(vmi, with_phase(vmi, "Scheduling", self.clock()))
        elif phase == "Scheduling":
            if not self._bind(vmi, pods[0]):
                return None  # stays unschedulable; every resync tries again
        elif phase == "Scheduled":
            now = self.clock()
            conditions = set_condition(drop_condition(status_of(vmi).get("conditions"), "PodScheduled"),
                                       {"type": "Ready", "status": "True"}, now)
            self._patch_vmi_status(vmi, dict(with_phase(vmi, "Running", now), conditions=conditions))
        else:
            return None
        self._last_step[key] = time.monotonic()
        return self.step_delay if phase != "Scheduled" else None

    def _step_wait(self, key: Key) -> float:
        return max(0.0, self._last_step.get(key, 0.0) + self.step_delay - time.monotonic())

    def _admit(self, vmi: dict, pods: list[dict]) -> float:
        """A new VMI: the VMI controller adds its finalizer, creates the launcher pod, phase Pending."""
        meta = meta_of(vmi)
        if not has_finalizer(vmi, VMI_FINALIZER):
            self._kube.patch(VMIS, meta["namespace"], meta["name"],
                             finalizer_patch(vmi, list(meta.get("finalizers") or []) + [VMI_FINALIZER]))
        missing = self._missing_pvc(vmi)
        nad = self._missing_nad(vmi) if missing is None else None
        if nad is not None:
            # The launcher pod cannot be rendered without the Multus network's NetworkAttachmentDefinition
            # (v1.3.0 pkg/virt-controller/network/render.go; v1.8.3 pkg/network/multus/nad.go, lower-case from
            # v1.4.0): Synchronized=False FailedCreate, no Event, retried with the workqueue's backoff.
            word = "Failed" if self.version < (1, 4, 0) else "failed"
            why = f"failed to render launch manifest: {word} to locate network attachment definition {nad}"
            if not condition_is(vmi, "Synchronized", "False", "FailedCreate"):
                status = with_phase(vmi, "Pending", self.clock()) if vmi_phase(vmi) != "Pending" else {}
                status["conditions"] = set_condition(status_of(vmi).get("conditions"), {
                    "type": "Synchronized", "status": "False", "reason": "FailedCreate", "message": why},
                    self.clock())
                self._patch_vmi_status(vmi, status)
            return self.step_delay * 10
        if missing is not None:
            # datavolumes.go: "PVC ns/name does not exist, waiting for it to appear" (Synchronized=False)
            why = f"PVC {meta['namespace']}/{missing} does not exist, waiting for it to appear"
            if not condition_is(vmi, "Synchronized", "False", "FailedPvcNotFound"):
                status = with_phase(vmi, "Pending", self.clock()) if vmi_phase(vmi) != "Pending" else {}
                status["conditions"] = set_condition(status_of(vmi).get("conditions"), {
                    "type": "Synchronized", "status": "False", "reason": "FailedPvcNotFound", "message": why},
                    self.clock())
                self._patch_vmi_status(vmi, status)
                self._kube.record(vmi, "Normal", "FailedPvcNotFound", why, "virtualmachine-controller", self.clock())
            return self.step_delay * 10
        if any(condition_is(vmi, "Synchronized", "False", r) for r in ("FailedPvcNotFound", "FailedCreate")):
            self._patch_vmi_status(vmi, {"conditions": drop_condition(status_of(vmi).get("conditions"),
                                                                      "Synchronized")})
        if not pods:
            body = launcher_pod(vmi, self.version_string)
            body["status"] = {"phase": "Pending"}
            self._kube.create_pod(meta["namespace"], body)
        self._patch_vmi_status(vmi, with_phase(vmi, "Pending", self.clock()))
        self._last_step[(meta["namespace"], meta["name"])] = time.monotonic()
        return self.step_delay
    def _claims(self, vmi: Mapping) -> list[str]:
        return [c for v in ((vmi.get("spec") or {}).get("volumes") or [])
                if (c := (v.get("persistentVolumeClaim") or {}).get("claimName")
                    or (v.get("dataVolume") or {}).get("name"))]

    def _missing_pvc(self, vmi: Mapping) -> str | None:
        ns = meta_of(vmi)["namespace"]
        return next((c for c in self._claims(vmi) if self._kube.pvc(ns, c) is None), None)

    def _missing_nad(self, vmi: Mapping) -> str | None:
        """The first Multus network whose NetworkAttachmentDefinition does not exist, as "namespace/name" (a name
        without a namespace is the VMI's)."""
        ns = meta_of(vmi)["namespace"]
        for network in (vmi.get("spec") or {}).get("networks") or []:
            name = (network.get("multus") or {}).get("networkName")
            if name:
                nad_ns, _, nad = str(name).rpartition("/")
                if self._kube.nad(nad_ns or ns, nad) is None:
                    return f"{nad_ns or ns}/{nad}"
        return None

    def _tear_down(self, vmi: dict, pods: list[dict]) -> float | None:
        """A VMI being deleted: shut the guest down, end and delete the pod, drop the finalizer. Nothing happens
        while its node is not Ready: virt-handler there cannot shut the guest down (the stop is not honoured)."""
        meta, phase = meta_of(vmi), vmi_phase(vmi)
        if phase not in FINAL_PHASES and self._node_down(vmi):
            return None
        if phase not in FINAL_PHASES:
            # virt-handler shuts a running guest down gracefully (Succeeded); a VMI that never
            # ran fails (the VMI controller).
            final = "Succeeded" if phase in ("Scheduled", "Running") else "Failed"
            now = self.clock()
            status = with_phase(vmi, final, now)
            status["conditions"] = set_condition(status_of(vmi).get("conditions"), {
                "type": "Ready", "status": "False", "reason": "PodTerminating"}, now)
            self._patch_vmi_status(vmi, status)
            return 0.0
        if pods:
            for pod in pods:
                self._finish_pod(pod, "Succeeded" if phase == "Succeeded" else "Failed")
                self._kube.delete_pod(meta["namespace"], meta_of(pod)["name"], meta_of(pod).get("uid"))
            return 0.0
        if has_finalizer(vmi, VMI_FINALIZER):
            self._remove_finalizer(VMIS, vmi, VMI_FINALIZER)
        owner = owner_name(vmi, "VirtualMachine")
        if has_finalizer(vmi, VM_CONTROLLER_FINALIZER) and \
                (owner is None or self._kube.get(VMS, meta["namespace"], owner) is None):
            # No VM controller will ever see this VMI again (its VM is gone): the simulator frees it
            # rather than leave it stuck, which a real cluster's garbage collector would also end.
            self._remove_finalizer(VMIS, self._kube.get(VMIS, meta["namespace"], meta["name"]) or vmi,
                                   VM_CONTROLLER_FINALIZER)
        self._last_step.pop((meta["namespace"], meta["name"]), None)
        return None

    def _patch_vmi_status(self, vmi: Mapping, status: Mapping) -> None:
        # The VMI CRD has no status subresource: virt-handler writes the VMI itself.
        meta = meta_of(vmi)
        self._kube.patch(VMIS, meta["namespace"], meta["name"], {"status": dict(status)})

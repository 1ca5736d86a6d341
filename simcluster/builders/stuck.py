"""Small builders for vm-stuck-report's test objects: a VM stuck in a state KubeVirt writes (docs/facts.md §7), its
VMI and launcher (or migration target) pod, the node, PVC, StorageClass, PV, Longhorn volume and ResourceQuota
that explain it, and the Events the scheduler, the kubelet and KubeVirt record."""
from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)
LONGHORN_NS = "longhorn-system"
SCHEDULER = "default-scheduler"
KUBEVIRT_DEVICES = {"devices.kubevirt.io/kvm": "1000", "devices.kubevirt.io/tun": "1000",
                    "devices.kubevirt.io/vhost-net": "1000"}


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def vm(name: str = "vm1", namespace: str = "default", *, status: str | None = "Starting",
       run_strategy: str = "Always", devices: Sequence[str] = (), claims: Sequence[str] = (),
       annotations: Mapping[str, str] | None = None, created: datetime = LONG_AGO - timedelta(days=1),
       deleting: datetime | None = None, ready_since: datetime | None = None, cpu: str = "1",
       memory: str = "2Gi", node_selector: Mapping[str, str] | None = None, uid: str | None = None,
       image: str | None = None, datavolumes: Sequence[str] = ()) -> dict:
    """A VM; `status` is its status.printableStatus (None: no status yet)."""
    volumes: list[dict] = [{"name": f"disk-{i}", "persistentVolumeClaim": {"claimName": c}}
                           for i, c in enumerate(claims)]
    volumes += [{"name": f"dv-{i}", "dataVolume": {"name": d}} for i, d in enumerate(datavolumes)]
    if image:
        volumes.append({"name": "containerdisk", "containerDisk": {"image": image}})
    domain: dict = {"devices": {}, "resources": {"requests": {"cpu": cpu, "memory": memory}},
                    "memory": {"guest": memory}}
    if devices:
        domain["devices"]["hostDevices"] = [{"name": f"dev{i}", "deviceName": d} for i, d in enumerate(devices)]
    spec: dict = {"domain": domain, "volumes": volumes}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    obj: dict = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                 "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                              "creationTimestamp": stamp(created)},
                 "spec": {"runStrategy": run_strategy, "template": {"metadata": {}, "spec": spec}},
                 "status": {}}
    if status is not None:
        obj["status"]["printableStatus"] = status
    if ready_since is not None:
        obj["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "VMINotExists",
                                        "lastTransitionTime": stamp(ready_since)}]
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if deleting is not None:
        obj["metadata"]["deletionTimestamp"] = stamp(deleting)
        obj["metadata"]["finalizers"] = ["kubevirt.io/virtualMachineControllerFinalize"]
    return obj


def vmi(owner: dict, *, phase: str = "Scheduling", created: datetime = LONG_AGO, node: str | None = None,
        deleting: datetime | None = None, finalizers: Sequence[str] = (), uid: str | None = None,
        unschedulable: str | None = None, migration_start: datetime | None = None) -> dict:
    """The VMI of VM `owner` (same name, same template spec)."""
    meta = owner["metadata"]
    obj: dict = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": uid or str(uuid.uuid4()),
                              "creationTimestamp": stamp(created),
                              "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                                   "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                   "blockOwnerDeletion": True}]},
                 "spec": dict(owner["spec"]["template"]["spec"]),
                 "status": {"phase": phase}}
    if finalizers:
        obj["metadata"]["finalizers"] = list(finalizers)
    if node:
        obj["status"]["nodeName"] = node
    if deleting is not None:
        obj["metadata"]["deletionTimestamp"] = stamp(deleting)
    if unschedulable:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": unschedulable}]
    if migration_start is not None:
        obj["status"]["migrationState"] = {"startTimestamp": stamp(migration_start), "targetNode": "node-b"}
    return obj


def pod(of: dict, *, name: str | None = None, node: str | None = None, scheduled: tuple[str, str, str] | None = None,
        waiting: tuple[str, str] | None = None, labels: Mapping[str, str] | None = None, cpu: str = "1",
        memory: str = "2200Mi", phase: str = "Pending", created: datetime = LONG_AGO) -> dict:
    """A virt-launcher pod of VMI `of`; `scheduled` is its PodScheduled (status, reason, message), `waiting` the
    compute container's waiting (reason, message)."""
    meta = of["metadata"]
    obj: dict = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name or f"virt-launcher-{meta['name']}-abcde", "namespace": meta["namespace"],
                              "uid": str(uuid.uuid4()), "creationTimestamp": stamp(created),
                              "labels": dict(labels) if labels is not None else {
                                  "kubevirt.io": "virt-launcher", "kubevirt.io/created-by": meta["uid"]}},
                 "spec": {"containers": [{"name": "compute", "image": "virt-launcher",
                                          "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
                 "status": {"phase": phase}}
    if node:
        obj["spec"]["nodeName"] = node
    if scheduled:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1],
                                        "message": scheduled[2]}]
    if waiting:
        obj["status"]["containerStatuses"] = [{"name": "compute", "ready": False, "restartCount": 0,
                                               "image": "virt-launcher", "imageID": "",
                                               "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}}}]
    return obj


def target_pod(vmim: dict, source: dict, **kw) -> dict:
    """The migration target pod of VMIM `vmim` for VMI `source`."""
    labels = {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": source["metadata"]["uid"],
              "kubevirt.io/migrationJobUID": vmim["metadata"]["uid"]}
    return pod(source, name=f"virt-launcher-{source['metadata']['name']}-target", labels=labels, **kw)


def event(on: dict, reason: str, message: str, *, component: str = SCHEDULER, kind: str = "Warning",
          count: int = 1, when: datetime = LONG_AGO + timedelta(minutes=1)) -> dict:
    meta = on["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": on.get("apiVersion", "v1"), "kind": on["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": kind, "source": {"component": component},
            "count": count, "firstTimestamp": stamp(when), "lastTimestamp": stamp(when)}


def node(name: str = "node-a", *, ready: str = "True", reason: str = "KubeletReady", unschedulable: bool = False,
         taints: Sequence[Mapping[str, str]] = (), allocatable: Mapping[str, str] | None = None,
         labels: Mapping[str, str] | None = None, since: datetime = LONG_AGO) -> dict:
    # A KubeVirt node: virt-handler labels it schedulable (every launcher pod's nodeSelector names the label), its
    # permanent device plugins advertise kvm, tun and vhost-net, and the kubelet ephemeral storage (every launcher
    # pod requests one of each and 50M of it).
    resources = {"ephemeral-storage": "100Gi", **KUBEVIRT_DEVICES,
                 **(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"})}
    obj: dict = {"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                       "kubevirt.io/schedulable": "true", **(labels or {})}},
                 "spec": {},
                 "status": {"allocatable": dict(resources),
                            "capacity": dict(resources),
                            "conditions": [{"type": "Ready", "status": ready, "reason": reason,
                                            "lastHeartbeatTime": stamp(since), "lastTransitionTime": stamp(since)}]}}
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    if taints:
        obj["spec"]["taints"] = [dict(t) for t in taints]
    return obj


def pvc(claim: str, namespace: str = "default", *, phase: str = "Pending", storage_class: str | None = "longhorn",
        volume: str | None = None) -> dict:
    spec: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    if volume:
        spec["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
            "spec": spec, "status": {"phase": phase}}


def storage_class(name: str = "longhorn", provisioner: str = "driver.longhorn.io",
                  binding: str = "Immediate") -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": binding, "reclaimPolicy": "Delete"}


def pv(name: str, handle: str, claim: str, namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"],
                     "csi": {"driver": "driver.longhorn.io", "volumeHandle": handle},
                     "claimRef": {"namespace": namespace, "name": claim}},
            "status": {"phase": "Bound"}}


def longhorn_volume(name: str, *, state: str = "detached", robustness: str = "faulted") -> dict:
    return {"apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "metadata": {"name": name, "namespace": LONGHORN_NS},
            "spec": {"numberOfReplicas": 3, "size": str(10 * 2**30)},
            "status": {"state": state, "robustness": robustness}}


def mebibytes(text: str) -> int:
    """A memory quantity as whole MiB, rounded up ('2262Mi', '2Gi', '2372927488')."""
    import math
    import re
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text).strip())
    if not match:
        raise ValueError(f"not a memory quantity: {text!r}")
    scale = {"": 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
             "Ti": 2 ** 40}[match.group(2)]
    return math.ceil(float(match.group(1)) * scale / 2 ** 20)


def quota(name: str = "compute", namespace: str = "default", *, hard: Mapping[str, str],
          used: Mapping[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": dict(hard)},
            "status": {"hard": dict(hard), "used": dict(used or {k: "0" for k in hard})}}


def vmim(source: dict, name: str = "mig1", *, phase: str | None = "Pending", created: datetime = LONG_AGO,
         rejected_by_quota: bool = False) -> dict:
    meta = source["metadata"]
    obj: dict = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
                 "metadata": {"name": name, "namespace": meta["namespace"], "uid": str(uuid.uuid4()),
                              "creationTimestamp": stamp(created)},
                 "spec": {"vmiName": meta["name"]}, "status": {}}
    if phase:
        obj["status"]["phase"] = phase
    if rejected_by_quota:  # migration.go: the target pod's creation hit "exceeded quota"
        obj["status"]["conditions"] = [{"type": "migrationRejectedByResourceQuota", "status": "True"}]
    return obj


def insufficient(resource: str, nodes: int = 3, short: int | None = None) -> str:
    """kube-scheduler's FitError message."""
    short = nodes if short is None else short
    rest = f", {nodes - short} node(s) didn't match Pod's node affinity/selector" if nodes > short else ""
    return f"0/{nodes} nodes are available: {short} Insufficient {resource}{rest}. preemption: 0/{nodes} nodes " \
           f"are available: {nodes} No preemption victims found for incoming pod."


# -- what the kubelet and the scheduler write about a launcher pod (docs/facts.md §7) -------------------
LAUNCHER_IMAGE = "registry.suse.com/suse/sles/15.5/virt-launcher:1.3.1"


def micro(when: datetime) -> str:
    """metav1.MicroTime, as an events.k8s.io Event's eventTime and series.lastObservedTime are written."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def launcher(of: dict, *, node: str = "node-a", pull: tuple[str, str] | None = None,
             created: datetime = LONG_AGO) -> dict:
    """The virt-launcher pod KubeVirt renders for VMI `of` (pkg/virt-controller/services/template.go), cut to what
    vm-stuck-report reads: `container-disk-binary`, then for each containerDisk volume an init container
    `volume<name>-init` that pulls its image before virt-launcher starts; `compute` and a `volume<name>` container
    per disk. Bound to `node`. `pull` (reason, message): the kubelet cannot pull the first disk's image, so that init
    container waits on it and every container after it waits PodInitializing (the kubelet starts init containers one
    at a time, in order: pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions)."""
    disks = [(v["name"], v["containerDisk"]["image"]) for v in of["spec"].get("volumes") or []
             if v.get("containerDisk")]
    obj = pod(of, node=node, created=created)
    obj["spec"]["initContainers"] = [{"name": "container-disk-binary", "image": LAUNCHER_IMAGE}] + [
        {"name": f"volume{name}-init", "image": image} for name, image in disks]
    obj["spec"]["containers"] = [dict(obj["spec"]["containers"][0], image=LAUNCHER_IMAGE)] + [
        {"name": f"volume{name}", "image": image} for name, image in disks]
    if pull is None:
        return obj
    blocked = f"volume{disks[0][0]}-init"

    def status(container: dict, state: dict) -> dict:
        return {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                "restartCount": 0, "state": state}

    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    waits = {"waiting": {"reason": pull[0], "message": pull[1]}}
    initializing = {"waiting": {"reason": "PodInitializing"}}
    inits = obj["spec"]["initContainers"]
    at = next(i for i, c in enumerate(inits) if c["name"] == blocked)
    obj["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"},
                       {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                        "message": f"containers with incomplete status: [{blocked}]"}],
        "initContainerStatuses": [status(c, done if i < at else waits if i == at else initializing)
                                  for i, c in enumerate(inits)],
        "containerStatuses": [status(c, initializing) for c in obj["spec"]["containers"]]}
    return obj




def kubelet_event(on_pod: dict, container: str, reason: str, message: str, *, init: bool = True, count: int = 1,
                  kind: str = "Warning", when: datetime = LONG_AGO + timedelta(minutes=1)) -> dict:
    """An Event of the kubelet's about a container of the pod: the core/v1 recorder (tools/record), which counts
    repeats in `count` (pkg/kubelet/images/image_manager.go: Pulling, Failed "Failed to pull image …", BackOff
    "Back-off pulling image …")."""
    obj = event(on_pod, reason, message, component="kubelet", kind=kind, count=count, when=when)
    obj["involvedObject"]["fieldPath"] = f"spec.{'initContainers' if init else 'containers'}{{{container}}}"
    obj["source"]["host"] = (on_pod.get("spec") or {}).get("nodeName") or "node-a"
    return obj


def scheduler_event(on_pod: dict, message: str, *, repeats: int, first: datetime = LONG_AGO,
                    last: datetime = LONG_AGO + timedelta(minutes=5)) -> dict:
    """kube-scheduler's FailedScheduling, as its events.k8s.io recorder writes it (client-go tools/events) and a
    core/v1 read shows it: `eventTime` once, repeats in `series` {count, lastObservedTime}, no `count`,
    `lastTimestamp` or `source` (pkg/apis/events/v1/conversion.go)."""
    meta = on_pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": "FailedScheduling", "message": message, "type": "Warning", "action": "Scheduling",
            "reportingComponent": SCHEDULER, "reportingInstance": f"{SCHEDULER}-control-plane",
            "eventTime": micro(first), "series": {"count": repeats, "lastObservedTime": micro(last)}}


IMAGE_URL = "http://images.example.invalid/fedora.qcow2"


def datavolume(name: str, namespace: str = "default", *, url: str = IMAGE_URL) -> dict:
    """A CDI DataVolume importing from `url` (containerized-data-importer-api v1beta1 types.go)."""
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": "10Gi"}}}}}


def import_failing(url: str = IMAGE_URL, restarts: int = 4) -> dict:
    """A DataVolume's status while its importer keeps failing: CDI keeps the phase ImportInProgress and sets the
    Running condition False with the importer's reason and message, counting the restarts
    (pkg/controller/datavolume/conditions.go updateRunningCondition; the message is the importer's)."""
    return {"phase": "ImportInProgress", "progress": "N/A", "restartCount": restarts, "conditions": [
        {"type": "Bound", "status": "True", "reason": "Bound", "message": "PVC is bound"},
        {"type": "Ready", "status": "False", "reason": "TransferRunning", "message": ""},
        {"type": "Running", "status": "False", "reason": "Error",
         "message": f"Unable to connect to http data source: Get \"{url}\": dial tcp: lookup "
                    f"{url.split('/')[2]}: no such host"}]}

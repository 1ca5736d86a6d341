"""The next step every report of vm-stuck-report gives (a finding's `advice`): what to do, naming a command to run as
printed, with the VM's namespace and the objects' real names, never a placeholder. decide says which step as a `Say`
(causes.py); each kind is worded here. The rest of what people read is wording.py's."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from functions.vm_stuck_report.causes import Verdict


def _create_claim(namespace: str, vm: str, volume: str, claim: str) -> str:
    return (f"Create PVC {claim} in namespace {namespace} (or restore it), or point volume {volume} at a PVC that "
            f"exists (`kubectl -n {namespace} edit vm {vm}`); KubeVirt starts the VM once it appears.")


def _raise_quota(namespace: str, quota: str, migrating: bool) -> str:
    pod, what = ("target", "migrate") if migrating else ("launcher", "start")
    which = (f"Raise ResourceQuota {quota} (`kubectl -n {namespace} edit resourcequota {quota}`)" if quota else
             f"Raise the ResourceQuota that has no room (`kubectl -n {namespace} describe resourcequota` lists them)")
    return (f"{which} or free room in namespace {namespace}: the {pod} pod must fit beside the pods already counted"
            + (" (a migration briefly needs the VM's resources twice)" if migrating else "")
            + f", then KubeVirt retries and the VM can {what}.")


def _set_limits(namespace: str, vm: str, quota: str, unspecified: str) -> str:
    return (f"ResourceQuota {quota} admits only pods that specify {unspecified}: give the VM limits "
            f"(`kubectl -n {namespace} edit vm {vm}`, spec.template.spec.domain.resources.limits), or a LimitRange "
            f"default (`kubectl -n {namespace} get limitrange`); then KubeVirt retries.")


def _uncordon(nodes: tuple[str, ...]) -> str:
    command = f"`kubectl uncordon {' '.join(nodes)}`" if nodes else "`kubectl get nodes` shows them SchedulingDisabled"
    return (f"The nodes that would fit are cordoned (maintenance or a drain): uncordon them once it is over "
            f"({command}), or add capacity; the scheduler retries by itself.")


def _free_resource(namespace: str, vm: str, resource: str, device: bool) -> str:
    what = "device" if device else resource
    return (f"No node has the {what} the VM requests free ({resource}): free it on a node (stop or move another VM; "
            f"`kubectl describe nodes` shows what each has allocated), lower the VM's request "
            f"(`kubectl -n {namespace} edit vm {vm}`), or add a node with more; the scheduler retries by itself.")


def _free_device(namespace: str, vm: str, node: str, resource: str) -> str:
    return (f"Only node {node} has {resource}: free it there (`kubectl get vmi -A -o wide` lists the VMs on {node}; "
            f"stop the one holding it), or give this VM another device type (`kubectl -n {namespace} edit vm {vm}`); "
            f"the VM can run nowhere else.")


def _look(namespace: str, vm: str, pod: str) -> str:
    pods = f", `kubectl -n {namespace} describe pod {pod}`" if pod else ""
    return (f"The cause is not among the facts checked: read `kubectl -n {namespace} describe vm {vm}`, "
            f"`kubectl -n {namespace} describe vmi {vm}`{pods}, and virt-controller's and virt-handler's logs.")


def _fix_image(namespace: str, vm: str, image: str, volume: str, node: str) -> str:
    what = (f"image {image}" if image else "the VM's image") + (f" (containerDisk volume {volume})" if volume else "")
    where = f"node {node}" if node else "its node"
    return (f"The kubelet cannot pull {what}: correct its name or tag in the VM (`kubectl -n {namespace} edit vm "
            f"{vm}`), make the registry reachable from {where}, or give the VM an imagePullSecret; the kubelet "
            f"retries by itself.")


def _raise_migration_limits(queue: Any) -> str:
    namespace, _, name = queue.kubevirt.partition("/")
    command = f"`kubectl -n {namespace} edit kubevirt {name}`" if queue.kubevirt else "`kubectl get kubevirt -A`"
    return (f"KubeVirt runs no migration while a limit is 0: raise spec.configuration.migrations."
            f"{'parallelMigrationsPerCluster' if queue.cluster_limit == 0 else 'parallelOutboundMigrationsPerNode'} "
            f"({command}); the queued migrations then start in turn.")


STEPS: dict[str, Callable[..., str]] = {
    "create-claim": _create_claim,
    "raise-quota": _raise_quota,
    "set-limits": _set_limits,
    "bind-claims": lambda namespace: (
        f"Bind the VM's PVCs: `kubectl -n {namespace} get pvc` shows which is Pending; check its StorageClass and "
        f"provisioner."),
    "relax-placement": lambda namespace, vm: (
        f"No node matches the VM's placement: relax its nodeSelector or affinity, or add a toleration for the nodes' "
        f"taints (`kubectl -n {namespace} edit vm {vm}`, spec.template.spec); or label or untaint a node that should "
        f"run it (`kubectl get nodes --show-labels`)."),
    "uncordon": _uncordon,
    "free-device": _free_device,
    "free-resource": _free_resource,
    "create-class": lambda volume: (
        f"Create StorageClass {volume.storage_class}, or recreate PVC {volume.claim} with a StorageClass that exists "
        f"(`kubectl get storageclass`)."),
    "check-provisioner": lambda namespace, volume: (
        f"Check provisioner {volume.provisioner or 'of ' + volume.storage_class} (its pods, and its Events on PVC "
        f"{volume.claim}: `kubectl -n {namespace} describe pvc {volume.claim}`): it has not provisioned a volume."),
    "give-class": lambda namespace, volume: (
        f"PVC {volume.claim} names no StorageClass and no PersistentVolume binds it (`kubectl -n {namespace} describe "
        f"pvc {volume.claim}`): recreate it with a StorageClass that exists (`kubectl get storageclass`), or create a "
        f"PersistentVolume it can bind to."),
    "salvage": lambda volume, longhorn: (
        f"Longhorn volume {volume} is faulted (no healthy replica: `kubectl -n {longhorn} get volumes.longhorn.io "
        f"{volume}`): salvage it in the Longhorn UI (Volume → Salvage) or restore it from a backup, then the attach "
        f"succeeds."),
    "longhorn-attach": lambda volume, node, longhorn: (
        f"See why Longhorn cannot attach {volume} to node {node or 'the pod’s node'}: `kubectl -n {longhorn} "
        f"describe volumes.longhorn.io {volume}`, its replicas and engine in the Longhorn UI, and longhorn-manager's "
        f"log on that node."),
    "csi-attach": lambda namespace, pod: (
        f"See why the CSI driver cannot attach or mount the volume: `kubectl -n {namespace} describe pod {pod}` and "
        f"`kubectl get volumeattachments` show its error; then the driver's node plugin log on the pod's node."),
    "fix-image": _fix_image,
    "look": _look,
    "raise-migration-limits": _raise_migration_limits,
    "check-import": lambda namespace, vm, dv, failing: (
        (f"CDI cannot import DataVolume {dv}: read why (`kubectl -n {namespace} describe datavolume {dv}`, and its "
         f"importer pod's log), then fix its source in the VM (`kubectl -n {namespace} edit vm {vm}`, "
         f"spec.dataVolumeTemplates) or the source's reachability; CDI retries by itself.") if failing else
        (f"DataVolume {dv} is still importing: follow it (`kubectl -n {namespace} get datavolume {dv} -w`); a large "
         f"image from a slow source takes long, and KubeVirt starts the VM once it is done.")),
    "read-why-it-fails": lambda namespace, vm, pod: (
        f"Every start fails before the guest runs: read why (`kubectl -n {namespace} describe vmi {vm}`"
        + (f", `kubectl -n {namespace} logs {pod} -c compute`" if pod else "") + "), fix the VM "
        f"(`kubectl -n {namespace} edit vm {vm}`); KubeVirt tries again after its back-off, at most every 5 minutes."),
}


def next_step(verdict: Verdict) -> str:
    step = verdict.step
    return STEPS[step.kind](**step.values) if step is not None else ""

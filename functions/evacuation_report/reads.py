"""evacuation-report's reads: one node's VMs and what decides their fate, read fresh and turned into facts
(facts.py) — the VMIs on the node (by KubeVirt's `kubevirt.io/nodeName` label), their VMs, their latest migrations
(the VMIMs' Table rows, then the one that matters in full), the KubeVirt CR, Harvester's version, Upgrade and
vm-force-reset-policy; for a node that is down, its launcher pods, VolumeAttachments and Longhorn volumes. Only what
the node's state can need is read."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from functions.evacuation_report.facts import (
    EVACUATION_ANNOTATION,
    ClusterFacts,
    Facts,
    NodeFacts,
    VolumeFacts,
    migration_facts,
    reset_policy,
    upgrade_facts,
    vm_facts,
)
from functions.evacuation_report.settings import Settings
from shared import kubevirt as kv
from shared import nodes
from shared import objects as o
from shared.kinds import (
    HARVESTER_SETTING,
    HARVESTER_UPGRADE,
    KUBEVIRT,
    LONGHORN_VOLUME,
    POD,
    PVC,
    VM,
    VMI,
    VMIM,
    VOLUME_ATTACHMENT,
)
from shared.kube import NotFound
from shared.runtime import KubeContext

NODE_LABEL = "kubevirt.io/nodeName"     # types.go NodeNameLabel: virt-controller sets it on the VMI (vmi.go)
CREATED_BY = "kubevirt.io/created-by"   # the launcher pod's VMI uid


def read_facts(ctx: KubeContext[Settings], node: NodeFacts, earlier: Mapping[str, Mapping[str, Any]]) -> Facts:
    """The VMIs on the node, and each VMI an open finding of it named that is not there any more (where did it
    go?); the cluster's configuration; for a node that is down, what blocks its VMs' recovery."""
    down = node.ready != "True"
    vmis = {_key(v): v for v in ctx.kube.list(VMI, None, label_selector=f"{NODE_LABEL}={node.name}", cached=True)
            if ctx.settings.in_scope(str(kv.meta(v).get("namespace") or "default"))}
    for key in sorted(set(earlier) - set(vmis)):
        namespace, _, name = key.partition("/")
        found = ctx.kube.get(VMI, namespace, name)
        vmis[key] = found if found is not None else {"metadata": {"namespace": namespace, "name": name},
                                                    "status": {"phase": ""}}
    cluster = cluster_facts(ctx, node, down)
    rows = _migration_rows(ctx, {k.partition("/")[0] for k in vmis})
    pods = _alive_pods(ctx, node.name) if down else None
    attached = _attachments(ctx, node.name) if down else {}
    vms = []
    for key in sorted(vmis):
        vmi = vmis[key]
        namespace, name = key.partition("/")[0], key.partition("/")[2]
        vm = ctx.kube.get(VM, namespace, name) if _needs_vm(vmi, cluster, down) else None
        migration = _migration(ctx, vmi, rows.get(key, []), node.name, cluster)
        alive = (str(kv.meta(vmi).get("uid")) in pods) if pods is not None else None
        volumes = _volumes(ctx, vmi, attached) if down and o.string(vmi, "status", "nodeName") == node.name else ()
        vms.append(vm_facts(vmi, vm, migration, alive, volumes))
    return Facts(node, tuple(vms), cluster, earlier)


def _needs_vm(vmi: Mapping, cluster: ClusterFacts, down: bool) -> bool:
    """The VM's run strategy matters to a VM of a dead node, and to one a drain may shut down; not to one that
    migrates on eviction (most of a Harvester cluster: LiveMigrateIfPossible and LiveMigratable=True), which is
    then not read (a VMI that left the node, or is gone, keeps its line without it too)."""
    if not kv.meta(vmi).get("uid"):
        return False
    if down:
        return True
    strategy = o.text(vmi, "spec", "evictionStrategy") or cluster.eviction_default or "None"
    migratable = any(c.get("type") == "LiveMigratable" and c.get("status") == "True" for c in kv.conditions_of(vmi))
    return not (migratable and strategy in ("LiveMigrate", "LiveMigrateIfPossible"))


def cluster_facts(ctx: KubeContext[Settings], node: NodeFacts, down: bool) -> ClusterFacts:
    kubevirt = next(iter(ctx.kube.list(KUBEVIRT)), None)
    configuration = o.mapping(kubevirt, "spec", "configuration")
    migrations = dict(o.mapping(configuration, "migrations"))
    version = _harvester_version(ctx)
    upgrades = _list(ctx, HARVESTER_UPGRADE, ctx.settings.harvester_namespace) if version is not None else []
    policy = reset_policy(_get(ctx, HARVESTER_SETTING, None, "vm-force-reset-policy"), version) \
        if down and version is not None else None
    return ClusterFacts(kv.parse_version(o.text(kubevirt, "status", "observedKubeVirtVersion")),
                        o.text(configuration, "evictionStrategy"),
                        str(migrations.get("nodeDrainTaintKey") or nodes.DRAIN_TAINT), migrations, version, policy,
                        upgrade_facts(upgrades, node.name))


def _harvester_version(ctx: KubeContext[Settings]) -> tuple[int, int, int] | None:
    """Harvester's version from its server-version Setting; None on a cluster without Harvester. A development
    build ("dev", "master-…") reads as the newest behaviour."""
    setting = _get(ctx, HARVESTER_SETTING, None, "server-version")
    if setting is None:
        return None
    text = o.text(setting, "value") or o.text(setting, "default") or ""
    return kv.parse_version(text) or (99, 0, 0)


def _migration_rows(ctx: KubeContext[Settings], namespaces: Iterable[str]) -> dict[str, list[dict]]:
    """Each VMI's VMIMs, from the Table rows (Phase and VMI cells, metadata with the evacuation annotation)."""
    out: dict[str, list[dict]] = {}
    for namespace in sorted(namespaces):
        for row in ctx.kube.list_rows(VMIM, namespace, cached=True):
            vmi = row["cells"].get("vmi")
            if vmi:
                out.setdefault(f"{namespace}/{vmi}", []).append(row)
    return out


def _migration(ctx: KubeContext[Settings], vmi: Mapping, rows: list[dict], node: str, cluster: ClusterFacts):
    """The VMI's migration that matters: one not final, else the newest evacuation of this node; read in full."""
    def created(row: dict) -> str:
        return str(row["metadata"].get("creationTimestamp") or "")

    unfinished = [r for r in rows if (r["cells"].get("phase") or "Pending") not in kv.FINAL_PHASES]
    evacuations = [r for r in rows if (r["metadata"].get("annotations") or {}).get(EVACUATION_ANNOTATION) == node]
    chosen = max(unfinished or evacuations, key=created, default=None)
    if chosen is None:
        return None
    vmim = ctx.kube.get(VMIM, str(kv.meta(vmi).get("namespace") or "default"), str(chosen["metadata"]["name"]))
    return migration_facts(vmim, vmi if kv.meta(vmi).get("uid") else None, cluster) if vmim else None


def _alive_pods(ctx: KubeContext[Settings], node: str) -> set[str]:
    """The VMI uids whose launcher pod on the node is still in the API and not final (what KubeVirt's node
    controller waits for before it fails a VMI, docs/facts.md §10)."""
    pods = ctx.kube.list(POD, None, label_selector="kubevirt.io=virt-launcher", field_selector=f"spec.nodeName={node}")
    return {str(kv.labels_of(p).get(CREATED_BY)) for p in pods
            if o.string(p, "status", "phase") not in ("Succeeded", "Failed")}


def _attachments(ctx: KubeContext[Settings], node: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for va in _list(ctx, VOLUME_ATTACHMENT, None):
        pv = o.string(va, "spec", "source", "persistentVolumeName")
        if pv and o.string(va, "spec", "nodeName") == node:
            out.setdefault(pv, []).append(node)
    return out


def _volumes(ctx: KubeContext[Settings], vmi: Mapping, attached: Mapping[str, list[str]]) -> tuple[VolumeFacts, ...]:
    namespace = str(kv.meta(vmi).get("namespace") or "default")
    out = []
    for volume in o.objects(vmi, "spec", "volumes"):
        claim = o.text(volume, "persistentVolumeClaim", "claimName") or o.text(volume, "dataVolume", "name")
        if not claim:
            continue
        pvc = ctx.kube.get(PVC, namespace, claim)
        pv = o.string(pvc, "spec", "volumeName") if pvc else ""
        lh = _get(ctx, LONGHORN_VOLUME, ctx.settings.longhorn_namespace, pv) if pv else None
        out.append(VolumeFacts(claim, pv, tuple(attached.get(pv, ())), pv if lh else "",
                               o.string(lh, "status", "state") if lh else "",
                               o.string(lh, "status", "currentNodeID") if lh else ""))
    return tuple(out)


def _get(ctx: KubeContext[Settings], kind, namespace: str | None, name: str) -> dict | None:
    try:
        return ctx.kube.get(kind, namespace, name)
    except NotFound:  # the kind itself is not served (no Harvester, no Longhorn)
        return None


def _list(ctx: KubeContext[Settings], kind, namespace: str | None) -> list[dict]:
    try:
        return list(ctx.kube.list(kind, namespace))
    except NotFound:
        return []


def _key(vmi: Mapping) -> str:
    meta = kv.meta(vmi)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"

"""device-conflict, asked about one VM (`vmevents explain`): the conflicts the VM is part of now, from the repair's
own reads (every VM and VMI: an operator's question, not the hot path) and decide. Read-only: the parameter object
is not written."""
from __future__ import annotations

from functions.device_conflict import reads, wording
from functions.device_conflict.decide import Facts, decide
from functions.device_conflict.settings import Settings
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    names, vgpus = reads.discover(ctx.kube)
    if names != reads.HARVESTER:
        return "no-conflict", "device names are per-VM aliases on this cluster (no devices.harvesterhci.io API)", []
    workloads = reads.scan(ctx.kube, vgpus, with_instancetypes=True).workloads()
    verdict = decide(Facts(f"{namespace}/{name}", tuple(workloads)), ctx.settings, ctx.clock())
    return verdict.action.value, verdict.reason, [wording.conflict_message(c) for c in verdict.conflicts]

"""vm-stuck-report, asked about one VM (`vmevents explain`): whether the VM is stuck now, and if it is past its
threshold the one cause the cluster shows, its evidence and the next step, from the handler's own reads (`look`,
`diagnosed`) and decide; read-only: no Event is written."""
from __future__ import annotations

from functions.vm_stuck_report.handler import Target, diagnosed, look
from functions.vm_stuck_report.settings import Settings
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    seen = look(Target(namespace, name), ctx)
    if seen is None:
        return "none", "no such VM", []
    found, vm, vmi, vmim, verdict = seen
    if vm is None:
        return "none", "no such VM", []
    verdict = diagnosed(verdict, ctx, vm, vmi, vmim)
    cause = f" {verdict.cause.value}" if verdict.cause else ""
    lines = [*verdict.evidence, *([f"next: {verdict.next_step}"] if verdict.next_step else [])]
    return verdict.action.value + cause, verdict.reason, lines

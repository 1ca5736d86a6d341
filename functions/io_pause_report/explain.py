"""io-pause-report, asked about one VM (`vmevents explain`): what it would decide about the VM's VMI now and why,
from the handler's own reads (`look`) and decide (`judge`), read-only: no Event is written."""
from __future__ import annotations

from functions.io_pause_report.handler import Target, judge, look
from functions.io_pause_report.settings import Settings
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    seen = look(Target(namespace, name), ctx)
    verdict, facts, nothing = judge(seen, ctx)
    if verdict is None:
        return ("none" if seen.vmi is None else "skip"), nothing, []
    lines = [f"volume {v.name} (PVC {v.pvc or '?'}): Longhorn robustness {v.robustness or 'unknown'}"
             + (f", rebuilding ({v.progress}%)" if v.rebuilding else "") for v in (facts.volumes if facts else ())]
    category = f" {verdict.category.value}" if verdict.category else ""
    return verdict.action.value + category, verdict.reason, lines

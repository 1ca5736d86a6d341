"""vmi-cleanup, asked about one VM (`vmevents explain`): what it would decide about the VM's VMI now and why, from
the handler's own reads and decide (read-only: nothing is acted on)."""
from __future__ import annotations

from functions.vmi_cleanup import wording
from functions.vmi_cleanup.decide import ACTING
from functions.vmi_cleanup.handler import Target, decide_with_facts, read_vm, read_vmi
from functions.vmi_cleanup.settings import Settings
from shared import kubevirt as kv
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    """(verdict, why, more lines) about the VMI of the VM `namespace/name` (a VM's VMI has its name)."""
    vmi = read_vmi(ctx, Target(namespace, name))
    if vmi is None:
        return "none", "no VMI: nothing to clean up", []
    verdict, _ = decide_with_facts(vmi, read_vm(ctx, vmi), ctx)
    said = verdict.action.value
    if verdict.action in ACTING and ctx.settings.dry_run:
        said = f"would-{said}"
    lines = [f"VMI phase {kv.phase(vmi) or 'unset'}" + (f", due at {verdict.due_at:%Y-%m-%dT%H:%M:%SZ}"
                                                         if verdict.due_at else "")]
    if ctx.settings.dry_run:
        lines.append(f"dry run (CLEANUP_DRY_RUN=true): it reports with {wording.DRY_RUN} Events, changes nothing")
    if verdict.warning:
        lines.append(f"a Warning Event {wording.ANNOTATION_INVALID} says: {verdict.warning}")
    return said, verdict.reason, lines

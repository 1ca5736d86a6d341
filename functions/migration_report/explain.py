"""migration-report, asked about one VM (`vmevents explain`): what it would decide about each of the VM's
migrations now and why, from the handler's own reads and decide (read-only: nothing is reported)."""
from __future__ import annotations

from functions.migration_report.decide import decide, precheck
from functions.migration_report.handler import already_reported, gather, read_vmi_and_vm
from functions.migration_report.settings import Settings
from shared import kubevirt as kv
from shared.kinds import VMIM
from shared.runtime import KubeContext

SHOWN = 3  # the newest migrations explained


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    migrations = sorted(ctx.kube.list(VMIM, namespace, label_selector=f"kubevirt.io/vmi-name={name}"),
                        key=lambda m: str(kv.meta(m).get("creationTimestamp") or ""), reverse=True)
    if not migrations:
        return "none", "no migration of this VM", []
    said = [one(ctx, vmim) for vmim in migrations[:SHOWN]]
    lines = [f"{kv.meta(vmim)['name']} ({kv.phase(vmim) or 'no phase'}): {verdict}: {why}"
             for vmim, (verdict, why) in zip(migrations, said, strict=False)]
    if len(migrations) > SHOWN:
        lines.append(f"and {len(migrations) - SHOWN} older migration(s)")
    verdict, why = said[0]
    return verdict, f"the newest, {kv.meta(migrations[0])['name']}: {why}", lines[1:] if len(said) == 1 else lines


def one(ctx: KubeContext[Settings], vmim: dict) -> tuple[str, str]:
    skip = precheck(vmim, ctx.settings, ctx.clock())
    if skip:
        return "skip", skip
    if (record := already_reported(ctx, vmim)) is not None:
        return "skip", f"already reported ({record.finding.category}, {'open' if record.open else 'resolved'})"
    vmi, vm = read_vmi_and_vm(vmim, ctx)
    verdict = decide(gather(vmim, vmi, vm, ctx), ctx.settings, ctx.clock())
    category = verdict.report.get("category")
    return verdict.action.value + (f" {category}" if category else ""), verdict.reason

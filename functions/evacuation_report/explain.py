"""evacuation-report, asked about one VM (`vmevents explain`): if the node its VMI is on is being emptied or stopped
answering, what will happen to the VM, why, when, what blocks it and the next step (its line of the node's finding),
from the handler's own reads and decide (`judge`, as `converge` asks it); read-only: no Event is written."""
from __future__ import annotations

from functions.evacuation_report.decide import Action
from functions.evacuation_report.handler import judge, records_of
from functions.evacuation_report.lines import stamp
from functions.evacuation_report.reads import NODE_LABEL
from functions.evacuation_report.settings import Settings
from shared import kubevirt as kv
from shared import objects as o
from shared.kinds import VMI
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    vmi = ctx.kube.get(VMI, namespace, name)
    node = (o.string(vmi, "status", "nodeName") or kv.labels_of(vmi).get(NODE_LABEL, "")) if vmi is not None else ""
    if not node:
        return "none", "the VM runs on no node (no VMI, or one not scheduled yet)", []
    _, verdict = judge(node, records_of(node, ctx), ctx)
    line = next((line for line in verdict.lines if line.vm == f"{namespace}/{name}"), None)
    if verdict.action is not Action.REPORT or line is None:
        return verdict.action.value, verdict.reason, []
    lines = [f"node {node}: {verdict.reason}"]
    lines += [f"when: {stamp(line.when)}"] if line.when else []
    lines += [f"blocked by: {blocker}" for blocker in line.blockers]
    lines += [f"next: {line.next_step}"] if line.next_step else []
    return f"{verdict.action.value} {line.outcome.value}", line.why, lines

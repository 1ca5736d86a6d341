"""vm-stuck-report, asked about one VM (`vmevents explain`): whether the VM is stuck now, and if it is past its
threshold the one cause the cluster shows, its evidence and the next step (or, the cause unknown, what was checked),
from the handler's own reads and decide (`judge`, as `_converge` asks it); read-only: no Event is written."""
from __future__ import annotations

from functions.vm_stuck_report import wording
from functions.vm_stuck_report.advice import next_step
from functions.vm_stuck_report.causes import Action, Cause
from functions.vm_stuck_report.handler import Target, judge
from functions.vm_stuck_report.settings import Settings
from shared.kinds import EVENT
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    events = list(ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.name={name}"))
    judged = judge(Target(namespace, name), ctx, events)
    if judged is None or judged[1].vm is None:
        return "none", "no such VM", []
    _, facts, verdict = judged
    cause = f" {verdict.cause.value}" if verdict.cause else ""
    lines = wording.evidence(verdict)
    if verdict.action is Action.REPORT and verdict.cause is Cause.UNKNOWN:
        lines += [f"checked: {c}" for c in wording.checked(facts.detail)]
    if step := next_step(verdict):
        lines.append(f"next: {step}")
    return verdict.action.value + cause, wording.reason(verdict), lines

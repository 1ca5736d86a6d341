"""alert-forwarder, asked about one VM (`vmevents explain`): what it would do now with each finding on record about
the VM (send it to a receiver, firing or resolved, or not, and why: its receipts say what each receiver already
accepted), from its own decide on the record as a delivery reads it (delivery.on_record_of), and what its tick would
re-post; read-only: nothing is posted, claimed or written."""
from __future__ import annotations

from functions.alert_forwarder import wording
from functions.alert_forwarder.decide import DROP, SEND, Facts, Plan, decide
from functions.alert_forwarder.delivery import on_record_of
from functions.alert_forwarder.settings import Settings
from shared.kinds import EVENT
from shared.ledger import LABEL
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    """Every function's findings on record about the VM `namespace/name` (its identity's `vm` label)."""
    found = [r for e in ctx.kube.list(EVENT, namespace, label_selector=LABEL)
             if (r := on_record_of(e)) is not None and r.finding.identity.get("vm") == name]
    if not found:
        return "none", "no finding on record about this VM", []
    now = ctx.clock()
    lines = []
    for record in found:
        finding = record.finding
        verdict = decide(Facts(f"io.vmevents.{finding.function}.{finding.state}", [finding], [record]),
                         ctx.settings, now)
        said = wording.dropped(verdict, ctx.settings) if verdict.action == DROP else \
            "; ".join(_plan(plan) for plan in verdict.plans)
        lines.append(f"{finding.function} {finding.category}: {verdict.action}: {said}")
    tick = decide(Facts("", [r.finding for r in found], tick=True), ctx.settings, now)
    why = wording.dropped(tick, ctx.settings) if tick.action == DROP else \
        (wording.listed(tick.alerts) if tick.alerts else "nothing at or above MIN_SEVERITY")
    return tick.action, f"on its tick: {why}", lines


def _plan(plan: Plan) -> str:
    """What one finding's plan sends each receiver; or, sending nothing, why (as the log line says it)."""
    if plan.reason != SEND:
        return wording.forwarded([plan], [], 0)
    return "; ".join(f"{send.target.kind} gets {wording.listed(send.alerts)}" for send in plan.sends)

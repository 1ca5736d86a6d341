"""alert-forwarder, asked about one VM (`vmevents explain`): what it would do now with each finding on record about
the VM (post it, firing or resolved, or drop it, and why), from its own decide; read-only: nothing is posted."""
from __future__ import annotations

from functions.alert_forwarder.decide import decide, refresh
from functions.alert_forwarder.received import on_record
from functions.alert_forwarder.settings import Settings
from shared.finding import RESOLVED
from shared.kinds import EVENT
from shared.ledger import LABEL, record_of
from shared.runtime import KubeContext


def explain(ctx: KubeContext[Settings], namespace: str, name: str) -> tuple[str, str, list[str]]:
    """Every function's findings on record about the VM `namespace/name` (its identity's `vm` label)."""
    records = [r for e in ctx.kube.list(EVENT, namespace, label_selector=LABEL)
               if (r := record_of(e)) is not None and r.finding.labels.get("vm") == name]
    if not records:
        return "none", "no finding on record about this VM", []
    now = ctx.clock()
    found = [on_record(r.finding.data(r.state), "detected" if r.open else RESOLVED, r.opened_at, r.resolved_at)
             for r in records]
    lines = []
    for record, finding in zip(records, found, strict=True):
        verdict = decide(f"io.vmevents.{record.finding.function}.{finding.state}", [finding], ctx.settings, now)
        lines.append(f"{record.finding.function} {record.finding.category}: {verdict.action}: {verdict.reason}")
    tick = refresh(found, ctx.settings, now)
    return tick.action, f"on its tick: {tick.reason}", lines

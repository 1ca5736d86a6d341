"""What people read about a stuck VM: the Event's sentence, the finding (its report: cause, evidence, next step)
and the end of an episode."""
from __future__ import annotations

from collections.abc import Mapping

from functions.vm_stuck_report.decide import Verdict, stamp
from shared import kubevirt as kv
from shared.finding import Finding
from shared.ledger import Record

FUNCTION = "vm-stuck-report"


def _vm_name(vm: Mapping) -> str:
    meta = kv.meta(vm)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def event_message(verdict: Verdict, vm: Mapping, migration: str | None) -> str:
    """One sentence about the stuck VM, stable while its facts are: recording it again raises the count."""
    s = verdict.stuck
    assert s is not None
    what = f"migration {migration} is {s.state.removeprefix('Migration')}" if migration else f"is {s.state}"
    cause = verdict.cause.value if verdict.cause else "unknown"
    head = f"VM {_vm_name(vm)} {what} since {stamp(s.since)}"
    if cause == "unknown":
        return f"{head}; the cause is unknown (checked: {'; '.join(verdict.checked)}). {verdict.next_step}"
    return f"{head}: {cause}: {'; '.join(verdict.evidence)}. Next: {verdict.next_step}"


def report_data(verdict: Verdict, vm: Mapping, migration: str | None) -> dict:
    """The report: one cause, its evidence and one next step (or unknown, and what was checked)."""
    s = verdict.stuck
    assert s is not None
    return {"vm": _vm_name(vm), "state": s.state, "group": s.group, "since": stamp(s.since),
            "threshold": int(s.threshold.total_seconds()), "migration": migration, "instance": s.instance,
            "cause": verdict.cause.value if verdict.cause else "unknown", "evidence": list(verdict.evidence),
            "nextStep": verdict.next_step, "checked": list(verdict.checked)}


def finding(verdict: Verdict, vm: Mapping, migration: str | None) -> Finding:
    """A stuck episode as a finding (docs/findings.md): its identity is the state group and the instance that is
    stuck (the VMIM's uid, else the VMI's, else the VM's); the cause may change while it lasts, the identity
    does not."""
    s = verdict.stuck
    assert s is not None
    meta = kv.meta(vm)
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    message = event_message(verdict, vm, migration)
    return Finding(FUNCTION, f"stuck-{s.group}", f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}",
                   s.instance, {"namespace": namespace, "vm": name, "state": s.group}, "warning", message,
                   (verdict.next_step,), report_data(verdict, vm, migration))


def resolved_message(record: Record, because: str) -> str:
    d = record.finding.details
    what = f"migration {d.get('migration')}" if d.get("migration") else f"VM {d.get('vm')}"
    return f"{what} is no longer stuck ({d.get('state')} since {d.get('since')}): {because}."

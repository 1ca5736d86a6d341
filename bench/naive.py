"""The API-cost benchmark's baseline: the re-scans as they read the cluster before the cheap forms.

Each is a faithful copy of the read path the function had (git history: functions/<name>/handler.py
before "Cheap re-scans"): full objects, every VMI / VMIM / VM of the cluster in pages of 250, straight
from etcd, then each candidate converged by the function's own `converge` (so the candidates cost the same
on both sides; only the finding of them differs). They act as the functions do (vmi-cleanup runs in dry
run in the benchmark), and their outcome is not compared: what is measured is what they ask the server.
"""
from __future__ import annotations

from typing import Any

from functions.evacuation_report import handler as evacuation
from functions.io_pause_report import handler as io_pause
from functions.io_pause_report.decide import io_paused
from functions.migration_report import handler as migration
from functions.migration_report.decide import precheck
from functions.vm_stuck_report import handler as stuck
from functions.vm_stuck_report.settings import GROUPS, MIGRATION_PHASES
from functions.vmi_cleanup import handler as cleanup
from shared import kubevirt as kv
from shared import nodes
from shared import objects as o
from shared.errors import TemporaryError
from shared.kinds import EVENT, NODE, VM, VMI, VMIM
from shared.runtime import KubeContext


def vmi_cleanup(ctx: KubeContext[Any]) -> int:
    """Every VMI, page by page; each in a final phase and in scope converged."""
    scanned = 0
    namespaces: list[str | None] = [*sorted(ctx.settings.namespaces)] or [None]
    for namespace in namespaces:
        for vmi in ctx.kube.list(VMI, namespace):
            scanned += 1
            if kv.phase(vmi) not in ctx.settings.phases or not ctx.settings.in_scope(kv.meta(vmi).get("namespace", "")):
                continue
            try:
                cleanup.converge(vmi, ctx)
            except TemporaryError:
                continue
    return scanned


def io_pause_report(ctx: KubeContext[Any], delivery: str = "bench") -> int:
    """Every VMI (each paused on an IO error converged), then every IOErrorPause Event of ours."""
    seen: set[tuple[str, str]] = set()
    scanned = 0

    def visit(found: io_pause.Target) -> None:
        if (found.namespace, found.name) in seen:
            return
        seen.add((found.namespace, found.name))
        try:
            io_pause.converge(found, ctx, delivery=delivery)  # (it was given the listed VMI; now it reads it)
        except TemporaryError:
            return

    for vmi in ctx.kube.list(VMI):
        scanned += 1
        if io_paused(vmi) is not None:
            visit(io_pause.Target(kv.meta(vmi)["namespace"], kv.meta(vmi)["name"]))
    for event in ctx.kube.list(EVENT, field_selector=f"reason={io_pause.REASON}"):
        if (event.get("source") or {}).get("component") == io_pause.FUNCTION:
            obj = event.get("involvedObject") or {}
            visit(io_pause.Target(obj.get("namespace") or kv.meta(event).get("namespace") or "default", obj["name"]))
    return scanned


def migration_report(ctx: KubeContext[Any]) -> int:
    """Every VMIM, page by page; each final one that ended within the window converged."""
    scanned = 0
    now = ctx.clock()
    namespaces: list[str | None] = [*sorted(ctx.settings.namespaces)] or [None]
    for namespace in namespaces:
        for vmim in ctx.kube.list(VMIM, namespace):
            scanned += 1
            if precheck(vmim, ctx.settings, now):
                continue
            try:
                migration.converge(vmim, ctx)
            except TemporaryError:
                continue
    return scanned


def device_conflict(ctx: KubeContext[Any]) -> int:
    """device-conflict's reads before issue 13/15: every VM, every VMI, and its HostDeviceConflict Events
    (the index and the decision that followed cost the server nothing)."""
    vms = sum(1 for _ in ctx.kube.list(VM))
    vmis = sum(1 for _ in ctx.kube.list(VMI))
    sum(1 for _ in ctx.kube.list(EVENT, field_selector="reason=HostDeviceConflict"))
    return vms + vmis


def device_conflict_event(ctx: KubeContext[Any]) -> int:
    """device-conflict's reads for one relevant event before issue 13/15: every VM and every VMI."""
    return sum(1 for _ in ctx.kube.list(VM)) + sum(1 for _ in ctx.kube.list(VMI))


def vm_stuck_report(ctx: KubeContext[Any], delivery: str = "bench") -> int:
    """The obvious re-scan vm-stuck-report never shipped: every VM and every VMIM in full, each in a stuck state
    converged, then every finding on record (the same visits as now; only the finding of candidates differs)."""
    scanned, seen = 0, set()

    def visit(found: stuck.Target) -> None:
        if found.key in seen:
            return
        seen.add(found.key)
        try:
            stuck.converge(found, ctx, delivery, tick=True)
        except TemporaryError:
            return

    for vm in ctx.kube.list(VM):
        scanned += 1
        if o.string(vm, "status", "printableStatus") in GROUPS:
            visit(stuck.Target(kv.meta(vm)["namespace"], kv.meta(vm)["name"]))
    for vmim in ctx.kube.list(VMIM):
        if (o.string(vmim, "status", "phase") or "Pending") in MIGRATION_PHASES:
            visit(stuck.Target(kv.meta(vmim)["namespace"], o.string(vmim, "spec", "vmiName"), kv.meta(vmim)["name"]))
    for record in stuck._ledger(ctx).records(state=None):
        if record.open:
            visit(stuck._target_of_record(record))
    return scanned


def evacuation_report(ctx: KubeContext[Any], delivery: str = "bench") -> int:
    """The obvious re-scan evacuation-report never shipped: every Node and every VMI in full, page by page from
    etcd, the VMIs grouped by node; each node being emptied or down (or with a finding open) converged, the same
    visits as now (only the finding of candidates differs)."""
    on: dict[str, int] = {}
    for vmi in ctx.kube.list(VMI):
        node = o.string(vmi, "status", "nodeName")
        on[node] = on.get(node, 0) + 1
    wanted = {o.string(n, "metadata", "name") for n in ctx.kube.list(NODE)
              if on.get(o.string(n, "metadata", "name")) and (nodes.down(n) or nodes.draining(n))}
    wanted |= {str(r.finding.details.get("node")) for r in evacuation._ledger(ctx).records()}
    for name in sorted(wanted):
        try:
            evacuation.converge(name, ctx, delivery, tick=True)
        except TemporaryError:
            continue
    return sum(on.values())

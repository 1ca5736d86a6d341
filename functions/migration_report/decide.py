"""migration-report's pure part: whether a migration is worth a report, and when a report ends.

Every fact is an argument (Facts, Settings, now): no API call, no clock, no environment. What KubeVirt did in the
migration (its numbers, the failure's category) is analysis.py's, its arithmetic shared/migrations.py's (which
evacuation-report uses too); the words people read — the Event's sentence, the details, the advice — are
wording.py's.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from functions.migration_report.analysis import Explained, analyse, finished_at
from functions.migration_report.settings import Settings
from shared import kubevirt as kv

# KubeVirt's evacuation controller annotates the migrations it creates for a drained node with that node
# (types.go EvacuationMigrationAnnotation, docs/facts.md §10): evacuation-report explains them in its node's finding.


class Action(enum.StrEnum):
    SKIP = "skip"          # not final, out of scope, too old, or a success well inside its budget
    REPORT = "report"


@dataclass(frozen=True)
class Facts:
    """What the cluster keeps about one migration, read fresh."""

    vmim: dict
    vmi: dict | None = None          # None when gone, or a newer VMI of the same name (a restart since)
    vm: dict | None = None
    kubevirt: dict | None = None     # the KubeVirt CR
    policies: tuple[dict, ...] = ()
    namespace: dict | None = None
    events: tuple[dict, ...] = ()    # KubeVirt's Events on the VMIM and VMI, the scheduler's on target pods


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    notice: str | None = None        # which reply: "failed" | "near-timeout" (io.vmevents.migration-report.<notice>)
    # KubeVirt's numbers and the category (analysis.py), read-only; wording.py makes the reply's data of a copy
    report: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    explained: Explained | None = None  # what explains the category when KubeVirt wrote no words for it


def precheck(vmim: dict, settings: Settings, now: datetime) -> str | None:
    """Why this VMIM needs no closer look (no API call needed to say so), or None."""
    meta, phase = kv.meta(vmim), kv.phase(vmim)
    if not settings.in_scope(meta.get("namespace", "")):
        return f"namespace {meta.get('namespace')} is out of scope"
    if kv.annotations_of(vmim).get(kv.EVACUATION_MIGRATION):
        return _evacuation(kv.annotations_of(vmim)[kv.EVACUATION_MIGRATION])
    if phase not in kv.FINAL_PHASES:
        return f"phase is {phase or 'unset'}, not final yet"
    ended = finished_at(vmim)
    if ended is not None and now - ended > settings.within:
        return (f"ended at {ended:%Y-%m-%dT%H:%M:%SZ}, more than MIGRATION_REPORT_WITHIN="
                f"{_span(settings.within)} ago (its report, if any, may have expired with its Event)")
    return None


def row_precheck(meta: Mapping[str, Any], phase: Any, settings: Settings, now: datetime) -> str | None:
    """precheck from a VMIM's Table row (its Phase cell and its metadata) before any full read, or None when
    the full object may be reportable. The same three rules; the row has no end time, so the third uses the
    newest managedFields[].time instead: every write stamps its writer's entry (second precision) and the
    final phase is a write, so a VMIM last written more than MIGRATION_REPORT_WITHIN (+1 s) ago ended before
    the window too. Without a readable time on every entry (a client may clear managedFields), it may not
    have: None, and the full object decides. Pure."""
    namespace = str(meta.get("namespace") or "default")
    if not settings.in_scope(namespace):
        return f"namespace {namespace} is out of scope"
    notes = meta.get("annotations")
    node = notes.get(kv.EVACUATION_MIGRATION) if isinstance(notes, dict) else None
    if isinstance(node, str) and node:
        return _evacuation(node)
    if not isinstance(phase, str) or phase not in kv.FINAL_PHASES:
        return f"phase is {phase or 'unset'}, not final yet"
    entries = meta.get("managedFields")
    times = [kv.parse_time(e.get("time")) if isinstance(e, dict) else None
             for e in (entries if isinstance(entries, list) else ())]
    known = [t for t in times if t is not None]
    if known and len(known) == len(times) and now - max(known) > settings.within + timedelta(seconds=1):
        return (f"last written at {max(known):%Y-%m-%dT%H:%M:%SZ}, so ended more than MIGRATION_REPORT_WITHIN="
                f"{_span(settings.within)} ago")
    return None


def _evacuation(node: str) -> str:
    return f"an evacuation of node {node}: evacuation-report explains it in that node's finding"


def decide(facts: Facts, settings: Settings, now: datetime) -> Verdict:
    """Report this migration or not, and in which category. Pure: every fact is an argument."""
    skip = precheck(facts.vmim, settings, now)
    if skip:
        return Verdict(Action.SKIP, skip)
    report, explained = analyse(facts)
    if kv.phase(facts.vmim) == "Succeeded":
        used = report["budget"]["usedRatio"]
        if used is None:
            return Verdict(Action.SKIP, "succeeded; its completion budget is unknown (no memory size)",
                           report=_read_only(report))
        if used < settings.warn_ratio:
            return Verdict(Action.SKIP, f"succeeded in {report['timing']['tookSeconds']} s, {used:.0%} of its "
                                        f"{report['budget']['completionTimeoutSeconds']} s budget "
                                        f"(under MIGRATION_WARN_RATIO={settings.warn_ratio:g})",
                           report=_read_only(report))
        report["category"] = "near-timeout"
        notice = "near-timeout"
    else:
        notice = "failed"
    return Verdict(Action.REPORT, f"{notice}: {report['category']}", notice=notice, report=_read_only(report),
                   explained=explained)


def _read_only(value: Any) -> Any:
    """The report as the verdict holds it: every mapping in it read-only (wording.py copies it)."""
    if isinstance(value, dict):
        return MappingProxyType({key: _read_only(item) for key, item in value.items()})
    return value


def ended(reported: Mapping[str, Any], vmi: dict | None, migrations: Iterable[dict], opened: datetime | None,
          settings: Settings, now: datetime) -> str | None:
    """Why a reported migration's finding is over, or None while it stands. A failed (or nearly timed-out)
    migration is a fact in the past; what lasts is "this VMI could not migrate well", and that ends when
    a later migration of the same VMI has ended (its own report says how it went), when the VMI is gone
    or was restarted (a new VMI), or MIGRATION_RESOLVED_AFTER after it was reported. Pure."""
    uid, vmi_uid = reported.get("uid"), reported.get("vmiUid")
    namespace, _, name = str(reported.get("vmi") or "").partition("/")
    if vmi is None:
        return f"the VMI {namespace}/{name} is gone"
    if vmi_uid and kv.meta(vmi).get("uid") != vmi_uid:
        return f"the VMI {namespace}/{name} was restarted (a new VMI)"
    began = kv.parse_time(str(reported.get("createdAt") or ""))
    for other in migrations:
        meta = kv.meta(other)
        if meta.get("uid") == uid or meta.get("namespace") != namespace or kv.phase(other) not in kv.FINAL_PHASES:
            continue
        created = kv.parse_time(meta.get("creationTimestamp"))  # whole seconds: the same second counts as later
        if (other.get("spec") or {}).get("vmiName") == name and (began is None or (created and created >= began)):
            return f"a later migration of the VMI, {meta.get('name')}, has {kv.phase(other).lower()}"
    if opened is not None and now - opened >= settings.resolved_after:
        return f"reported {_span(now - opened)} ago (MIGRATION_RESOLVED_AFTER={_span(settings.resolved_after)})"
    return None


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"

"""How migration-report's re-scan finds the migrations worth a look without reading every VMIM each tick.

A re-scan exists for what the events missed: a VMIM that turned final while the function was down, or whose
event was lost. Every such VMIM changed since the last tick, so a tick needs only what changed since then.
The **cursor** is where the last tick got to: the resourceVersion of the last VMIM change it saw, kept in
one ConfigMap (MIGRATION_CURSOR, key `resourceVersion`; with MIGRATION_NAMESPACES, one key per namespace,
`resourceVersion.<namespace>`). A tick with a cursor WATCHes the VMIMs from it for a second (Kube.changes):
kube-apiserver's watch cache sends what changed since, at once, and nothing else. At 10,000 VMs and no
migration under way that is an empty answer where the list was a megabyte (docs/api-cost.md).

A tick without a cursor (the first, MIGRATION_CURSOR empty, the ConfigMap deleted) or whose cursor fails
(410 Expired: the cache no longer keeps that version; or any other error of the watch) lists the Table
rows as before, and starts the cursor at the list's resourceVersion. The handler saves the new cursor only
after a tick that visited every candidate and settled every finding without a failure: otherwise the next
tick starts from the same place, sees the same changes again and retries what failed (work done is not
redone: a reported migration is on record, a resolved finding is resolved). Two ticks at once (a
redelivery) both write with the version they read: one wins, and either cursor is a point up to which every
change was handled.

A finding whose Event is lost (deleted, or expired while the function was down) is reported again, once, by
the next tick (docs/findings.md). A listing saw that: the migration is listed and no longer on record. Its
VMIM need not change again, so the cursor also remembers (key `reported`) the migrations on record that were
reported within MIGRATION_REPORT_WITHIN, "uid namespace/name" a line: one that is no longer on record is a
candidate again.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from functions.migration_report.decide import precheck, row_precheck
from functions.migration_report.settings import Settings
from shared import configmaps
from shared import kubevirt as kv
from shared.configmaps import Stored
from shared.kinds import VMIM
from shared.kube import Conflict, Forbidden, Kube, KubeError
from shared.ledger import Record

KEY = "resourceVersion"
REPORTED = "reported"
SETTLED_AT = "settledAt"   # when a tick last read every finding on record (ISO 8601, UTC)
REPLIED_BY = "repliedBy"   # the delivery of the last tick that reported or resolved something
WATCH_SECONDS = 1  # how long a tick's watch stays open: the changes kept since the cursor come at once


@dataclass
class Seen:
    """What one part of a re-scan (every namespace, or one of MIGRATION_NAMESPACES) saw."""

    namespace: str | None
    briefs: list[dict]              # the VMIMs decide.ended compares: listed rows, or the changed VMIMs in full
    candidates: list[tuple[str, str, str]]  # (namespace, name, uid) of those precheck does not rule out
    version: str                    # where the next tick starts ("" when the server gave none)
    listed: bool                    # True: every VMIM's row was listed; False: only the changes since the cursor
    count: int                      # rows listed, or changes seen
    uids: set[str] = field(default_factory=set)  # every VMIM listed (a listing only)
    why_listed: str = ""            # why a part with a cursor listed anyway


def key(namespace: str | None) -> str:
    return KEY if namespace is None else f"{KEY}.{namespace}"


def read(kube: Kube, where: tuple[str, str] | None) -> Stored | None:
    return configmaps.read(kube, where) if where is not None else None


def scan(kube: Kube, namespace: str | None, since: str | None, settings: Settings, now: datetime) -> Seen:
    """The changes since the cursor `since`, or (without one, or when its watch fails) every VMIM's row; and
    which of them precheck does not rule out (the handler leaves out those on record)."""
    why = ""
    if since:
        try:
            changes = kube.changes(VMIM, namespace, since, seconds=WATCH_SECONDS)
        except Forbidden:  # the configuration's failure: answered 500, to the dead letter
            raise
        except KubeError as exc:
            why = f"the watch from the cursor failed ({exc}); listed instead"
        else:
            latest: dict[str, tuple[str, dict]] = {}
            for kind, obj in changes.events:  # in order: the last change of each VMIM wins
                latest[str(kv.meta(obj).get("uid") or kv.api_path(obj))] = (kind, obj)
            current = [obj for kind, obj in latest.values() if kind != "DELETED"]
            candidates = [_where(obj) for obj in current if precheck(obj, settings, now) is None]
            return Seen(namespace, current, candidates, changes.resource_version, False, len(changes.events))
    rows = kube.rows(VMIM, namespace, cached=True)
    briefs = [brief(row) for row in rows]
    candidates = [_where(b) for row, b in zip(rows, briefs, strict=True)
                  if row_precheck(row["metadata"], b["status"]["phase"], settings, now) is None]
    return Seen(namespace, briefs, candidates, rows.resource_version, True, len(rows),
                uids={str(b["metadata"].get("uid")) for b in briefs}, why_listed=why)


def remembered(stored: Stored | None) -> dict[str, tuple[str, str]]:
    """The reported migrations the cursor remembers: uid → (namespace, name)."""
    found = {}
    for line in (stored.data.get(REPORTED, "") if stored is not None else "").splitlines():
        uid, _, where = line.strip().partition(" ")
        namespace, _, name = where.partition("/")
        if uid and namespace and name:
            found[uid] = (namespace, name)
    return found


def recent(records: Iterable[Record], settings: Settings, now: datetime) -> dict[str, tuple[str, str]]:
    """The migrations on record reported within MIGRATION_REPORT_WITHIN (older ones ended before the window:
    precheck would skip them anyway)."""
    return {record.finding.key: (str(record.involved.get("namespace") or record.namespace),
                                 str(record.involved.get("name") or ""))
            for record in records
            if record.opened_at is not None and now - record.opened_at <= settings.within
            and record.involved.get("name")}


def settle_due(stored: Stored | None, settings: Settings, now: datetime, delivery: str) -> str | None:
    """Why this tick must read every finding on record even though no change needs it, or None: the cursor
    says no tick has (or not within MIGRATION_SETTLE_EVERY), or this is a redelivery of the tick that last
    reported or resolved something (it answers with that again)."""
    if stored is None:
        return "no cursor yet"
    if delivery and stored.data.get(REPLIED_BY) == delivery:
        return "a redelivery of the tick that last reported"
    try:
        settled = datetime.fromisoformat(stored.data.get(SETTLED_AT) or "")
    except ValueError:
        return "never settled"
    if settled.tzinfo is None or now < settled or now - settled >= settings.settle_every:  # (a clock behind: settle)
        return f"last settled at {settled:%Y-%m-%dT%H:%M:%SZ}"
    return None


def save(kube: Kube, where: tuple[str, str] | None, stored: Stored | None, parts: Iterable[Seen], *,
         reported: dict[str, tuple[str, str]] | None = None, settled_at: datetime | None = None,
         replied_by: str | None = None) -> bool:
    """Advance the cursor to where these parts got to; a tick that settled also says when, what it remembers
    as reported, and (when it replied) its delivery. False when there was nothing to write, or another tick
    wrote it first (its cursor is as good)."""
    if where is None:
        return False
    data = dict(stored.data) if stored is not None else {}
    data.update({key(part.namespace): part.version for part in parts if part.version})
    if reported is not None:
        data[REPORTED] = "".join(f"{uid} {ns}/{name}\n" for uid, (ns, name) in sorted(reported.items()))
    if settled_at is not None:
        data[SETTLED_AT] = settled_at.isoformat()
    if replied_by is not None:
        data[REPLIED_BY] = replied_by
    if stored is not None and data == stored.data:
        return False
    try:
        configmaps.put(kube, where, stored, data, stored.annotations if stored else {}, managed_by="migration-report")
    except Conflict:
        return False
    return True


def brief(row: dict) -> dict:
    """What decide.ended needs of a listed VMIM, from its Table row: the row's metadata, its VMI and Phase cells
    (KubeVirt's printer columns for VMIMs, simcluster/tables.py; the Table has no time column, the metadata
    has creationTimestamp)."""
    meta, cells = row.get("metadata") or {}, row.get("cells") or {}
    phase, vmi_name = cells.get("phase"), cells.get("vmi")
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
            "spec": {"vmiName": vmi_name if isinstance(vmi_name, str) else None},
            "status": {"phase": phase if isinstance(phase, str) else None}}


def _where(vmim: dict) -> tuple[str, str, str]:
    meta = kv.meta(vmim)
    return str(meta.get("namespace") or "default"), str(meta.get("name")), str(meta.get("uid") or "")

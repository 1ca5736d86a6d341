"""migration-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from functions.migration_report.declaration import (
    DECLARATION,
    MIGRATION_CURSOR,
    MIGRATION_EXCLUDE_NAMESPACES,
    MIGRATION_NAMESPACES,
    MIGRATION_REPORT_WITHIN,
    MIGRATION_RESOLVED_AFTER,
    MIGRATION_SETTLE_EVERY,
    MIGRATION_WARN_RATIO,
)
from shared import rescan as rescan_settings
from shared.settings import SettingsError, checked, in_scope

FINDING_RENEW_AFTER = DECLARATION.setting("FINDING_RENEW_AFTER")


@dataclass(frozen=True)
class Settings:
    warn_ratio: float = MIGRATION_WARN_RATIO.value        # a success using this much is reported
    within: timedelta = MIGRATION_REPORT_WITHIN.value     # older endings are not looked at
    namespaces: frozenset[str] = MIGRATION_NAMESPACES.value  # empty: every namespace
    exclude_namespaces: frozenset[str] = MIGRATION_EXCLUDE_NAMESPACES.value
    # MIGRATION_RESOLVED_AFTER: a reported migration's finding ends this long after it was reported, unless a
    # later migration of the VMI ended or the VMI went away first (decide.ended)
    resolved_after: timedelta = MIGRATION_RESOLVED_AFTER.value
    # FINDING_RENEW_AFTER: the re-scan rewrites an open finding's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) while it stands (shared/ledger.py)
    finding_renew_after: timedelta = FINDING_RENEW_AFTER.value
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS
    # MIGRATION_CURSOR: the ConfigMap where the re-scan keeps how far it has read the VMIMs' changes, so that a
    # tick watches what changed since instead of listing every VMIM (cursor.py); empty: every tick lists
    cursor: tuple[str, str] | None = MIGRATION_CURSOR.value
    # MIGRATION_SETTLE_EVERY: with a cursor, a tick whose changes hold no migration worth a look reads the
    # findings on record (to resolve, renew, and report again one whose Event was lost) only this often; 0s:
    # every tick does (handler.rescan, docs/api-cost.md)
    settle_every: timedelta = MIGRATION_SETTLE_EVERY.value

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    within = MIGRATION_REPORT_WITHIN.read(environ)
    if within <= timedelta(0):
        raise SettingsError("MIGRATION_REPORT_WITHIN='0s' would report nothing; use a value like 30m "
                            "(below the API server's --event-ttl, 1h by default).")
    settle_every = MIGRATION_SETTLE_EVERY.read(environ)
    if settle_every > timedelta(minutes=30):
        raise SettingsError("MIGRATION_SETTLE_EVERY is over 30m: open findings are renewed only when a tick settles "
                            "them, so keep it, plus FINDING_RENEW_AFTER, well under the API server's --event-ttl "
                            "(1h by default); use a value like 5m.")
    return Settings(warn_ratio=MIGRATION_WARN_RATIO.read(environ),
                    within=within,
                    namespaces=MIGRATION_NAMESPACES.read(environ),
                    exclude_namespaces=MIGRATION_EXCLUDE_NAMESPACES.read(environ),
                    resolved_after=MIGRATION_RESOLVED_AFTER.read(environ),
                    finding_renew_after=FINDING_RENEW_AFTER.read(environ),
                    rescan=rescan_settings.load(environ),
                    settle_every=settle_every,
                    cursor=MIGRATION_CURSOR.read(environ))

"""migration-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared import rescan as rescan_settings
from shared.settings import Env, SettingsError, in_scope


@dataclass(frozen=True)
class Settings:
    warn_ratio: float = 0.8                         # MIGRATION_WARN_RATIO: a success using this much is reported
    within: timedelta = timedelta(minutes=30)       # MIGRATION_REPORT_WITHIN: older endings are not looked at
    namespaces: frozenset[str] = frozenset()        # MIGRATION_NAMESPACES (empty: every namespace)
    exclude_namespaces: frozenset[str] = frozenset()  # MIGRATION_EXCLUDE_NAMESPACES
    # MIGRATION_RESOLVED_AFTER: a reported migration's finding ends this long after it was reported, unless a
    # later migration of the VMI ended or the VMI went away first (decide.ended)
    resolved_after: timedelta = timedelta(hours=6)
    # FINDING_RENEW_AFTER: the re-scan rewrites an open finding's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) while it stands (shared/ledger.py)
    finding_renew_after: timedelta = timedelta(minutes=15)
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS
    # MIGRATION_CURSOR: the ConfigMap where the re-scan keeps how far it has read the VMIMs' changes, so that a
    # tick watches what changed since instead of listing every VMIM (cursor.py); empty: every tick lists
    cursor: tuple[str, str] | None = ("vmevents", "vmevents-migration-report-cursor")
    # MIGRATION_SETTLE_EVERY: with a cursor, a tick whose changes hold no migration worth a look reads the
    # findings on record (to resolve, renew, and report again one whose Event was lost) only this often; 0s:
    # every tick does (handler.rescan, docs/api-cost.md)
    settle_every: timedelta = timedelta(minutes=5)

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    env = Env(environ)
    within = env.duration("MIGRATION_REPORT_WITHIN", "30m")
    if within <= timedelta(0):
        raise SettingsError("MIGRATION_REPORT_WITHIN='0s' would report nothing; use a value like 30m "
                            "(below the API server's --event-ttl, 1h by default).")
    settle_every = env.duration("MIGRATION_SETTLE_EVERY", "5m")
    if settle_every > timedelta(minutes=30):
        raise SettingsError("MIGRATION_SETTLE_EVERY is over 30m: open findings are renewed only when a tick settles "
                            "them, so keep it, plus FINDING_RENEW_AFTER, well under the API server's --event-ttl "
                            "(1h by default); use a value like 5m.")
    return Settings(warn_ratio=env.number("MIGRATION_WARN_RATIO", 0.8, minimum=0.01, maximum=1.0),
                    within=within,
                    namespaces=env.names("MIGRATION_NAMESPACES"),
                    exclude_namespaces=env.names("MIGRATION_EXCLUDE_NAMESPACES"),
                    resolved_after=env.duration("MIGRATION_RESOLVED_AFTER", "6h"),
                    finding_renew_after=env.duration("FINDING_RENEW_AFTER", "15m"),
                    rescan=rescan_settings.load(environ),
                    settle_every=settle_every,
                    cursor=env.object_ref("MIGRATION_CURSOR", "vmevents/vmevents-migration-report-cursor",
                                          optional=True))

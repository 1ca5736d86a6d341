"""io-pause-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from functions.io_pause_report.declaration import DECLARATION, IO_PAUSE_RESOLVED_AFTER, IO_PAUSE_STUCK_AFTER
from shared import rescan as rescan_settings
from shared.settings import checked

FINDING_RENEW_AFTER = DECLARATION.setting("FINDING_RENEW_AFTER")
LONGHORN_NAMESPACE = DECLARATION.setting("LONGHORN_NAMESPACE")


@dataclass(frozen=True)
class Settings:
    stuck_after: timedelta = IO_PAUSE_STUCK_AFTER.value       # paused this long is stuck
    resolved_after: timedelta = IO_PAUSE_RESOLVED_AFTER.value  # quiet this long ends an episode
    longhorn_namespace: str = LONGHORN_NAMESPACE.value        # where Longhorn's Volumes and Engines live
    # FINDING_RENEW_AFTER: the re-scan rewrites an open episode's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) for as long as the episode lasts (shared/ledger.py)
    finding_renew_after: timedelta = FINDING_RENEW_AFTER.value
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    namespace = LONGHORN_NAMESPACE.read(environ)
    return Settings(stuck_after=IO_PAUSE_STUCK_AFTER.read(environ),
                    resolved_after=IO_PAUSE_RESOLVED_AFTER.read(environ),
                    longhorn_namespace=namespace,
                    finding_renew_after=FINDING_RENEW_AFTER.read(environ),
                    rescan=rescan_settings.load(environ))

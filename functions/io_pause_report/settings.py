"""io-pause-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared import rescan as rescan_settings
from shared.settings import Env, SettingsError


@dataclass(frozen=True)
class Settings:
    stuck_after: timedelta = timedelta(minutes=10)      # IO_PAUSE_STUCK_AFTER: paused this long is stuck
    resolved_after: timedelta = timedelta(minutes=10)   # IO_PAUSE_RESOLVED_AFTER: quiet this long ends an episode
    longhorn_namespace: str = "longhorn-system"         # LONGHORN_NAMESPACE: where Longhorn's Volumes and Engines live
    # FINDING_RENEW_AFTER: the re-scan rewrites an open episode's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) for as long as the episode lasts (shared/ledger.py)
    finding_renew_after: timedelta = timedelta(minutes=15)
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    env = Env(environ)
    namespace = env.raw("LONGHORN_NAMESPACE", "longhorn-system")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
        raise SettingsError(f"LONGHORN_NAMESPACE={namespace!r} is not a namespace name; "
                            f"use a value like longhorn-system.")
    return Settings(stuck_after=env.duration("IO_PAUSE_STUCK_AFTER", "10m"),
                    resolved_after=env.duration("IO_PAUSE_RESOLVED_AFTER", "10m"),
                    longhorn_namespace=namespace,
                    finding_renew_after=env.duration("FINDING_RENEW_AFTER", "15m"),
                    rescan=rescan_settings.load(environ))

"""evacuation-report's settings: every environment variable it reads, read once at start-up (declaration.py)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from functions.evacuation_report.declaration import (
    DECLARATION,
    EVACUATION_DOWN_AFTER,
    EVACUATION_EXCLUDE_NAMESPACES,
    EVACUATION_NAMESPACES,
    EVACUATION_WARN_RATIO,
    HARVESTER_NAMESPACE,
)
from shared import rescan as rescan_settings
from shared.settings import SettingsError, checked, in_scope

FINDING_RENEW_AFTER = DECLARATION.setting("FINDING_RENEW_AFTER")
LONGHORN_NAMESPACE = DECLARATION.setting("LONGHORN_NAMESPACE")
OPT_OUT = "vmevents.io/evacuation-report"  # annotation on a Node: "skip" (or "false", "off") means never report it


@dataclass(frozen=True)
class Settings:
    # how long a node's Ready may be other than True before it is reported as down
    down_after: timedelta = EVACUATION_DOWN_AFTER.value
    # a running evacuation migration that used this share of its completion budget is said to be near its timeout
    warn_ratio: float = EVACUATION_WARN_RATIO.value
    namespaces: frozenset[str] = EVACUATION_NAMESPACES.value          # empty: every namespace
    exclude_namespaces: frozenset[str] = EVACUATION_EXCLUDE_NAMESPACES.value
    longhorn_namespace: str = LONGHORN_NAMESPACE.value
    harvester_namespace: str = HARVESTER_NAMESPACE.value
    # the re-scan rewrites an open finding's Event once its last write is this old, so it outlives kube-apiserver's
    # --event-ttl (1 h by default) while the node stays as it is (shared/ledger.py)
    finding_renew_after: timedelta = FINDING_RENEW_AFTER.value
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    down_after = EVACUATION_DOWN_AFTER.read(environ)
    if down_after > timedelta(hours=1):
        raise SettingsError("EVACUATION_DOWN_AFTER is over 1h: Harvester force-resets a dead node's VMs after 15 s "
                            "(1.7 on) or 5 minutes (1.4 to 1.6); use a value like 1m.")
    return Settings(down_after=down_after,
                    warn_ratio=EVACUATION_WARN_RATIO.read(environ),
                    namespaces=EVACUATION_NAMESPACES.read(environ),
                    exclude_namespaces=EVACUATION_EXCLUDE_NAMESPACES.read(environ),
                    longhorn_namespace=LONGHORN_NAMESPACE.read(environ),
                    harvester_namespace=HARVESTER_NAMESPACE.read(environ),
                    finding_renew_after=FINDING_RENEW_AFTER.read(environ),
                    rescan=rescan_settings.load(environ))

"""evacuation-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared import rescan as rescan_settings
from shared.settings import Env, SettingsError, in_scope

OPT_OUT = "vmevents.io/evacuation-report"  # annotation on a Node: "skip" (or "false", "off") means never report it
_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@dataclass(frozen=True)
class Settings:
    # EVACUATION_DOWN_AFTER: how long a node's Ready may be other than True before it is reported as down. The node
    # lifecycle controller already waits its grace period (40 s) before it writes Unknown.
    down_after: timedelta = timedelta(minutes=1)
    # EVACUATION_WARN_RATIO: a running evacuation migration that has used this share of its completion budget is
    # said to be near its timeout (migration-report's MIGRATION_WARN_RATIO, for the migrations it leaves to us)
    warn_ratio: float = 0.8
    namespaces: frozenset[str] = frozenset()          # EVACUATION_NAMESPACES (empty: every namespace)
    exclude_namespaces: frozenset[str] = frozenset()  # EVACUATION_EXCLUDE_NAMESPACES
    longhorn_namespace: str = "longhorn-system"       # LONGHORN_NAMESPACE: where Longhorn's Volumes live
    harvester_namespace: str = "harvester-system"     # HARVESTER_NAMESPACE: where Harvester's Upgrades live
    # FINDING_RENEW_AFTER: the re-scan rewrites an open finding's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) while the node stays as it is (shared/ledger.py)
    finding_renew_after: timedelta = timedelta(minutes=15)
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    env = Env(environ)
    down_after = env.duration("EVACUATION_DOWN_AFTER", "1m")
    if down_after > timedelta(hours=1):
        raise SettingsError("EVACUATION_DOWN_AFTER is over 1h: Harvester force-resets a dead node's VMs after 15 s "
                            "(1.7 on) or 5 minutes (1.4 to 1.6); use a value like 1m.")
    names = {}
    for variable, default in (("LONGHORN_NAMESPACE", "longhorn-system"), ("HARVESTER_NAMESPACE", "harvester-system")):
        value = env.raw(variable, default)
        if not re.fullmatch(_NAME, value):
            raise SettingsError(f"{variable}={value!r} is not a namespace name; use a value like {default}.")
        names[variable] = value
    return Settings(down_after=down_after,
                    warn_ratio=env.number("EVACUATION_WARN_RATIO", 0.8, minimum=0.01, maximum=1.0),
                    namespaces=env.names("EVACUATION_NAMESPACES"),
                    exclude_namespaces=env.names("EVACUATION_EXCLUDE_NAMESPACES"),
                    longhorn_namespace=names["LONGHORN_NAMESPACE"],
                    harvester_namespace=names["HARVESTER_NAMESPACE"],
                    finding_renew_after=env.duration("FINDING_RENEW_AFTER", "15m"),
                    rescan=rescan_settings.load(environ))

"""vmi-cleanup's settings: every environment variable it reads, read once at start-up into a frozen value."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared import kubevirt as kv
from shared import rescan as rescan_settings
from shared.settings import Env, in_scope

FUNCTION = "vmi-cleanup"

# How the phases this function acts on appear in an object's JSON (the raw-bytes pre-check).
_SUCCEEDED_TOKENS = (b'"Succeeded"',)
_FAILED_TOKENS = (b'"Succeeded"', b'"Failed"')


@dataclass(frozen=True)
class Settings:
    cleanup_after: timedelta = timedelta(minutes=10)
    cleanup_failed: bool = False
    dry_run: bool = False
    namespaces: frozenset[str] = frozenset()
    exclude_namespaces: frozenset[str] = frozenset()
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)

    @property
    def phases(self) -> tuple[str, ...]:
        return kv.FINAL_PHASES if self.cleanup_failed else ("Succeeded",)

    @property
    def phase_tokens(self) -> tuple[bytes, ...]:
        """How the phases this function acts on appear in an object's JSON."""
        return _FAILED_TOKENS if self.cleanup_failed else _SUCCEEDED_TOKENS


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from an environment mapping; a bad value raises SettingsError naming the variable."""
    env = Env(environ)
    return Settings(cleanup_after=env.duration("CLEANUP_AFTER", "10m"),
                    cleanup_failed=env.boolean("CLEANUP_FAILED", False),
                    dry_run=env.boolean("CLEANUP_DRY_RUN", False),
                    namespaces=env.names("CLEANUP_NAMESPACES"),
                    exclude_namespaces=env.names("CLEANUP_EXCLUDE_NAMESPACES"),
                    rescan=rescan_settings.load(environ))

"""vmi-cleanup's settings: every environment variable it reads, read once at start-up into a frozen value."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from functions.vmi_cleanup.declaration import (
    CLEANUP_AFTER,
    CLEANUP_DRY_RUN,
    CLEANUP_EXCLUDE_NAMESPACES,
    CLEANUP_FAILED,
    CLEANUP_INTENTS,
    CLEANUP_NAMESPACES,
    DECLARATION,
)
from shared import kubevirt as kv
from shared import rescan as rescan_settings
from shared.settings import checked, in_scope

FUNCTION = DECLARATION.name

# How the phases this function acts on appear in an object's JSON (the raw-bytes pre-check).
_SUCCEEDED_TOKENS = (b'"Succeeded"',)
_FAILED_TOKENS = (b'"Succeeded"', b'"Failed"')


@dataclass(frozen=True)
class Settings:
    # The defaults are the declaration's (declaration.py), read as the environment is.
    cleanup_after: timedelta = CLEANUP_AFTER.value
    cleanup_failed: bool = CLEANUP_FAILED.value
    dry_run: bool = CLEANUP_DRY_RUN.value
    namespaces: frozenset[str] = CLEANUP_NAMESPACES.value
    exclude_namespaces: frozenset[str] = CLEANUP_EXCLUDE_NAMESPACES.value
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS
    intents: tuple[str, str] = CLEANUP_INTENTS.value  # where a DELETE's intent is kept before it is sent (intents.py)

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
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    return Settings(cleanup_after=CLEANUP_AFTER.read(environ),
                    cleanup_failed=CLEANUP_FAILED.read(environ),
                    dry_run=CLEANUP_DRY_RUN.read(environ),
                    namespaces=CLEANUP_NAMESPACES.read(environ),
                    exclude_namespaces=CLEANUP_EXCLUDE_NAMESPACES.read(environ),
                    rescan=rescan_settings.load(environ),
                    intents=CLEANUP_INTENTS.read(environ))

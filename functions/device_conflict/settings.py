"""device-conflict's settings: the one environment variable it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared.settings import Env

FUNCTION = "device-conflict"


@dataclass(frozen=True)
class Settings:
    # How long after a VMI starts running its updates are still worth a look: a conflict it causes
    # is found at once (it took the device when it started); later updates of a long-running VMI
    # (guest agent, interfaces) cannot start one, and the re-scan covers any event that was missed.
    recent_start: timedelta = timedelta(minutes=5)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return cls(recent_start=Env(environ).duration("CONFLICT_RECENT_START", "5m"))


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from this environment; a bad value raises SettingsError naming the variable."""
    return Settings.from_env(environ)

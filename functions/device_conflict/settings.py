"""device-conflict's settings: the environment variables it reads, read once at start-up."""
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
    # FINDING_RENEW_AFTER: an open conflict's Event is rewritten by the re-scan once its last write is this
    # old, so it outlives kube-apiserver's --event-ttl (1 h by default) while the conflict lasts (shared/findings.py)
    finding_renew_after: timedelta = timedelta(minutes=15)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        return cls(recent_start=env.duration("CONFLICT_RECENT_START", "5m"),
                   finding_renew_after=env.duration("FINDING_RENEW_AFTER", "15m"))


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from this environment; a bad value raises SettingsError naming the variable."""
    return Settings.from_env(environ)

"""device-conflict's settings: the environment variables it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from functions.device_conflict.declaration import (
    CONFLICT_RECENT_START,
    DECLARATION,
    DEVICE_ASSIGNMENTS,
    DEVICE_REPAIR_EVERY,
)
from shared.settings import checked

FUNCTION = DECLARATION.name
FINDING_RENEW_AFTER = DECLARATION.setting("FINDING_RENEW_AFTER")


@dataclass(frozen=True)
class Settings:
    # How long after a VMI starts running its updates are still worth a look: a conflict it causes
    # is found at once (it took the device when it started); later updates of a long-running VMI
    # (guest agent, interfaces) cannot start one, and the re-scan covers any event that was missed.
    recent_start: timedelta = CONFLICT_RECENT_START.value
    # FINDING_RENEW_AFTER: an open conflict's Event is rewritten by the re-scan once its last write is this
    # old, so it outlives kube-apiserver's --event-ttl (1 h by default) while the conflict lasts (shared/ledger.py)
    finding_renew_after: timedelta = FINDING_RENEW_AFTER.value
    # The parameter object (namespace, name): which VM each device is assigned to (assignment.py). The
    # ValidatingAdmissionPolicyBinding of deploy/components/prevent names the same object in its paramRef,
    # and deploy/base grants the function this one ConfigMap.
    assignments: tuple[str, str] = DEVICE_ASSIGNMENTS.value
    # DEVICE_REPAIR_EVERY: a tick is a full repair (every VM and VMI listed, the whole parameter object rewritten)
    # once the object's vmevents.io/repaired-at is this old, or when the object is missing; the ticks between
    # read only the VMs the object's contested entries and the open findings name (handler.rescan).
    repair_every: timedelta = DEVICE_REPAIR_EVERY.value

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        where = DEVICE_ASSIGNMENTS.read(environ)
        assert where is not None, "not optional"
        return cls(recent_start=CONFLICT_RECENT_START.read(environ),
                   finding_renew_after=FINDING_RENEW_AFTER.read(environ), assignments=where,
                   repair_every=DEVICE_REPAIR_EVERY.read(environ))


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from this environment; a bad value raises SettingsError naming the variable."""
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    return Settings.from_env(environ)

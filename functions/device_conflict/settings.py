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
    # old, so it outlives kube-apiserver's --event-ttl (1 h by default) while the conflict lasts (shared/ledger.py)
    finding_renew_after: timedelta = timedelta(minutes=15)
    # The parameter object (namespace, name): which VM each device is assigned to (assignment.py). The
    # ValidatingAdmissionPolicyBinding of deploy/components/prevent names the same object in its paramRef,
    # and deploy/base grants the function this one ConfigMap.
    assignments: tuple[str, str] = ("vmevents", "vmevents-device-assignments")
    # DEVICE_REPAIR_EVERY: a tick is a full repair (every VM and VMI listed, the whole parameter object rewritten)
    # once the object's vmevents.io/repaired-at is this old, or when the object is missing; the ticks between
    # read only the VMs the object's contested entries and the open findings name (handler.rescan).
    repair_every: timedelta = timedelta(minutes=15)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        where = env.object_ref("DEVICE_ASSIGNMENTS", "vmevents/vmevents-device-assignments")
        assert where is not None, "not optional"
        return cls(recent_start=env.duration("CONFLICT_RECENT_START", "5m"),
                   finding_renew_after=env.duration("FINDING_RENEW_AFTER", "15m"), assignments=where,
                   repair_every=env.duration("DEVICE_REPAIR_EVERY", "15m"))


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from this environment; a bad value raises SettingsError naming the variable."""
    return Settings.from_env(environ)

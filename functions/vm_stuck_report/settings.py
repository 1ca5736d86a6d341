"""vm-stuck-report's settings: every environment variable it reads, read once at start-up."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from functions.vm_stuck_report.declaration import (
    DECLARATION,
    VM_STUCK_AFTER,
    VM_STUCK_AFTER_BY_STATE,
    VM_STUCK_EXCLUDE_NAMESPACES,
    VM_STUCK_NAMESPACES,
)
from shared import rescan as rescan_settings
from shared.settings import SettingsError, checked, in_scope, parse_duration

FINDING_RENEW_AFTER = DECLARATION.setting("FINDING_RENEW_AFTER")
LONGHORN_NAMESPACE = DECLARATION.setting("LONGHORN_NAMESPACE")

# The states a VM (its status.printableStatus) or a migration (its VMIM's phase) can be stuck in, and how long
# each may last before it is reported. The words are KubeVirt's (staging/src/kubevirt.io/api/core/v1/types.go
# VirtualMachinePrintableStatus, v1.3.1 and v1.8.3; VirtualMachineInstanceMigrationPhase); the defaults are no
# shorter than KubeVirt's own alerts' `for:` (pkg/monitoring/rules/alerts/vms.go, v1.8.3:
# VirtualMachineStuckInUnhealthyState 10m, VirtualMachineStuckOnNode 5m), docs/facts.md §7.
STARTING = ("Starting", "Provisioning", "WaitingForVolumeBinding", "ErrorUnschedulable", "ErrorPvcNotFound",
            "DataVolumeError", "ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff")
STOPPING = ("Stopping",)
TERMINATING = ("Terminating",)
MIGRATING = ("Migrating",)
MIGRATION_PHASES = ("Pending", "Scheduling")  # a VMIM in one of these: its target pod is not running yet
GROUPS: dict[str, str] = {**{s: "starting" for s in STARTING}, **{s: "stopping" for s in STOPPING},
                          **{s: "terminating" for s in TERMINATING}, **{s: "migrating" for s in MIGRATING},
                          **{f"Migration{p}": "migrating" for p in MIGRATION_PHASES}}
_VERBS = {"starting": "start", "stopping": "stop", "terminating": "terminate", "migrating": "migrate"}
DEFAULT_AFTER: timedelta = VM_STUCK_AFTER.value
DEFAULT_THRESHOLDS: dict[str, timedelta] = {
    **{s: DEFAULT_AFTER for s in GROUPS},
    "Migrating": timedelta(minutes=30),  # no KubeVirt alert; a large guest's migration may legitimately run long
}
OPT_OUT = "vmevents.io/vm-stuck-report"  # annotation on a VM: "skip" (or "false") means never report it


@dataclass(frozen=True)
class Settings:
    # VM_STUCK_AFTER: how long any state may last (default 10m); VM_STUCK_AFTER_BY_STATE: per state, e.g.
    # "Stopping=15m,MigrationPending=20m" (the state words above)
    thresholds: Mapping[str, timedelta] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    namespaces: frozenset[str] = VM_STUCK_NAMESPACES.value          # empty: every namespace
    exclude_namespaces: frozenset[str] = VM_STUCK_EXCLUDE_NAMESPACES.value
    longhorn_namespace: str = LONGHORN_NAMESPACE.value              # where Longhorn's Volumes live
    # FINDING_RENEW_AFTER: the re-scan rewrites an open finding's Event once its last write is this old, so it
    # outlives kube-apiserver's --event-ttl (1 h by default) while the VM stays stuck (shared/ledger.py)
    finding_renew_after: timedelta = FINDING_RENEW_AFTER.value
    rescan: rescan_settings.Settings = rescan_settings.Settings()  # RESCAN_BUDGET, RESCAN_WORKERS

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)

    def threshold(self, state: str) -> timedelta:
        return self.thresholds.get(state, DEFAULT_AFTER)


def _by_state(text: str, base: timedelta) -> dict[str, timedelta]:
    thresholds = {state: max(base, DEFAULT_THRESHOLDS[state]) if state == "Migrating" else base for state in GROUPS}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        state, _, value = part.partition("=")
        state = state.strip()
        if state not in GROUPS:
            raise SettingsError(f"VM_STUCK_AFTER_BY_STATE names {state!r}, not a state this function watches; use "
                                f"one of {', '.join(GROUPS)} (e.g. 'Stopping=15m').")
        try:
            thresholds[state] = parse_duration(value.strip())
        except ValueError:
            raise SettingsError(f"VM_STUCK_AFTER_BY_STATE: {state}={value.strip()!r} is not a duration; use a value "
                                f"like 10m.") from None
        if thresholds[state] <= timedelta(0):
            raise SettingsError(f"VM_STUCK_AFTER_BY_STATE: {state}=0s would report every VM as it begins to "
                                f"{_VERBS[GROUPS[state]]}; use a value like 10m.")
    return thresholds


def load(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment; a bad value raises SettingsError naming the variable."""
    checked(DECLARATION.name, DECLARATION.settings, environ)  # every wrong one at once
    base = VM_STUCK_AFTER.read(environ)
    if base <= timedelta(0):
        raise SettingsError("VM_STUCK_AFTER=0s would report every VM as it begins to start or stop; use a value "
                            "like 10m (KubeVirt's own alerts wait 5m to 10m).")
    namespace = LONGHORN_NAMESPACE.read(environ)
    # Unset, every state takes VM_STUCK_AFTER and Migrating at least its 30m: what the declared default writes out.
    by_state = environ.get(VM_STUCK_AFTER_BY_STATE.name, "").strip()
    return Settings(thresholds=_by_state(by_state, base),
                    namespaces=VM_STUCK_NAMESPACES.read(environ),
                    exclude_namespaces=VM_STUCK_EXCLUDE_NAMESPACES.read(environ),
                    longhorn_namespace=namespace,
                    finding_renew_after=FINDING_RENEW_AFTER.read(environ),
                    rescan=rescan_settings.load(environ))

"""Which category of finding becomes which alert: its name, the severity used when the finding carries
none, and its runbook's anchor in README. Generated from each producer's functions/<name>/declaration.py
(its `alerts`) by `make generate` (catalog/alerts.py): edit the declaration, never this file."""

CATEGORIES: dict[str, tuple[str, str, str]] = {
    # vmi-cleanup (docs/vmi-cleanup.md)
    "vmi-cleaned-up": ("VMICleanedUp", "info", "vmicleanedup"),
    # device-conflict (docs/device-conflict.md)
    "taken-while-stopped": ("VMHostDeviceConflict", "warning", "vmhostdeviceconflict"),
    "start-blocked": ("VMHostDeviceConflict", "warning", "vmhostdeviceconflict"),
    "double-assigned": ("VMHostDeviceConflict", "warning", "vmhostdeviceconflict"),
    # migration-report (docs/migration-report.md)
    "completion-timeout": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "progress-stall": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "target-unschedulable": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "target-pod-removed": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "vmi-shutdown": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "aborted": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "libvirt-error": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "unknown": ("VMMigrationFailed", "warning", "vmmigrationfailed"),
    "near-timeout": ("VMMigrationNearTimeout", "warning", "vmmigrationneartimeout"),
    # io-pause-report (docs/io-pause-report.md)
    "rebuild-related": ("VMPausedOnIOError", "critical", "vmpausedonioerror"),
    "out-of-space": ("VMPausedOnIOError", "critical", "vmpausedonioerror"),
    "stuck-paused": ("VMPausedOnIOError", "critical", "vmpausedonioerror"),
    "unknown-storage": ("VMPausedOnIOError", "critical", "vmpausedonioerror"),
    "storage-error": ("VMPausedOnIOError", "critical", "vmpausedonioerror"),
    # vm-stuck-report (docs/vm-stuck-report.md)
    "stuck-starting": ("VMStuck", "warning", "vmstuck"),
    "stuck-stopping": ("VMStuck", "warning", "vmstuck"),
    "stuck-terminating": ("VMStuck", "warning", "vmstuck"),
    "stuck-migrating": ("VMStuck", "warning", "vmstuck"),
    # evacuation-report (docs/evacuation-report.md)
    "node-drain": ("NodeEvacuation", "warning", "nodeevacuation"),
    "node-down": ("NodeDown", "critical", "nodedown"),
}

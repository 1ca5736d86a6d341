"""migration-report, declared once (shared/declaration.py): deploy/base/migration-report.yaml, the chart's values,
docs/migration-report.md's settings, README's table and alert-forwarder's table are generated from it."""
from shared.declaration import (
    FINDING_RENEW_AFTER,
    RESCAN_BUDGET,
    RESCAN_WORKERS,
    Alert,
    Duration,
    Function,
    Grant,
    Identity,
    Names,
    Number,
    ObjectRef,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

CURSOR = "vmevents-migration-report-cursor"  # the cursor ConfigMap's name (MIGRATION_CURSOR's default)

MIGRATION_WARN_RATIO = Setting("MIGRATION_WARN_RATIO", "0.8", "report a succeeded migration that used at least "
                               "this share of its completion budget (0.01–1)", Number(0.01, 1.0))
MIGRATION_REPORT_WITHIN = Setting("MIGRATION_REPORT_WITHIN", "30m", "consider migrations that ended at most this "
                                  "long ago", Duration())
MIGRATION_RESOLVED_AFTER = Setting(
    "MIGRATION_RESOLVED_AFTER", "6h", "a reported migration's finding ends this long after it was reported, unless a "
    "later migration of the VMI ended, or the VMI went away or was restarted, first", Duration(),
    why="a reported migration's finding ends this long after (docs/findings.md)")
MIGRATION_NAMESPACES = Setting("MIGRATION_NAMESPACES", "", "comma-separated namespaces to report in (empty: all)",
                               Names())
MIGRATION_EXCLUDE_NAMESPACES = Setting("MIGRATION_EXCLUDE_NAMESPACES", "", "comma-separated namespaces never to "
                                       "report in", Names())
MIGRATION_CURSOR = Setting(
    "MIGRATION_CURSOR", f"vmevents/{CURSOR}", "the ConfigMap (namespace/name) where a re-scan keeps how far it has "
    "read the VMIMs' changes; its Role names it. Empty: every tick lists every VMIM", ObjectRef(optional=True),
    why="Where a re-scan keeps how far it has read the VMIMs' changes (namespace/name; empty: every tick lists every "
        "VMIM instead). The Role above names it.")
MIGRATION_SETTLE_EVERY = Setting(
    "MIGRATION_SETTLE_EVERY", "5m", "with a cursor, a tick whose changes hold no migration worth a look reads the "
    "findings on record (to resolve them, renew their Events, and report again one whose Event was lost) only this "
    "often; `0s`: every tick. At most `30m`", Duration(),
    why="With a cursor, a tick whose changes need no look reads the findings on record (resolve, renew, report a "
        "lost one again) only this often; 0s: every tick (docs/api-cost.md). At most 30m.")

DECLARATION = Function(
    name="migration-report",
    summary="explains every failed or nearly timed-out live migration with KubeVirt's own numbers, and what to change",
    about="migration-report: explains every failed or nearly timed-out live migration with KubeVirt's own numbers. "
          "Least privilege: read migrations (and watch them: a re-scan reads only what changed since its cursor), "
          "VMIs, VMs, the KubeVirt CR, MigrationPolicies and namespaces; list Events (KubeVirt's, and its own to "
          "know what it already reported) and record its own (a ClusterRole of its own, bound where "
          "MIGRATION_NAMESPACES lets it report). It changes no object of KubeVirt's. Its one other write is its "
          "cursor: get and update of that one ConfigMap, create in its namespace only (RBAC cannot name what a "
          "create makes).",
    service=Service(
        scale=Scale(0, 3, "Scale to zero when idle: migrations are rare and the broker holds an event through a cold "
                          "start. At most 3 pods: an update of a migration under way needs no API call, and the bound "
                          "caps what a burst of final migrations can send to the API server."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker): one request per thread.",
        resources=Resources("50m", "128Mi", "256Mi",
                            "The same stack as vmi-cleanup (about 104 MiB RSS, most of it the kubernetes client): "
                            "request that plus a quarter; the limit leaves room for a re-scan page of VMIMs. No CPU "
                            "limit.")),
    trigger=Trigger(
        "VMIM adds and updates (from the vmevents-migrations ApiServerSource) and the periodic tick. Filters see "
        "attributes only, so every VMIM update arrives; the function answers those of unfinished migrations without "
        "calling the API.",
        on=(On(("VirtualMachineInstanceMigration",), ("add", "update")),)),
    settings=(MIGRATION_WARN_RATIO, MIGRATION_REPORT_WITHIN, MIGRATION_RESOLVED_AFTER, FINDING_RENEW_AFTER,
              MIGRATION_NAMESPACES, MIGRATION_EXCLUDE_NAMESPACES, RESCAN_BUDGET, RESCAN_WORKERS, MIGRATION_CURSOR,
              MIGRATION_SETTLE_EVERY),
    grants=(
        Grant(rules=(
            Rule("kubevirt.io", ("virtualmachineinstancemigrations",), ("get", "list", "watch")),
            Rule("kubevirt.io", ("virtualmachineinstances", "virtualmachines"), ("get",)),
            Rule("kubevirt.io", ("kubevirts",), ("list",)),
            Rule("migrations.kubevirt.io", ("migrationpolicies",), ("list",)),
            Rule("", ("namespaces",), ("get",)),
            Rule("", ("events",), ("list",),
                 note="its findings on record, everywhere (a re-scan settles them); KubeVirt's, by involved uid"))),
        Grant(suffix="act", scoped_by="MIGRATION_NAMESPACES",
              why="What it writes: its Events (a finding's on the VMIM, VMI and VM, all in the migration's namespace; "
                  "read back by name before a write, hence get). Bound everywhere here, as MIGRATION_NAMESPACES is "
                  "empty (every namespace). An install that sets MIGRATION_NAMESPACES binds it with one RoleBinding "
                  "per namespace in the list instead, and no ClusterRoleBinding: deploy/overlays/scoped-migration-"
                  "report shows how, and tests/deploy checks that every overlay's bindings match its setting "
                  "(docs/migration-report.md, RBAC).",
              rules=(Rule("", ("events",), ("create", "get", "patch")),)),
        Grant(suffix="cursor", namespaced=True,
              rules=(Rule("", ("configmaps",), ("create",)),
                     Rule("", ("configmaps",), ("get", "update"), names=(CURSOR,))))),
    alerts=(Alert("VMMigrationFailed", "warning",
                  ("completion-timeout", "progress-stall", "target-unschedulable", "target-pod-removed",
                   "vmi-shutdown", "aborted", "libvirt-error", "unknown")),
            Alert("VMMigrationNearTimeout", "warning", ("near-timeout",))),
    identity=Identity("the VMIM", "the VMIM's uid", "`namespace`, `vm` (the migrated VMI's name), `migration` (the "
                      "VMIM's name)", categories="the report's category (`near-timeout` for a success)"),
    replies=("detected", "resolved", "scanned"),
    reasons=("MigrationFailed", "MigrationNearTimeout", "MigrationReport", "MigrationReportResolved"),
)

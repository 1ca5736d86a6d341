"""vm-stuck-report, declared once (shared/declaration.py): deploy/base/vm-stuck-report.yaml, the chart's values,
docs/vm-stuck-report.md's settings, README's table and alert-forwarder's table are generated from it."""
from dataclasses import replace

from shared.declaration import (
    FINDING_RENEW_AFTER,
    LONGHORN_NAMESPACE,
    RESCAN_BUDGET,
    RESCAN_WORKERS,
    Alert,
    Custom,
    Duration,
    Function,
    Grant,
    Identity,
    Names,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

VM_STUCK_AFTER = Setting(
    "VM_STUCK_AFTER", "10m", "how long a state may last before it is reported (more than 0s)", Duration(),
    why="how long a state may last before it is reported; no shorter than KubeVirt's own alerts "
        "(VirtualMachineStuckInUnhealthyState 10m, VirtualMachineStuckOnNode 5m; docs/facts.md §7)")
VM_STUCK_AFTER_BY_STATE = Setting(
    "VM_STUCK_AFTER_BY_STATE", "Migrating=30m", "per state, e.g. `Stopping=15m,MigrationPending=20m`; the states are "
    "the words in the table above", Custom("state=duration, comma-separated"))
VM_STUCK_NAMESPACES = Setting("VM_STUCK_NAMESPACES", "", "comma-separated namespaces to look at (empty: all)",
                              Names(), why="which namespaces to look at (empty: every one), and which never")
VM_STUCK_EXCLUDE_NAMESPACES = Setting("VM_STUCK_EXCLUDE_NAMESPACES", "", "namespaces never looked at", Names())

DECLARATION = Function(
    name="vm-stuck-report",
    summary="when a VM stays starting, stopping or migrating too long, names the one cause the cluster shows "
            "(scheduling, volume, image, node, quota), its evidence and the next step",
    about="vm-stuck-report: when a VM stays starting, stopping, terminating or migrating past its threshold, names "
          "one cause with its evidence and one next step (or says it is unknown and what was checked). Read-only: "
          "it reads VMs, VMIs and migrations, the KubeVirt CR, the launcher and target pods, nodes, PVCs, PVs, "
          "StorageClasses, ResourceQuotas, Longhorn volumes and CDI DataVolumes, reads and records Events, and "
          "changes nothing else.",
    service=Service(
        scale=Scale(0, 3, "Scale to zero when idle: a cold start only delays an event, the broker holds it. At most 3 "
                          "pods: VM updates that name no stuck state (nearly all) need no API call, and the bound caps "
                          "what a burst of VMs beginning to start can send to the API server."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker): one request per thread, so "
                        "the queue-proxy never queues inside the process and the autoscaler adds a pod instead.",
        resources=Resources("50m", "128Mi", "256Mi",
                            "As io-pause-report (the same image and client; make bench measures about 105 MiB RSS "
                            "after the load): request 128Mi, limit 256Mi for a re-scan page decoded at once. No CPU "
                            "limit: throttling would only delay answers.")),
    trigger=Trigger(
        "VM and migration adds and updates (the function answers every update that names no stuck state without an "
        "API call) and the periodic tick, which finds VMs stuck past their threshold and VMs that settled.",
        on=(On(("VirtualMachine", "VirtualMachineInstanceMigration"), ("add", "update")),)),
    settings=(VM_STUCK_AFTER, VM_STUCK_AFTER_BY_STATE, VM_STUCK_NAMESPACES, VM_STUCK_EXCLUDE_NAMESPACES,
              LONGHORN_NAMESPACE,
              replace(FINDING_RENEW_AFTER, doc="the re-scan rewrites an open finding's Event once its last write is "
                                               "this old"),
              RESCAN_BUDGET, RESCAN_WORKERS),
    grants=(
        Grant(rules=(
            Rule("", ("namespaces",), ("list",),
                 note="the re-scan lists VMs and VMIMs one namespace at a time, cells only (docs/api-cost.md)"),
            Rule("kubevirt.io", ("virtualmachines", "virtualmachineinstancemigrations"), ("get", "list")),
            Rule("kubevirt.io", ("virtualmachineinstances",), ("get",)),
            Rule("kubevirt.io", ("kubevirts",), ("list",),
                 why="list: the KubeVirt CR's migration limits (spec.configuration.migrations), only for a migration "
                     "held Pending past its threshold, to tell a queued one from a stuck one (docs/facts.md §7)"),
            Rule("", ("pods", "resourcequotas"), ("list",),
                 why="the launcher / migration target pod (by KubeVirt's labels; every target pod, for KubeVirt's "
                     "migration queue), and a namespace's quotas"),
            Rule("", ("nodes",), ("get", "list"),
                 why="get: the VMI's node; list: which nodes have a device resource at all (only for an Insufficient "
                     "device)"),
            Rule("", ("persistentvolumeclaims", "persistentvolumes"), ("get",)),
            Rule("storage.k8s.io", ("storageclasses",), ("get",)),
            Rule("longhorn.io", ("volumes",), ("get",)),
            Rule("cdi.kubevirt.io", ("datavolumes",), ("get",),
                 why="a VM KubeVirt prints Provisioning or DataVolumeError has no VMI yet: its DataVolumes say since "
                     "when and why"),
            Rule("", ("events",), ("list", "create", "get", "patch"),
                 why="list: the scheduler's, the kubelet's and KubeVirt's Events, device-conflict's findings and its "
                     "own; create/get/patch: record its finding (a sighting raises its count)")),),),
    alerts=(Alert("VMStuck", "warning", ("stuck-starting", "stuck-stopping", "stuck-terminating", "stuck-migrating")),),
    identity=Identity("the VM", "the stuck instance: the VMIM's uid; else the DataVolume's (Provisioning, "
                                "DataVolumeError); else the VM's (Terminating, a crash loop); else the VMI's",
                      "`namespace`, `vm`, `state` (the group: starting, stopping, terminating, migrating)",
                      categories="`stuck-<group>`"),
    replies=("detected", "resolved", "batch", "scanned"),
    reasons=("VMStuck", "VMStuckResolved"),
)

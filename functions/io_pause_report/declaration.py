"""io-pause-report, declared once (shared/declaration.py): deploy/base/io-pause-report.yaml, the chart's values,
docs/io-pause-report.md's settings, README's table and alert-forwarder's table are generated from it."""
from dataclasses import replace

from shared.declaration import (
    FINDING_RENEW_AFTER,
    LONGHORN_NAMESPACE,
    RESCAN_BUDGET,
    RESCAN_WORKERS,
    Alert,
    Duration,
    Function,
    Grant,
    Identity,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

IO_PAUSE_STUCK_AFTER = Setting("IO_PAUSE_STUCK_AFTER", "10m", "a VMI paused this long is `stuck-paused` (KubeVirt's "
                               "backoff is at most 3 min)", Duration())
IO_PAUSE_RESOLVED_AFTER = Setting("IO_PAUSE_RESOLVED_AFTER", "10m", "a VMI running this long without a pause ends "
                                  "its episode", Duration())

DECLARATION = Function(
    name="io-pause-report",
    summary="reports a VM flapping Running↔Paused on IO errors, tied to its Longhorn volume and rebuild, once per "
            "episode",
    about="io-pause-report: catches a VM flapping Running<->Paused on IO errors (Paused/PausedIOError) and ties it to "
          "its Longhorn volume and that volume's rebuild. Read-only: it reads VMIs, PVCs, PVs, Longhorn volumes and "
          "engines, reads and records Events, and changes nothing else.",
    service=Service(
        scale=Scale(0, 3, "Scale to zero when idle: a cold start (about 1 s, make bench) only delays an event, the "
                          "broker holds it. At most 3 pods: updates not about an IO-error pause (nearly all) need no "
                          "API call, and the bound caps what a burst of pausing VMs can send to the API server."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker): one request per thread, so "
                        "the queue-proxy never queues inside the process and the autoscaler adds a pod instead.",
        resources=Resources("50m", "128Mi", "256Mi",
                            "Measured (make bench): 105 MiB RSS after the load (gunicorn master + worker; the "
                            "kubernetes client is most of it), 64 MiB for a no-op. Request 128Mi = the measure plus a "
                            "fifth; limit 256Mi leaves room for a re-scan page of VMIs decoded at once. No CPU limit: "
                            "throttling would only delay answers.")),
    trigger=Trigger(
        "VMI adds and updates (the function answers every update that does not mention PausedIOError without an API "
        "call) and the periodic tick, which finds stuck pauses and ended episodes.",
        on=(On(("VirtualMachineInstance",), ("add", "update")),)),
    settings=(IO_PAUSE_STUCK_AFTER, IO_PAUSE_RESOLVED_AFTER,
              replace(FINDING_RENEW_AFTER, doc="the re-scan rewrites an open episode's Event once its last write is "
                                               "this old (keep it, plus the re-scan period, well under `--event-ttl`)"),
              replace(LONGHORN_NAMESPACE, doc="where the Longhorn Volumes and Engines are"),
              RESCAN_BUDGET, RESCAN_WORKERS),
    grants=(
        Grant(rules=(
            Rule("", ("namespaces",), ("list",),
                 note="the re-scan lists VMIs one namespace at a time, cells only (docs/api-cost.md)"),
            Rule("kubevirt.io", ("virtualmachineinstances",), ("get", "list")),
            Rule("", ("persistentvolumeclaims", "persistentvolumes"), ("get",)),
            Rule("longhorn.io", ("volumes",), ("get",)),
            Rule("longhorn.io", ("engines",), ("list",)),
            Rule("", ("events",), ("list", "create", "get", "patch"),
                 why="list: KubeVirt's IOerror Events (volume, number of pauses) and its own episode Events; "
                     "create/get/patch: record them (the same Event again raises its count).")),),),
    alerts=(Alert("VMPausedOnIOError", "critical",
                  ("rebuild-related", "out-of-space", "stuck-paused", "unknown-storage", "storage-error")),),
    identity=Identity("the VMI", "the VMI's uid", "`namespace`, `vm` (the paused VMI's name), `volume` (its PVCs, "
                      "sorted, comma-separated)", categories="the category the episode opened with"),
    replies=("detected", "resolved", "scanned"),
    reasons=("IOErrorPause", "IOErrorPauseResolved"),
)

"""vmi-cleanup, declared once (shared/declaration.py): deploy/base/vmi-cleanup.yaml, the chart's and the Add-on's
values, docs/vmi-cleanup.md's settings and README's table are generated from it (`make generate`)."""
from shared.declaration import (
    RESCAN_BUDGET,
    RESCAN_WORKERS,
    Alert,
    Boolean,
    Duration,
    Function,
    Grant,
    Identity,
    Names,
    ObjectRef,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

CLEANUP_AFTER = Setting("CLEANUP_AFTER", "10m", "how long a VMI stays after it ended before it is cleaned up: a "
                        "duration such as `0s`, `90s`, `10m`, `2h`, `1d`", Duration(), addon=True)
CLEANUP_FAILED = Setting("CLEANUP_FAILED", "false", "also clean up `Failed` VMIs (off by default: they hold crash "
                         "evidence)", Boolean())
CLEANUP_DRY_RUN = Setting("CLEANUP_DRY_RUN", "false", "decide and report (Event, reply), change nothing",
                          Boolean(), addon=True)
CLEANUP_NAMESPACES = Setting("CLEANUP_NAMESPACES", "", "comma-separated namespaces to act in (empty: all)", Names())
CLEANUP_EXCLUDE_NAMESPACES = Setting("CLEANUP_EXCLUDE_NAMESPACES", "", "comma-separated namespaces never to act in",
                                     Names(), addon=True)
INTENTS = "vmevents-vmi-cleanup-intents"  # the intents ConfigMap's name (CLEANUP_INTENTS's default)
CLEANUP_INTENTS = Setting(
    "CLEANUP_INTENTS", f"vmevents/{INTENTS}", "the ConfigMap (namespace/name) where each DELETE's intent is kept "
    "before it is sent, so that a cleanup whose answer was lost is still announced; its Role names it", ObjectRef(),
    why="Where each DELETE's intent is kept before it is sent, so that a cleanup whose answer was lost is still "
        "announced (functions/vmi_cleanup/intents.py). The Role above names it.")

DECLARATION = Function(
    name="vmi-cleanup",
    summary="removes the VMI a guest left behind in phase `Succeeded` when it powered itself off, without ever "
            "restarting the VM",
    about="vmi-cleanup: removes the VMI that a guest left behind in phase Succeeded when it powered itself off. "
          "Least privilege: read VMIs, VMs, migrations and the KubeVirt CR; delete a VMI; patch a VM (to halt it); "
          "record Events; keep its DELETEs' intents in its own ConfigMap. Nothing else.",
    service=Service(
        scale=Scale(0, 3, "Scale to zero when idle: a cold start (about 0.7 s, make bench) only delays an event, the "
                          "broker holds it. At most 3 pods: every event is answered in about 1 ms and the irrelevant "
                          "ones (most of them) need no API call, so 3 pods carry thousands of VMI updates a second, "
                          "and the bound caps what a burst can send to the API server."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker): one request per thread, so "
                        "the queue-proxy never queues inside the process and the autoscaler adds a pod instead.",
        resources=Resources("50m", "128Mi", "256Mi",
                            "Measured (make bench): 101 MiB RSS after the load, 104 MiB idle (gunicorn master + "
                            "worker, shared pages counted twice; the kubernetes client is most of it), 64 MiB for a "
                            "no-op. Request 128Mi = the measure plus a quarter; limit 256Mi leaves room for a re-scan "
                            "page of VMIs decoded at once. No CPU limit: throttling would only delay answers.")),
    trigger=Trigger(
        "VMI adds and updates, launcher pod updates (a Completed pod names its VMI), and the periodic tick. Filters "
        "see attributes only, so every VMI update reaches the function; it answers the irrelevant ones without "
        "calling the API.",
        on=(On(("VirtualMachineInstance",), ("add", "update")), On(("Pod",), ("update",)))),
    settings=(CLEANUP_AFTER, CLEANUP_FAILED, CLEANUP_DRY_RUN, CLEANUP_NAMESPACES, CLEANUP_EXCLUDE_NAMESPACES,
              RESCAN_BUDGET, RESCAN_WORKERS, CLEANUP_INTENTS),
    grants=(
        Grant(why="What it reads, everywhere (the KubeVirt CR lives in its own namespace; namespaces are "
                  "cluster-scoped).",
              rules=(Rule("", ("namespaces",), ("list",),
                          note="the re-scan lists VMIs one namespace at a time, cells only (docs/api-cost.md)"),
                     Rule("kubevirt.io", ("virtualmachineinstances",), ("get", "list")),
                     Rule("kubevirt.io", ("virtualmachines",), ("get",)),
                     Rule("kubevirt.io", ("virtualmachineinstancemigrations",), ("list",)),
                     Rule("kubevirt.io", ("kubevirts",), ("list",)))),
        Grant(suffix="act", scoped_by="CLEANUP_NAMESPACES",
              why="What it does: delete a VMI, halt a VM, record Events. Bound everywhere here, as CLEANUP_NAMESPACES "
                  "is empty (every namespace). An install that sets CLEANUP_NAMESPACES binds it with one RoleBinding "
                  "per namespace in the list instead, and no ClusterRoleBinding: deploy/overlays/scoped-cleanup shows "
                  "how, and tests/deploy checks that every overlay's bindings match its setting "
                  "(docs/vmi-cleanup.md, RBAC).",
              rules=(Rule("kubevirt.io", ("virtualmachineinstances",), ("delete",)),
                     Rule("kubevirt.io", ("virtualmachines",), ("patch",)),
                     Rule("", ("events",), ("create", "get", "patch", "list"),
                          why="list: a dry run's re-scan reads back what its Events reported "
                              "(functions/vmi_cleanup/memory.py)"))),
        Grant(suffix="intents", namespaced=True,
              why="Its own ConfigMap, where each DELETE's intent is kept before it is sent "
                  "(functions/vmi_cleanup/intents.py): created when missing (RBAC cannot name what a create makes: "
                  "deploy/components/own-configmaps refuses any other name), then read and patched by name. The name "
                  "is CLEANUP_INTENTS's: change them together.",
              rules=(Rule("", ("configmaps",), ("create",)),
                     Rule("", ("configmaps",), ("get", "patch"), names=(INTENTS,))))),
    alerts=(Alert("VMICleanedUp", "info", ("vmi-cleaned-up",)),),
    identity=Identity("the VMI", "its uid and the effect", "`namespace`, `vm` (the VM, or the standalone VMI)",
                      state="reported"),
    replies=("cleaned", "scanned"),
    reasons=("VMICleanedUp", "VMICleanupDryRun", "VMICleanupAnnotationInvalid"),
)

"""evacuation-report, declared once (shared/declaration.py): deploy/base/evacuation-report.yaml, the chart's values,
docs/evacuation-report.md's settings, README's table and alert-forwarder's table are generated from it."""
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
    Names,
    Namespace,
    Number,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

EVACUATION_DOWN_AFTER = Setting(
    "EVACUATION_DOWN_AFTER", "1m", "how long `Ready` may be other than `True` before the node is reported as down "
    "(at most 1h)", Duration(),
    why="how long a node may be NotReady or unreachable before its VMs are reported; the node lifecycle controller "
        "already waits its 40 s grace period, and Harvester 1.7 taints an unreachable node after 15 s "
        "(docs/facts.md §10)")
EVACUATION_WARN_RATIO = Setting(
    "EVACUATION_WARN_RATIO", "0.8", "a running migration that used this share of its completion budget is said to be "
    "near its timeout (0.01–1)", Number(0.01, 1.0))
EVACUATION_NAMESPACES = Setting("EVACUATION_NAMESPACES", "", "comma-separated namespaces whose VMs are listed "
                                "(empty: all)", Names(),
                                why="whose VMs a node's finding lists (empty: every namespace), and whose never")
EVACUATION_EXCLUDE_NAMESPACES = Setting("EVACUATION_EXCLUDE_NAMESPACES", "", "namespaces whose VMs are never listed",
                                        Names())
HARVESTER_NAMESPACE = Setting("HARVESTER_NAMESPACE", "harvester-system", "where Harvester's Upgrades are",
                              Namespace())

DECLARATION = Function(
    name="evacuation-report",
    summary="when a node is drained, put in maintenance, upgraded or stops answering, names each VM on it that will "
            "migrate or be shut down, and why, what its evacuation migration did, and when a dead node's VMs restart",
    about="evacuation-report: for a node being emptied (kubectl drain, KubeVirt's drain taint, Harvester's maintenance "
          "mode or upgrade) or one that stopped answering, one finding listing each VM on it: will it live-migrate or "
          "be shut down and why, what its evacuation migration did, and for a dead node what Harvester and KubeVirt "
          "will do and when, and what blocks it. Read-only: it reads Nodes, VMs, VMIs, migrations, launcher pods, "
          "the KubeVirt CR, Harvester's Settings and Upgrades, PVCs, VolumeAttachments and Longhorn volumes, reads "
          "and records Events, and changes nothing else.",
    service=Service(
        scale=Scale(0, 2, "Scale to zero when idle: a cold start only delays an event, the broker holds it. At most 2 "
                          "pods: a Node update that names no drain, maintenance or unready state (nearly all) needs "
                          "no API call, and a cluster has tens of nodes."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker): one request per thread, so "
                        "the queue-proxy never queues inside the process and the autoscaler adds a pod instead.",
        resources=Resources("50m", "128Mi", "256Mi",
                            "As vm-stuck-report (the same image and client): request 128Mi, limit 256Mi for a node's "
                            "VMIs decoded at once. No CPU limit: throttling would only delay answers.")),
    trigger=Trigger(
        "Node adds, updates and deletes (the function answers every update that names no cordon, drain taint, "
        "maintenance or unready state without an API call), evacuation migrations, and the periodic tick, which "
        "finds every node being emptied or down and ends what settled.",
        on=(On(("Node",), ("add", "update", "delete")),
            On(("VirtualMachineInstanceMigration",), ("add", "update")))),
    settings=(EVACUATION_DOWN_AFTER, EVACUATION_WARN_RATIO, EVACUATION_NAMESPACES, EVACUATION_EXCLUDE_NAMESPACES,
              LONGHORN_NAMESPACE, HARVESTER_NAMESPACE,
              replace(FINDING_RENEW_AFTER, doc="the re-scan rewrites an open finding's Event once its last write is "
                                               "this old"),
              RESCAN_BUDGET, RESCAN_WORKERS),
    grants=(
        Grant(rules=(
            Rule("", ("nodes",), ("get", "list"), why="the node, fresh; the re-scan lists every node (cached)"),
            Rule("kubevirt.io", ("virtualmachineinstances",), ("get", "list"),
                 why="the VMIs on a node (by KubeVirt's kubevirt.io/nodeName label), and one that left it"),
            Rule("kubevirt.io", ("virtualmachines",), ("get",), why="a VM's run strategy"),
            Rule("kubevirt.io", ("virtualmachineinstancemigrations",), ("get", "list"),
                 why="a namespace's migration rows (Table, cached), then the one that matters in full"),
            Rule("kubevirt.io", ("kubevirts",), ("list",), why="the cluster's eviction strategy and migration limits"),
            Rule("harvesterhci.io", ("settings",), ("get",), why="server-version and vm-force-reset-policy"),
            Rule("harvesterhci.io", ("upgrades",), ("list",), why="an Upgrade under way and this node's step"),
            Rule("", ("pods",), ("list",), why="a down node's launcher pods still in the API"),
            Rule("", ("persistentvolumeclaims",), ("get",)),
            Rule("storage.k8s.io", ("volumeattachments",), ("list",), why="volumes still attached to a down node"),
            Rule("longhorn.io", ("volumes",), ("get",)),
            Rule("", ("events",), ("list", "create", "get", "patch"),
                 why="list: its findings on record; create/get/patch: record a node's finding (on the Node, in "
                     "default)")),),),
    alerts=(Alert("NodeEvacuation", "warning", ("node-drain",)), Alert("NodeDown", "critical", ("node-down",))),
    identity=Identity("the Node", "the node's uid", "`node`, `state` (the category: node-drain, node-down)"),
    replies=("detected", "resolved", "scanned"),
    reasons=("NodeEvacuation", "NodeEvacuationResolved", "NodeDown", "NodeDownResolved"),
)

"""device-conflict, declared once (shared/declaration.py): deploy/base/device-conflict.yaml, the chart's values,
docs/device-conflict.md's settings, README's table and alert-forwarder's table are generated from it."""
from dataclasses import replace

from shared.declaration import (
    FINDING_RENEW_AFTER,
    Alert,
    Duration,
    Function,
    Grant,
    Identity,
    ObjectRef,
    On,
    Resources,
    Rule,
    Scale,
    Service,
    Setting,
    Trigger,
)

ASSIGNMENTS = "vmevents-device-assignments"  # the parameter object's name (DEVICE_ASSIGNMENTS' default)

CONFLICT_RECENT_START = Setting(
    "CONFLICT_RECENT_START", "5m", "how long after a VMI starts running its updates are still checked (later ones "
    "cannot start a conflict; the re-scan covers missed events)", Duration())
DEVICE_ASSIGNMENTS = Setting(
    "DEVICE_ASSIGNMENTS", f"vmevents/{ASSIGNMENTS}", "the parameter object, `namespace/name`. The prevention's "
    "binding names the same object in its `paramRef`, and the Role grants exactly it: change the three together",
    ObjectRef(),
    why="The parameter object (namespace/name) the prevention's binding reads in its paramRef, and the one ConfigMap "
        "the Role below grants: change all three together.")
DEVICE_REPAIR_EVERY = Setting(
    "DEVICE_REPAIR_EVERY", "15m", "a tick is a full repair (every VM and VMI listed, the whole parameter object "
    "rewritten) once the object's `vmevents.io/repaired-at` is this old; the ticks between are light ([what the "
    "re-scan costs](#what-the-re-scan-costs)). A conflict no event reported waits at most this long plus one tick",
    Duration(),
    why="a tick lists every VM and VMI (and rewrites the whole parameter object) this often; the ticks between read "
        "only the few VMs the object's contested entries and the open findings name")

DECLARATION = Function(
    name="device-conflict",
    summary="tells the operator when a VM's passthrough device was taken by another VM",
    about="device-conflict: tells the operator when a VM's passthrough device (PCI device or vGPU) was taken by "
          "another VM. It never changes a VM. Least privilege: list VMs and VMIs (a re-scan reads them all, page by "
          "page); get VMs and VMIs (an event reads only the VMs that share a device with its VM); record Events "
          "(create; get and patch to count one again); list Events, which is how a re-scan finds the conflicts it "
          "reported and notices those that ended; patch marks one resolved. And the parameter object, which VM each "
          "device is assigned to (read by deploy/components/prevent's admission policy): get and update of that one "
          "ConfigMap, create in its namespace only (RBAC cannot name what a create makes). List VGPUDevices "
          "(harvester/pcidevices): a gpus[].name is a device only when a vGPU has it (one LIST of their names per "
          "full repair). Get and list instancetypes, cluster instancetypes and ControllerRevisions: the devices an "
          "instancetype gives a VM (a full repair lists them once when a VM names an instancetype; an event gets "
          "the revision KubeVirt recorded for its VM, else the instancetype).",
    service=Service(
        scale=Scale(0, 3, "Scale to zero when idle (a cold start only delays an event; the broker holds it). At most "
                          "3 pods: irrelevant events need no API call, and the bound caps how many cluster-wide LISTs "
                          "a burst of relevant ones can send to the API server at once."),
        concurrency_why="= THREADS in the image (gunicorn's threads in its one worker).",
        resources=Resources("50m", "128Mi", "256Mi",
                            "Measured (make bench): 105 MiB RSS after the irrelevant load, 113 MiB after relevant "
                            "events over 2,000 VMs (the index keeps only VMs with devices; one page of 250 VMs is "
                            "decoded at a time). Request 128Mi; limit 256Mi. No CPU limit: throttling only delays.")),
    trigger=Trigger(
        "VM adds and updates (the devices in the spec, the allocation annotation), VMI adds and updates (phase; "
        "PodScheduled=False/Unschedulable), and the periodic tick (a full re-scan, where conflicts end). Filters see "
        "attributes only, so every VM and VMI update reaches the function; it answers those that name no device "
        "without decoding them and without calling the API.",
        on=(On(("VirtualMachine", "VirtualMachineInstance"), ("add", "update")),
            On(("VirtualMachine",), ("delete",),
               why="A deleted VM's entries in the parameter object go with it (the admission policy reads them)."))),
    settings=(CONFLICT_RECENT_START,
              replace(FINDING_RENEW_AFTER, doc="the re-scan rewrites an open conflict's Event once its last write is "
                                               "this old (keep it, plus the re-scan period, well under `--event-ttl`)"),
              DEVICE_ASSIGNMENTS, DEVICE_REPAIR_EVERY),
    grants=(
        Grant(rules=(Rule("kubevirt.io", ("virtualmachines", "virtualmachineinstances"), ("get", "list")),
                     Rule("", ("events",), ("create", "get", "list", "patch")),
                     Rule("devices.harvesterhci.io", ("vgpudevices",), ("list",)),
                     Rule("instancetype.kubevirt.io",
                          ("virtualmachineinstancetypes", "virtualmachineclusterinstancetypes"), ("get", "list")),
                     Rule("apps", ("controllerrevisions",), ("get", "list")))),
        Grant(suffix="assignments", namespaced=True,
              rules=(Rule("", ("configmaps",), ("create",)),
                     Rule("", ("configmaps",), ("get", "update"), names=(ASSIGNMENTS,))))),
    alerts=(Alert("VMHostDeviceConflict", "warning", ("taken-while-stopped", "start-blocked", "double-assigned")),),
    identity=Identity("the first VM it keeps from starting", "category, device, holder, blocked VMs",
                      "`namespace`, `vm` (the holder, else the first VM naming it), `device`, `conflict` (the "
                      "category)"),
    replies=("detected", "resolved", "batch", "scanned"),
    reasons=("HostDeviceConflict", "HostDeviceConflictResolved"),
)

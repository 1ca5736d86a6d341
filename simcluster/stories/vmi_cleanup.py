"""vmi-cleanup's story (Harvester issue #5081, auto-clean VMIs after in-guest power-off): guests power
themselves off and vmi-cleanup decides, on an old KubeVirt (1.1.1, Harvester 1.2/1.3) and a new one
(1.3.1, Harvester 1.4)."""
from __future__ import annotations

import time

from simcluster.builders.io_pause import make_pvc
from simcluster.play import PING_INTERVAL, Stage, stage, virtctl_start, wait_until

CLEANUP_AFTER = "3s"
COMPONENT = "vmi-cleanup"
CAST = [
    ("vm8", "RerunOnFailure", None, "Harvester's default run strategy, powered off from inside (the seed)"),
    ("vm-optout", "Once", {"vmevents.io/skip-cleanup": "true"}, "run strategy Once, opted out by annotation"),
    ("vm-manual", "Manual", None, "run strategy Manual"),
    ("vm-once", "Once", None, "run strategy Once"),
]


def seed_vm(name: str, run_strategy: str, annotations: dict | None = None) -> dict:
    """A VM shaped like the seed's (Harvester's defaults), without the parts the story does not need."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default",
                         "annotations": {"harvesterhci.io/vmRunStrategy": run_strategy, **(annotations or {})},
                         "labels": {"harvesterhci.io/creator": "harvester", "harvesterhci.io/os": "ubuntu"}},
            "spec": {"runStrategy": run_strategy, "template": {
                "metadata": {"labels": {"harvesterhci.io/vmName": name}},
                "spec": {"domain": {"cpu": {"cores": 2, "sockets": 1, "threads": 1},
                                    "devices": {"disks": [{"name": "disk-0", "disk": {"bus": "virtio"}}]},
                                    "memory": {"guest": "1948Mi"},
                                    "resources": {"limits": {"cpu": "2", "memory": "2Gi"},
                                                  "requests": {"cpu": "125m", "memory": "1365Mi"}}},
                         "evictionStrategy": "LiveMigrate", "hostname": name,
                         "volumes": [{"name": "disk-0", "persistentVolumeClaim": {"claimName": f"{name}-disk-0"}}]}}}}


def play() -> None:
    for version, harvester in (("1.1.1", "Harvester 1.2/1.3"), ("1.3.1", "Harvester 1.4")):
        with stage(f"vmi-cleanup, KubeVirt {version} ({harvester})", kubevirt_version=version,
                   env_overrides={"vmi-cleanup": {"CLEANUP_AFTER": CLEANUP_AFTER}}) as s:
            _play(s)


def _play(s: Stage) -> None:
    s.timeline.line("setup", f"vmi-cleanup runs with CLEANUP_AFTER={CLEANUP_AFTER}; "
                             f"PingSource every {PING_INTERVAL:g}s")
    for name, strategy, extra, why in CAST:
        # Its disk's PVC, there in Harvester: without it KubeVirt creates no launcher pod (FailedPvcNotFound).
        s.cluster.create(make_pvc(f"{name}-disk-0", f"pvc-{name}-disk-0"))
        s.cluster.create(seed_vm(name, strategy, extra))
        if strategy == "Manual":
            virtctl_start(s.cluster, "default", name)
        s.timeline.line("create", f"VM default/{name}: {why}")
    wait_until(lambda: all(_phase(s, name) == "Running" for name, *_ in CAST), 20)
    s.timeline.line("running", "all four guests are Running")
    for name, *_ in CAST:
        s.kubevirt.guest_power_off("default", name)
        s.timeline.line("poweroff", f"the guest of {name} ran `poweroff`: VMI Succeeded, launcher pod Completed")
    wait_until(lambda: s.report_events(COMPONENT) and all(_settled(s, name, opt) for name, _, opt, _ in CAST), 30)
    time.sleep(PING_INTERVAL * 1.5)  # one more tick: nothing further happens
    s.knative.wait_idle(10)
    s.report_events(COMPONENT)
    _summary(s)


def _phase(s: Stage, name: str) -> str | None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")


def _settled(s: Stage, name: str, opted_out: dict | None) -> bool:
    return _phase(s, name) == "Succeeded" if opted_out else _phase(s, name) is None


def _summary(s: Stage) -> None:
    print(f"\n  {'VM':<11} {'runStrategy now':<16} {'VMI':<10} Events recorded by vmevents")
    for name, *_ in CAST:
        vm = s.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)
        events = [e for e in s.kube_events(COMPONENT) if e["involvedObject"]["name"] == name]
        notes = "; ".join(f"{e['type']} {e['reason']}: {e['message']}" for e in events)
        if not notes and _phase(s, name) is None:
            notes = "— (KubeVirt removed the VMI itself: RerunOnFailure on KubeVirt >= 1.2)"
        elif not notes:
            notes = "— (opted out: the VMI stays)"
        print(f"  {name:<11} {vm['spec'].get('runStrategy', ''):<16} {_phase(s, name) or 'gone':<10} {notes}")
    print(f"  ({s.timeline.irrelevant} irrelevant or already-gone events answered without an API write; "
          f"{s.timeline.repeats} repeated decisions not shown)")

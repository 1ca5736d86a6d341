"""device-conflict's story: the last comments of Harvester issue #5081, replayed
with the seed's own vm1 and vm2 on one node (harvester-ktmg4) with one VF of
intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION."""
from __future__ import annotations

import time

from simcluster.builders.devices import SEED_DEVICE, SEED_NODE, VF, prerequisites, seed_vm1, seed_vm2
from simcluster.play import PING_INTERVAL, Stage, stage, virtctl_start, wait_until

COMPONENT = "device-conflict"


def play() -> None:
    with stage("device-conflict, KubeVirt 1.3.1 (Harvester 1.4)", kubevirt_version="1.3.1",
               nodes={SEED_NODE: {VF: 1}}) as s:
        _play(s)


def _play(s: Stage) -> None:
    say = s.timeline.line
    say("setup", f"node {SEED_NODE} has one {VF}; PingSource every {PING_INTERVAL:g}s")
    for obj in prerequisites(seed_vm1()) + prerequisites(seed_vm2()):  # the disks' PVCs, the network's NAD
        if s.cluster.get(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) is None:
            s.cluster.create(obj)
    s.cluster.create(seed_vm1())
    say("create", f"VM default/vm1 (the seed's manifest) with PCI device {SEED_DEVICE}")
    wait_until(lambda: _phase(s, "vm1") == "Running", 20)
    s.kubevirt.guest_power_off("default", "vm1")
    say("poweroff", "the guest of vm1 ran `poweroff`: its pod Completed and freed the device")
    wait_until(lambda: _phase(s, "vm1") is None, 20)
    s.cluster.create(seed_vm2())
    say("create", f"VM default/vm2 (the seed's manifest, edited by hand) naming the same {SEED_DEVICE}")
    wait_until(lambda: _phase(s, "vm2") == "Running", 20)
    _settle(s)
    virtctl_start(s.cluster, "default", "vm1")
    say("start", "virtctl start vm1")
    wait_until(lambda: _printable(s, "vm1") == "ErrorUnschedulable", 20)
    say("status", f"vm1: ErrorUnschedulable, {_scheduler_message(s, 'vm1')}")
    _settle(s)
    s.kubevirt.guest_power_off("default", "vm2")
    say("poweroff", "the guest of vm2 ran `poweroff`: the device is free again")
    wait_until(lambda: _phase(s, "vm1") == "Running", 20)
    say("status", "vm1 got its device back and is Running")
    _settle(s)
    _summary(s)


def _settle(s: Stage) -> None:
    """Let events arrive and one more tick run, then show the Events recorded so far."""
    s.knative.wait_idle(10)
    time.sleep(PING_INTERVAL * 1.5)
    s.knative.wait_idle(10)
    s.report_events(COMPONENT)


def _phase(s: Stage, name: str) -> str | None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")


def _printable(s: Stage, name: str) -> str | None:
    vm = s.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)
    return (vm.get("status") or {}).get("printableStatus")


def _scheduler_message(s: Stage, name: str) -> str:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name) or {}
    return next((c.get("message", "") for c in (vmi.get("status") or {}).get("conditions") or ()
                 if c.get("type") == "PodScheduled"), "")


def _summary(s: Stage) -> None:
    print("\n  Events device-conflict recorded (kubectl describe vm shows them):")
    for event in sorted(s.kube_events(COMPONENT), key=lambda e: (e["firstTimestamp"], e["involvedObject"]["name"],
                                                                 e["reason"])):
        print(f"  {event['involvedObject']['name']:<4} {event['type']:<8} {event['reason']:<27} "
              f"x{event.get('count', 1):<3} "
              f"{event['message']}")
    print(f"  ({s.timeline.irrelevant} irrelevant events answered without an API call; "
          f"{s.timeline.repeats} repeated decisions not shown)")

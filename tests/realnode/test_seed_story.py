"""The seed's story on the real node (Harvester issue #5081), as a person plays it on `make cluster NODE=real`.

Three VMs boot the node's guest under KubeVirt 1.3 (TCG): one with Harvester's default run strategy
(`RerunOnFailure`), one `Manual` (`vm8`, the seed's), and one `Manual` that opts out of cleanup. Each guest counts its
boots on a disk of its own. A user types `poweroff` at each guest's console; KubeVirt's own virt-handler reports the
VMIs `Succeeded` and the launcher pods end (`Completed`, as in the seed, or in one of the two other ways KubeVirt
v1.3.0 ends them on a busy node: docs/facts.md §9; for `RerunOnFailure` KubeVirt ≥ 1.2 removes the VMI itself:
docs/facts.md §2). Then `make run`'s watcher, acting, with CLEANUP_AFTER=5s: vmi-cleanup removes what KubeVirt left,
the opted-out VMI stays, and no guest boots again (the VMI uids and the guests' own boot counts say so)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from controlplane import build
from tests.realnode.guests import (
    NAMESPACE,
    boot_disk,
    boots,
    describe_pods,
    guest_vm,
    launcher_end,
    launcher_pods,
    remove,
    vmi_phase,
    wait_for,
    with_boot_disk,
)

pytestmark = [pytest.mark.realnode, pytest.mark.real, pytest.mark.timeout(2700)]
VMI = ("kubevirt.io/v1", "VirtualMachineInstance")
# How KubeVirt 1.3 ends a launcher pod after its guest's power-off (tests/realnode/guests.py launcher_end, docs/facts.md
# §9), and what `kubectl get pod` then shows (READY, STATUS). The first is the seed's; the other two are KubeVirt
# v1.3.0's on a busy node, and vmi-cleanup's removal of the VMI takes the pod in each.
LAUNCHER_ENDS = {"completed": ["0/3", "Completed"], "console-log-gave-up": ["0/3", "Completed"],
                 "monitor-missed-exit": ["2/3", "NotReady"]}
VMS = {"vm-harvester": ("RerunOnFailure", {"harvesterhci.io/vmRunStrategy": "RerunOnFailure"}),
       "vm8": ("Manual", {}),
       "vm-keep": ("Manual", {"vmevents.io/skip-cleanup": "true"})}


def test_a_guest_powered_off_from_inside_is_cleaned_up_and_never_boots_again(real_node):
    remove(real_node, VMS)
    started = time.monotonic()
    try:
        play(real_node, started)
    finally:
        remove(real_node, VMS)


def play(real_node, started: float) -> None:
    cluster = real_node.cluster
    for name, (strategy, notes) in VMS.items():
        boot_disk(real_node, name)
        cluster.create(with_boot_disk(guest_vm(name, run_strategy=strategy, annotations=notes), name))
    for name, (strategy, _) in VMS.items():
        if strategy == "Manual":
            assert "start requested (virt-api)" in real_node.run("start", f"{NAMESPACE}/{name}").stdout
    for name in VMS:
        wait_for(f"VMI {name} Running", lambda n=name: vmi_phase(cluster, n) == "Running", explain=real_node.logs)
        wait_for(f"guest {name}'s first boot counted", lambda n=name: boots(real_node, n) == 1)
    uids = {name: cluster.get(*VMI, NAMESPACE, name)["metadata"]["uid"] for name in VMS}
    booted = time.monotonic() - started

    for name in VMS:   # a user's `poweroff` at each guest's shell, through virt-api's console
        real_node.run("guest", "poweroff", f"{NAMESPACE}/{name}")
    ends = {}
    for name in ("vm8", "vm-keep"):
        wait_for(f"VMI {name} Succeeded", lambda n=name: vmi_phase(cluster, n) == "Succeeded")
        ends[name] = wait_for(f"{name}'s launcher pod to end", lambda n=name: launcher_end(real_node, n),
                              explain=lambda n=name: f"{describe_pods(cluster, n)}\ncompute: "
                              f"{compute_log(real_node, n)}\n{real_node.logs()}")
        assert ends[name] in LAUNCHER_ENDS, (name, ends[name], describe_pods(cluster, name))
        assert cluster.get(*VMI, NAMESPACE, name)["metadata"]["uid"] == uids[name]   # KubeVirt left it there
    wait_for("KubeVirt to remove the RerunOnFailure VMI itself (≥ 1.2)",
             lambda: cluster.get(*VMI, NAMESPACE, "vm-harvester") is None)
    for name in VMS:
        wait_for(f"VM {name} Stopped", lambda n=name: cluster.get("kubevirt.io/v1", "VirtualMachine", NAMESPACE, n)
                 .get("status", {}).get("printableStatus") == "Stopped")
    before = real_node.kubectl("get", "vm,vmi,pod", "-n", NAMESPACE)
    print(f"\nafter the guests powered off ({time.monotonic() - started:.0f}s):\n{before}")
    rows = {line.split()[0]: line.split() for line in before.splitlines() if line.strip()}
    assert rows["virtualmachineinstance.kubevirt.io/vm8"][2] == "Succeeded"
    assert rows["virtualmachine.kubevirt.io/vm8"][2] == "Stopped"
    vm8_pod = next(k for k in rows if k.startswith("pod/virt-launcher-vm8-"))
    assert rows[vm8_pod][1:3] == LAUNCHER_ENDS[ends["vm8"]], (ends["vm8"], rows[vm8_pod])

    watcher = subprocess.Popen([sys.executable, "-m", "localknative"], cwd=build.REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**real_node.env, "KUBECONFIG": real_node.kubeconfig, "VMEVENTS_ACT": "true",
                                    "CLEANUP_AFTER": "5s"})
    try:
        wait_for("vmi-cleanup to remove vm8's Succeeded VMI", lambda: cluster.get(*VMI, NAMESPACE, "vm8") is None,
                 timeout=300)
        cleaned = time.monotonic()
        wait_for("vm8's launcher pod gone with its VMI", lambda: not launcher_pods(cluster, "vm8"), timeout=120)
        time.sleep(20)   # long enough for KubeVirt to start a new VMI, or vmi-cleanup to take the opted-out one
        kept = cluster.get(*VMI, NAMESPACE, "vm-keep")
        assert kept is not None and kept["metadata"]["uid"] == uids["vm-keep"], "the opted-out VMI was removed"
        assert kept["status"]["phase"] == "Succeeded"
        for name in ("vm8", "vm-harvester"):
            assert cluster.get(*VMI, NAMESPACE, name) is None, f"a new VMI of {name} appeared: started again"
        for name in VMS:
            status = cluster.get("kubevirt.io/v1", "VirtualMachine", NAMESPACE, name).get("status", {})
            assert status.get("printableStatus") == "Stopped" and not status.get("ready"), (name, status)
            assert boots(real_node, name) == 1, f"guest {name} booted again"
    finally:
        watcher.terminate()
        try:
            output, _ = watcher.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            watcher.kill()
            output, _ = watcher.communicate()
    after = real_node.kubectl("get", "vm,vmi,pod", "-n", NAMESPACE)
    print(f"launcher pods' ends: {ends}")
    print(f"after vmi-cleanup ({time.monotonic() - started:.0f}s; guests booted after {booted:.0f}s, vm8 cleaned "
          f"{cleaned - started:.0f}s in):\n{after}")
    assert "ACTING" in output, output[-3000:]


def compute_log(real_node, name: str) -> str:
    return real_node.kubectl("logs", "-n", NAMESPACE, "-l", f"vm.kubevirt.io/name={name}", "-c", "compute",
                             "--tail=60", check=False)

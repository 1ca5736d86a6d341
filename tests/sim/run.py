"""`make run`: the whole system, locally, as a readable timeline.

Without KUBECONFIG it plays the story of the Harvester issue on the simulated cluster (a
simulator, not Kubernetes): guests power themselves off and vmi-cleanup decides what to do, on an
old KubeVirt (1.1.1, Harvester 1.2/1.3) and a new one (1.3.1, Harvester 1.4). With KUBECONFIG it
runs the same functions, broker and sources against that cluster until Ctrl-C, in dry run unless
VMEVENTS_ACT=true (the functions then act with the kubeconfig's own credentials).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone

from tests.sim.knative import LocalKnative, load_manifests
from tests.sim.paths import DEPLOY_DIR

CLEANUP_AFTER = "3s"
PING_INTERVAL = 2.0
_print_lock = threading.Lock()


class Timeline:
    """Prints what happens, one line each, relative to the start: event → decision → action → reply."""

    def __init__(self):
        self.started = time.monotonic()
        self.irrelevant = 0
        self.repeats = 0
        self._seen: set[tuple] = set()

    def line(self, tag: str, text: str) -> None:
        with _print_lock:
            print(f"  {time.monotonic() - self.started:7.2f}s  {tag:<8} {text}", flush=True)

    def once(self, key: tuple, tag: str, text: str) -> None:
        """Print a decision the first time only: the same update arrives several times (duplicates,
        status churn), and each answer is the same."""
        if key in self._seen:
            self.repeats += 1
            return
        self._seen.add(key)
        self.line(tag, text)

    def on_delivery(self, delivery) -> None:
        if delivery.dead_lettered:
            self.line("dead", f"{delivery.type} {delivery.subject or ''} → dead-letter sink")
        elif delivery.reply_type:
            answering = "a tick" if delivery.type.endswith(".ping") else f"an update of {_short(delivery.subject)}"
            self.line("reply", f"{delivery.reply_type} back into the broker (answering {answering})")
        elif delivery.status is not None and delivery.status >= 300 or delivery.error:
            self.line("retry", f"{delivery.trigger}: {delivery.status or delivery.error} for "
                               f"{_short(delivery.subject)}, the broker will redeliver")

    def on_log(self, function: str, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            if line.strip() and "[INFO]" not in line:
                self.line("log", f"{function}: {line.strip()}")
            return
        if not isinstance(record, dict) or "decision" not in record:
            return
        if record["decision"] in ("irrelevant", "gone"):
            self.irrelevant += 1
            return
        what = record["event_type"] or ""
        source = "tick" if what.endswith(".ping") else f"{what.rsplit('.', 1)[-1]} {_short(record['subject'])}"
        action = f" → {record['action']}" if record["action"] != "none" else ""
        self.once((function, record["subject"], record["decision"], record["reason"]), "decide",
                  f"{function} [{source}] {record['decision']}{action}: {record['reason']}")

    def on_kube_event(self, event: dict) -> None:
        involved = event["involvedObject"]
        self.once(("event", event["metadata"]["name"], event.get("count")), "Event",
                  f"{event['type']} {event['reason']} on {involved['kind']} {involved.get('namespace')}/"
                  f"{involved['name']}" + (f" (count {event['count']})" if event.get("count", 1) > 1 else ""))


def _short(subject: str | None) -> str:
    if not subject:
        return ""
    parts = subject.strip("/").split("/")
    return "/".join(parts[-3::2]) if "namespaces" in parts else subject


def _vm(name: str, run_strategy: str, annotations: dict | None = None) -> dict:
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


CAST = [
    ("vm8", "RerunOnFailure", None, "Harvester's default run strategy, powered off from inside (the seed)"),
    ("vm-optout", "Once", {"vmevents.io/skip-cleanup": "true"}, "run strategy Once, opted out by annotation"),
    ("vm-manual", "Manual", None, "run strategy Manual"),
    ("vm-once", "Once", None, "run strategy Once"),
]


def play(version: str, harvester: str) -> None:
    from tests.sim.apiserver import SimCluster
    from tests.sim.kubevirt_controller import KubeVirtSim

    print(f"\n=== KubeVirt {version} ({harvester}) on the simulated cluster — a simulator, not Kubernetes ===")
    timeline = Timeline()
    cluster = SimCluster(kubevirt_version=version).start()
    kubevirt = KubeVirtSim(cluster, step_delay=0.05).start()
    knative = None
    try:
        knative = LocalKnative(load_manifests(DEPLOY_DIR),
                               kubeconfig_for=lambda sa: cluster.kubeconfig(service_account=sa),
                               api_client_for=lambda sa: cluster.api_client(service_account=sa),
                               api_server_url=cluster.url,
                               env_overrides={"vmi-cleanup": {"CLEANUP_AFTER": CLEANUP_AFTER}},
                               ping_interval=PING_INTERVAL, on_delivery=timeline.on_delivery,
                               on_log=timeline.on_log).start()
        timeline.line("setup", f"vmi-cleanup runs with CLEANUP_AFTER={CLEANUP_AFTER}; PingSource every "
                               f"{PING_INTERVAL:g}s")
        for name, strategy, annotations, why in CAST:
            cluster.create(_vm(name, strategy, annotations))
            if strategy == "Manual":
                virtctl_start(cluster, "default", name)
            timeline.line("create", f"VM default/{name}: {why}")
        _wait(lambda: all(_phase(cluster, name) == "Running" for name, *_ in CAST), 20)
        timeline.line("running", "all four guests are Running")
        for name, *_ in CAST:
            kubevirt.guest_power_off("default", name)
            timeline.line("poweroff", f"the guest of {name} ran `poweroff`: VMI Succeeded, launcher pod Completed")
        _wait(lambda: _report_events(cluster, timeline) and
              all(_settled(cluster, name, annotations) for name, _, annotations, _ in CAST), 30)
        time.sleep(PING_INTERVAL * 1.5)  # one more tick: nothing further happens
        knative.wait_idle(10)
        _report_events(cluster, timeline)
        _summary(cluster, timeline)
    finally:
        if knative:
            knative.stop()
        kubevirt.stop()
        cluster.stop()


def virtctl_start(cluster, namespace: str, name: str) -> None:
    """What `virtctl start` does: PUT the VM's start subresource."""
    from shared.kube import Kube

    Kube(cluster.api_client()).request(
        "PUT", f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/start", body={})


def _phase(cluster, name: str) -> str | None:
    vmi = cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")


def _settled(cluster, name: str, annotations: dict | None) -> bool:
    if annotations:  # opted out: it must still be there
        return _phase(cluster, name) == "Succeeded"
    return _phase(cluster, name) is None


def _vmevents_events(cluster) -> list[dict]:
    return [e for e in cluster.list("v1", "Event", "default")
            if (e.get("source") or {}).get("component") == "vmi-cleanup"]


def _report_events(cluster, timeline: Timeline) -> bool:
    for event in _vmevents_events(cluster):
        timeline.on_kube_event(event)
    return True


def _wait(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.1)


def _summary(cluster, timeline: Timeline) -> None:
    print(f"\n  {'VM':<11} {'runStrategy now':<16} {'VMI':<10} Events recorded by vmevents")
    for name, *_ in CAST:
        vm = cluster.get("kubevirt.io/v1", "VirtualMachine", "default", name)
        events = [e for e in _vmevents_events(cluster) if e["involvedObject"]["name"] == name]
        notes = "; ".join(f"{e['type']} {e['reason']}: {e['message']}" for e in events)
        if not notes and _phase(cluster, name) is None:
            notes = "— (KubeVirt removed the VMI itself: RerunOnFailure on KubeVirt >= 1.2)"
        elif not notes:
            notes = "— (opted out: the VMI stays)"
        print(f"  {name:<11} {vm['spec'].get('runStrategy', ''):<16} {_phase(cluster, name) or 'gone':<10} {notes}")
    print(f"  ({timeline.irrelevant} irrelevant or already-gone events answered without an API write; "
          f"{timeline.repeats} repeated decisions not shown)")


def watch_real_cluster(kubeconfig: str, act: bool) -> None:
    """Run the functions locally against a real cluster, with the kubeconfig's own credentials.

    Dry run unless VMEVENTS_ACT=true: `make run` is a way to look, and a person who points it at a
    cluster should not find VMIs deleted by surprise.
    """
    from kubernetes import config

    client = config.new_client_from_config(config_file=kubeconfig)
    mode = "ACTING (VMEVENTS_ACT=true)" if act else "dry run (set VMEVENTS_ACT=true to act)"
    timeline = Timeline()
    knative = LocalKnative(load_manifests(DEPLOY_DIR), kubeconfig_for=lambda sa: kubeconfig,
                           api_client_for=lambda sa: config.new_client_from_config(config_file=kubeconfig),
                           api_server_url=client.configuration.host, ping_interval=60.0,
                           env_overrides={"vmi-cleanup": {"CLEANUP_DRY_RUN": "false" if act else "true"}},
                           on_delivery=timeline.on_delivery, on_log=timeline.on_log).start()
    print(f"=== watching the cluster of {kubeconfig} ({client.configuration.host}), {mode}; Ctrl-C to stop ===",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        knative.stop()


def main() -> int:
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        watch_real_cluster(kubeconfig, act=os.environ.get("VMEVENTS_ACT", "").lower() == "true")
        return 0
    print(f"vmevents story, {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%SZ}: the Harvester issue "
          f"'clean up VMIs of VMs powered off from inside', played on a simulated cluster.")
    play("1.1.1", "Harvester 1.2/1.3")
    play("1.3.1", "Harvester 1.4")
    return 0


if __name__ == "__main__":
    sys.exit(main())

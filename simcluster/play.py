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
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from localknative.runtime import LocalKnative, load_manifests
from localknative.sources import label_selector
from simcluster.paths import DEPLOY_DIR

PING_INTERVAL = 2.0


class SimulatedBackend:
    """Where the stories play by default. controlplane.play swaps in a real control plane."""

    describe = "the simulated cluster (a simulator, not Kubernetes)"
    apiserversource_binary = None

    def cluster(self, kubevirt_version: str):
        from simcluster.apiserver import SimCluster

        return SimCluster(kubevirt_version=kubevirt_version).start()


BACKEND = SimulatedBackend()
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
        if not isinstance(record, dict) or "verdict" not in record:
            return
        if record["verdict"] in ("irrelevant", "gone"):
            self.irrelevant += 1
            return
        what = record["event_type"] or ""
        source = "tick" if what.endswith(".ping") else f"{what.rsplit('.', 1)[-1]} {_short(record['subject'])}"
        action = f" → {record['effect']}" if record["effect"] != "none" else ""
        self.once((function, record["subject"], record["verdict"], record["reason"]), "decide",
                  f"{function} [{source}] {record['verdict']}{action}: {record['reason']}")

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


@dataclass
class Stage:
    """One simulated cluster with KubeVirt and the local Knative, for one story."""

    cluster: object
    kubevirt: object
    knative: object
    timeline: Timeline

    def kube_events(self, component: str, namespace: str = "default") -> list[dict]:
        """The Kubernetes Events a function recorded (its name is the Event's source component)."""
        return [e for e in self.cluster.list("v1", "Event", namespace)
                if (e.get("source") or {}).get("component") == component]

    def report_events(self, component: str, namespace: str = "default") -> bool:
        for event in self.kube_events(component, namespace):
            self.timeline.on_kube_event(event)
        return True


@contextmanager
def stage(title: str, *, kubevirt_version: str = "1.3.1", env_overrides: dict | None = None,
          ping_interval: float | None = PING_INTERVAL, nodes: dict | None = None):
    """Start the cluster (BACKEND: the simulated one, or a real control plane), KubeVirt and every function,
    broker and source of deploy/."""
    from simcluster.kubevirt import KubeVirtSim

    print(f"\n=== {title} — on {BACKEND.describe} ===", flush=True)
    timeline = Timeline()
    cluster = BACKEND.cluster(kubevirt_version)
    kubevirt = KubeVirtSim(cluster, step_delay=0.05, **({"nodes": nodes} if nodes else {})).start()
    knative = None
    try:
        knative = LocalKnative(load_manifests(DEPLOY_DIR),
                               kubeconfig_for=lambda sa: cluster.kubeconfig(service_account=sa),
                               api_client_for=lambda sa: cluster.api_client(service_account=sa),
                               api_server_url=cluster.url, env_overrides=env_overrides or {},
                               ping_interval=ping_interval, on_delivery=timeline.on_delivery,
                               on_log=timeline.on_log, apiserversource_binary=BACKEND.apiserversource_binary,
                               namespaces_of=lambda selector: [
                                   n["metadata"]["name"] for n in cluster.list(
                                       "v1", "Namespace", label_selector=label_selector(selector))]).start()
        yield Stage(cluster, kubevirt, knative, timeline)
    finally:
        if knative:
            knative.stop()
        kubevirt.stop()
        cluster.stop()


def virtctl_start(cluster, namespace: str, name: str) -> None:
    """What `virtctl start` does: PUT the VM's start subresource (on a real control plane, which runs no
    virt-api, the cluster applies the same patch itself)."""
    from shared.kube import Kube

    if getattr(cluster, "backend", "sim") == "real":
        cluster.vm_start(namespace, name)
        return

    Kube(cluster.api_client()).request(
        "PUT", f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/start", body={})


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


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


def main(argv: list[str] | None = None) -> int:
    """`python -m simcluster.play [story ...]`: every story by default (see simcluster/stories/)."""
    from simcluster import stories

    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        watch_real_cluster(kubeconfig, act=os.environ.get("VMEVENTS_ACT", "").lower() == "true")
        return 0
    chosen = argv if argv is not None else sys.argv[1:]
    unknown = sorted(set(chosen) - set(stories.ALL))
    if unknown:
        print(f"no story named {', '.join(unknown)}; there are: {', '.join(stories.ALL)}", file=sys.stderr)
        return 2
    print(f"vmevents, {datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}: the stories of the Harvester issue and "
          f"knowledge base, played on {BACKEND.describe}.")
    for name in chosen or stories.ALL:
        stories.load(name).play()
    return 0


if __name__ == "__main__":
    sys.exit(main())

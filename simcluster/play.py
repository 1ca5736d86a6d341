"""`make run`: the stories of the Harvester issue and knowledge base, played as a readable timeline.

Each story starts a cluster (the simulated one; controlplane.play swaps in a real control plane), the simulated
KubeVirt, and every function, broker and source of deploy/ in the local Knative runtime. Against a cluster of
one's own (KUBECONFIG), `make run` runs localknative instead (python -m localknative).
"""
from __future__ import annotations

import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from localknative.runtime import LocalKnative, load_manifests
from localknative.sources import label_selector
from localknative.timeline import Timeline
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
# Who watches each stage: `started(stage)` once every function runs, `ending(stage)` before they stop (tests/monitoring
# has a real Prometheus scrape the functions while the stories play).
WATCHERS: list = []


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
          ping_interval: float | None = PING_INTERVAL, nodes: dict | None = None, volumes: bool = False):
    """Start the cluster (BACKEND: the simulated one, or a real control plane), KubeVirt and every function,
    broker and source of deploy/. `volumes`: the simulated KubeVirt reads the VMs' PVCs (KubeVirtSim)."""
    from simcluster.kubevirt.sim import KubeVirtSim

    print(f"\n=== {title} — on {BACKEND.describe} ===", flush=True)
    timeline = Timeline()
    cluster = BACKEND.cluster(kubevirt_version)
    kubevirt = KubeVirtSim(cluster, step_delay=0.05, volumes=volumes, **({"nodes": nodes} if nodes else {})).start()
    knative = None
    try:
        data_plane = getattr(BACKEND, "data_plane", None)  # controlplane.play: Knative's own broker
        if data_plane is not None:
            knative = data_plane(cluster, env_overrides=env_overrides or {}, ping_interval=ping_interval,
                                 on_delivery=timeline.on_delivery, on_log=timeline.on_log)
        else:
            knative = LocalKnative(load_manifests(DEPLOY_DIR),
                                   kubeconfig_for=lambda sa: cluster.kubeconfig(service_account=sa),
                                   api_client_for=lambda sa: cluster.api_client(service_account=sa),
                                   api_server_url=cluster.url, env_overrides=env_overrides or {},
                                   ping_interval=ping_interval, on_delivery=timeline.on_delivery,
                                   on_log=timeline.on_log, apiserversource_binary=BACKEND.apiserversource_binary,
                                   namespaces_of=namespaces_of(cluster),
                                   source_listed=(lambda m: cluster.listed_by(_source_account(m), m))
                                   if BACKEND.apiserversource_binary else None).start()
        played = Stage(cluster, kubevirt, knative, timeline)
        for watcher in WATCHERS:
            watcher.started(played)
        yield played
        for watcher in WATCHERS:
            watcher.ending(played)
    finally:
        if knative:
            knative.stop()
        kubevirt.stop()
        cluster.stop()


def namespaces_of(cluster):
    """What Knative's controller resolves an ApiServerSource's namespaceSelector to, on this cluster."""
    return lambda selector: [n["metadata"]["name"]
                             for n in cluster.list("v1", "Namespace", label_selector=label_selector(selector))]


def _source_account(manifest: dict) -> str:
    return f"{manifest['metadata']['namespace']}/{manifest['spec'].get('serviceAccountName') or 'default'}"


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


def main(argv: list[str] | None = None) -> int:
    """`python -m simcluster.play [story ...]`: every story by default (see simcluster/stories/)."""
    from simcluster import stories

    chosen = argv if argv is not None else sys.argv[1:]
    unknown = sorted(set(chosen) - set(stories.ALL))
    if unknown:
        print(f"no story named {', '.join(unknown)}; there are: {', '.join(stories.ALL)}", file=sys.stderr)
        return 2
    print(f"vmevents, {datetime.now(UTC):%Y-%m-%d %H:%M:%SZ}: the stories of the Harvester issue and "
          f"knowledge base, played on {BACKEND.describe}.")
    started, played = time.monotonic(), []
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        for name in chosen or stories.ALL:
            played.append(name)
            stories.load(name).play()
    except KeyboardInterrupt:  # the stage's clean-up has run: every function, broker and source is stopped
        print(f"\nmake run: stopped by Ctrl-C during the {played[-1]} story after {time.monotonic() - started:.0f} s: "
              f"{Timeline.summary()}.", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"\nmake run: {len(played)} stories played in {time.monotonic() - started:.0f} s: {Timeline.summary()}.")
    return 0


def _interrupted(signum, frame) -> None:
    """Ctrl-C: stop the story (its stage stops everything it started); a second Ctrl-C waits for that."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

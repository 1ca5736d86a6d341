"""`make run BACKEND=real`: the `make run` stories on a real control plane instead of the simulator.

One control plane (kube-apiserver, etcd, kube-controller-manager, built by controlplane/) serves every
story; each story's cluster starts from a reset one (controlplane.cluster.RealCluster.reset), KubeVirt's own
virt-controller of the story's version decides what happens to VMs and VMIs, the node stand-in
(simcluster.kubevirt.sim.KubeVirtSim, node_only) plays scheduler, kubelet and virt-handler, and Knative Eventing
runs on the plane (controlplane/knative.py): its ApiServerSource adapters send the events, its MT channel-based
broker delivers them to the functions by deploy/'s Triggers (controlplane/knative_runtime.py), and the story's
re-scan ticks go in through its ingress.
"""
from __future__ import annotations

import sys

from simcluster import play


class RealBackend:
    describe = ("a real control plane (kube-apiserver and etcd on loopback, KubeVirt's virt-controller; "
                "the node simulated)")

    def __init__(self) -> None:
        from controlplane.server import ControlPlane

        self.plane = ControlPlane().start(say=_say)
        self.knative = None

    def cluster(self, kubevirt_version: str):
        from controlplane.cluster import RealCluster
        from controlplane.knative import Knative

        cluster = RealCluster(self.plane, kubevirt_version).start()  # its reset spares Knative's namespaces
        if self.knative is None:
            _say("starting Knative Eventing (its broker delivers the stories' events)")
            self.knative = Knative(self.plane).start(say=_say)
            self.knative.apply_through_webhooks(cluster)
        return cluster

    def data_plane(self, cluster, **options):
        from controlplane.knative_runtime import KnativeRuntime
        from localknative.runtime import load_manifests
        from simcluster.paths import DEPLOY_DIR

        return KnativeRuntime(self.knative, load_manifests(DEPLOY_DIR),
                              kubeconfig_for=lambda sa: cluster.kubeconfig(service_account=sa), **options).start()

    def stop(self) -> None:
        if self.knative is not None:
            self.knative.stop()
        self.plane.remove()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    backend = RealBackend()
    play.BACKEND = backend
    try:
        return play.main(argv)
    finally:
        backend.stop()


if __name__ == "__main__":
    sys.exit(main())

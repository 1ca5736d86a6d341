"""`make run BACKEND=real`: the `make run` stories on a real control plane instead of the simulator.

One control plane (kube-apiserver, etcd, kube-controller-manager, built by controlplane/) serves every
story; each story's cluster starts from a reset one (controlplane.cluster.RealCluster.reset), KubeVirt's own
virt-controller of the story's version decides what happens to VMs and VMIs, the node stand-in
(simcluster.kubevirt.KubeVirtSim, node_only) plays scheduler, kubelet and virt-handler, and Knative's own
ApiServerSource adapter sends the events.
"""
from __future__ import annotations

import sys

from controlplane import build
from simcluster import play


class RealBackend:
    describe = ("a real control plane (kube-apiserver and etcd on loopback, KubeVirt's virt-controller; "
                "the node simulated)")

    def __init__(self) -> None:
        from controlplane.server import ControlPlane

        self.apiserversource_binary = build.ensure(build.KNATIVE) / "apiserver_receive_adapter"
        self.plane = ControlPlane().start(say=lambda text: print(text, file=sys.stderr, flush=True))

    def cluster(self, kubevirt_version: str):
        from controlplane.cluster import RealCluster

        return RealCluster(self.plane, kubevirt_version).start()


def main(argv: list[str] | None = None) -> int:
    backend = RealBackend()
    play.BACKEND = backend
    try:
        return play.main(argv)
    finally:
        backend.plane.remove()


if __name__ == "__main__":
    sys.exit(main())

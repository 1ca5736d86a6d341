"""The real node's first process (controlplane/node.py): PID 1 of the node's PID namespace, inside its network and
mount namespaces (`unshare --mount --net --pid --fork --mount-proc`).

It makes the node's mounts and address, says so, then reaps every process that ends up its child, as an init does
(containerd's shims are daemonized and re-parented to it). When it dies, the kernel kills every process of the
namespace: containerd, the shims, every container. The node's processes join its namespaces with `nsenter`.

Why a PID namespace: virt-handler runs with hostPID and makes its mounts in the mount namespace of PID 1
(`virt-chroot --mount /proc/1/ns/mnt`, pkg/virt-handler/virt-chroot); PID 1 must be the node's, not the machine's.

    python3 controlplane/node_init.py ROOT READY_FILE NODE_IP PATH...
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# kube-apiserver's --service-cluster-ip-range (controlplane/server.py). A connection the node itself opens to a Service
# address (kube-apiserver's egress tunnels: webhooks, virt-api) needs a route before kube-proxy's OUTPUT rules rewrite
# its destination to a pod; on a cluster the node's default route gives it one. This route, on the node's loopback,
# leads nowhere else: the namespace has no way out.
SERVICE_CIDR = "10.0.0.0/24"


def setup(root: Path, node_ip: str, paths: list[str]) -> None:
    def run(*argv: str) -> None:
        subprocess.run(argv, check=True)

    run("mount", "--make-rshared", "/")
    for relative in paths:
        source, target = root / "fs" / relative, Path("/") / relative
        source.mkdir(parents=True, exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", str(source), str(target))
    run("ip", "link", "set", "lo", "up")
    run("ip", "addr", "add", f"{node_ip}/32", "dev", "lo")
    run("ip", "route", "add", SERVICE_CIDR, "dev", "lo", "src", node_ip)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    bridge = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")  # pod → Service → pod on the same bridge
    if bridge.exists():
        bridge.write_text("1")


def reap_forever() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        signal.sigtimedwait({signal.SIGCHLD}, 5.0)


def main() -> None:
    root, ready, node_ip, *paths = sys.argv[1:]
    setup(Path(root), node_ip, paths)
    Path(ready).write_text(str(os.getpid()))
    reap_forever()


if __name__ == "__main__":
    main()

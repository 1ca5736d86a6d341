"""`make cluster NODE=real`'s real node, kept running in a process of its own (`python -m controlplane.node_up
STATE_FILE`, started by `python -m controlplane up`): the node (controlplane/node.py) and KubeVirt on it
(controlplane/kubevirt_node.py) against the control plane the state file names. The node's forwarders live in this
process, so it stays until `down` sends SIGTERM; it then stops the node, whose containers go with it.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from controlplane.knative_up import attach
from controlplane.server import ControlPlane


def attach_node(state: dict) -> ControlPlane:
    plane = attach(state)
    plane.node = True
    plane.egress_socket = Path(state["workdir"]) / "egress.sock"
    return plane


def _stop_now(*_) -> None:
    """SIGTERM while the node or KubeVirt is still starting: stop at once (the node is stopped on the way out)."""
    raise SystemExit(143)


def main(argv: list[str]) -> int:
    from controlplane.kubevirt_node import KubeVirtNode
    from controlplane.node import RealNode

    state = json.loads(Path(argv[0]).read_text())
    plane = attach_node(state)
    ready = Path(state["workdir"]) / "realnode.ready"
    stop = threading.Event()
    requests: list[str] = []
    wake = threading.Event()
    signal.signal(signal.SIGTERM, _stop_now)
    # `python -m controlplane kubelet stop|start`: the kubelet stops (the node goes NotReady) or starts again.
    signal.signal(signal.SIGUSR1, lambda *_: requests.append("stop") or wake.set())
    signal.signal(signal.SIGUSR2, lambda *_: requests.append("start") or wake.set())
    say = lambda text: print(text, flush=True)  # noqa: E731
    node = RealNode(plane).start(say=say)
    try:
        say(f"node {node.name} Ready in {node.started_after:.1f}s")
        KubeVirtNode(plane, node).start(say=say)
        ready.write_text(json.dumps({"init_pid": node.init_pid}))
        signal.signal(signal.SIGTERM, lambda *_: stop.set() or wake.set())
        while not stop.is_set():
            wake.wait()
            wake.clear()
            while requests:
                action = requests.pop(0)
                running = node.processes["kubelet"].poll() is None
                if action == "stop" and running:
                    node.stop_process("kubelet")
                    say("kubelet stopped")
                elif action == "start" and not running:
                    node.start_process("kubelet")
                    say("kubelet started")
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

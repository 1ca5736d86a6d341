"""Keeps Knative running on `make cluster`'s control plane after `python -m controlplane up` returns.

Knative's node stand-ins (controlplane/kubelet.py) are threads of a Python process, so `up` starts this one in
the background: it rebuilds the ControlPlane handle from the state `up` wrote (its URL, folder and
certificates), starts Knative on it, writes `knative.ready` with the pid, and runs until SIGTERM (`down`),
when it stops Knative's pods. `python -m controlplane.knative_up <state.json>`.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from controlplane.knative import Knative
from controlplane.pki import Pki
from controlplane.server import ControlPlane


def attach(state: dict) -> ControlPlane:
    """A handle on a running control plane (started by another process) from its state."""
    workdir = Path(state["workdir"])
    plane = ControlPlane(workdir=workdir, event_ttl=state.get("event_ttl", "1h"))
    pki = workdir / "pki"
    plane.pki = Pki(ca_cert=pki / "ca.crt", server_cert=pki / "apiserver.crt", server_key=pki / "apiserver.key",
                    admin_cert=pki / "admin.crt", admin_key=pki / "admin.key", sa_public=pki / "sa.pub",
                    sa_private=pki / "sa.key")
    plane.url = state["url"]
    plane.port = int(state["url"].rsplit(":", 1)[1])
    plane.admin_kubeconfig = Path(state["kubeconfig"])
    return plane


def main(argv: list[str]) -> int:
    state = json.loads(Path(argv[0]).read_text())
    plane = attach(state)
    ready = Path(state["workdir"]) / "knative.ready"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    knative = Knative(plane, die_with_parent=True)
    try:
        knative.start(say=lambda text: print(text, file=sys.stderr, flush=True))
        ready.write_text(f"{knative.ready_after:.1f}\n")
        stop.wait()
    finally:
        knative.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

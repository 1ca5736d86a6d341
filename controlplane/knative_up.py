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
from types import SimpleNamespace

from controlplane.cluster import kubectl
from controlplane.knative import Knative, KnativeError
from controlplane.pki import Pki
from controlplane.server import ControlPlane
from simcluster.paths import DEPLOY_DIR


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
    servers: list = []
    try:
        knative.start(say=lambda text: print(text, file=sys.stderr, flush=True))
        # `up` applied deploy/ before Knative ran: its Broker has no spec.config (the webhook that defaults it to
        # config-br-defaults' channel template was not there yet), and Knative's broker controller then finds no
        # channel template ("ChannelTemplateFailed"). Made again through the webhooks, as on a cluster where Knative
        # was installed first; a person's `kubectl apply -k deploy/overlays/default` then changes nothing of it.
        knative.apply_through_webhooks(SimpleNamespace(apply_deploy=lambda: kubectl(
            "apply", "-k", str(DEPLOY_DIR / "overlays" / "default"), kubeconfig=plane.admin_kubeconfig)))
        servers += serve_functions(plane, knative, Path(state["workdir"]) / "functions")
        try:
            knative.wait_ready("eventing.knative.dev/v1", "Broker", "vmevents", "default", timeout=300)
        except KnativeError as exc:  # it may yet become Ready: `up` says how to look
            print(f"knative_up: {exc}", file=sys.stderr, flush=True)
        ready.write_text(f"{knative.ready_after:.1f}\n")
        stop.wait()
    finally:
        for server in servers:
            server.stop()
        knative.stop()
    return 0


def serve_functions(plane: ControlPlane, knative: Knative, logs: Path) -> list:
    """Every Knative Service of deploy/ run as its function here (functions-framework, its own ServiceAccount's
    token), and given its address by the Serving stand-in: without them no Trigger resolves its subscriber and the
    Broker's dead-letter sink has no address, so its channel, and the Broker, are never Ready. Each function's log
    is logs/<name>.log."""
    from localknative.runtime import load_manifests, of_kind
    from localknative.serving import FunctionServer, service_account

    logs.mkdir(parents=True, exist_ok=True)
    servers = []
    for manifest in of_kind(load_manifests(DEPLOY_DIR), "serving.knative.dev", "Service"):
        meta = manifest["metadata"]
        account = service_account(manifest)
        kubeconfig = None
        if account != "default":  # its ServiceAccount's token (TokenRequest), as RealCluster.kubeconfig makes one
            answer = knative.api.post(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
                                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                       "spec": {"expirationSeconds": 86400}})
            kubeconfig = plane.write_kubeconfig(f"{meta['namespace']}/{account}",
                                                {"token": answer["status"]["token"]}, namespace=meta["namespace"])
        log = logs / f"{meta['name']}.log"
        server = FunctionServer(manifest, kubeconfig=kubeconfig,
                                on_log=lambda line, log=log: _append(log, line)).start(timeout=120)
        knative.serve(meta["namespace"], meta["name"], server.port)
        servers.append(server)
    return servers


def _append(path: Path, line: str) -> None:
    with open(path, "a") as log:
        log.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make watch`: every function, the broker and the sources of deploy/, run locally against the cluster in KUBECONFIG
until Ctrl-C, printing the timeline, with the kubeconfig's own credentials; `python -m localknative`. It says what it
will do first, and a cluster it cannot reach is one line.
vmi-cleanup only says what it would do unless VMEVENTS_ACT=true (CLEANUP_AFTER, when set, replaces deploy/'s);
the reporting functions do record their Events.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from localknative.paths import DEPLOY_DIR
from localknative.runtime import LocalKnative, load_manifests
from localknative.timeline import Timeline


def cleanup_env(act: bool) -> dict[str, str]:
    """vmi-cleanup's settings over deploy/'s: the dry run unless acting, and a person's own CLEANUP_AFTER (deploy/
    waits minutes; a story on `make cluster` need not)."""
    env = {"CLEANUP_DRY_RUN": "false" if act else "true"}
    if os.environ.get("CLEANUP_AFTER"):
        env["CLEANUP_AFTER"] = os.environ["CLEANUP_AFTER"]
    return env


def reachable(kubeconfig: str) -> tuple[str, str | None]:
    """The cluster's address, and why it cannot be reached (None when it answers GET /version): one line, said
    before anything starts, not a retry loop's worth of urllib3 warnings."""
    from shared.kubeconfig import connect

    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries would each print a warning
    os.environ["KUBECONFIG"] = kubeconfig
    try:
        kube = connect()
        host = kube.api.configuration.host
    except Exception as exc:  # noqa: BLE001 - a kubeconfig that cannot be loaded, whatever the loader says
        return kubeconfig, " ".join(str(exc).split())[:300]
    try:
        kube.request("GET", "/version")
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, a certificate: one line in any case
        return host, " ".join(str(getattr(exc, "message", None) or exc).split())[:300]
    return host, None


def watch_real_cluster(kubeconfig: str, act: bool) -> int:
    """Run the functions locally against a real cluster, with the kubeconfig's own credentials.

    Dry run unless VMEVENTS_ACT=true: `make watch` is a way to look, and a person who points it at a
    cluster should not find VMIs deleted by surprise.
    """
    host, problem = reachable(kubeconfig)
    if problem:
        print(f"make watch: cannot reach the cluster of KUBECONFIG={kubeconfig} ({host}): {problem}; nothing was "
              f"started.", file=sys.stderr, flush=True)
        return 1
    from kubernetes import config

    mode = "ACTING (VMEVENTS_ACT=true)" if act else "dry run (set VMEVENTS_ACT=true to act)"
    print(f"make watch: the functions, broker and sources of deploy/ start here against the cluster of {kubeconfig} "
          f"({host}), with its credentials: they read that cluster and record Kubernetes Events in it; vmi-cleanup "
          f"{'deletes what it would clean up' if act else 'decides and reports, and deletes nothing'}.", flush=True)
    timeline = Timeline()
    started = time.monotonic()
    knative = LocalKnative(load_manifests(DEPLOY_DIR), kubeconfig_for=lambda sa: kubeconfig,
                           api_client_for=lambda sa: config.new_client_from_config(config_file=kubeconfig),
                           api_server_url=host, ping_interval=60.0,
                           env_overrides={"vmi-cleanup": cleanup_env(act)},
                           on_delivery=timeline.on_delivery, on_log=timeline.on_log).start()
    print(f"=== watching the cluster of {kubeconfig} ({host}), {mode}; Ctrl-C to stop ===", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the functions stop in their own time; a second Ctrl-C waits
        knative.stop()
    print(f"make watch: watched {host} for {time.monotonic() - started:.0f} s: {Timeline.summary()}.", flush=True)
    return 0


def main() -> int:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print("make watch (python -m localknative) watches the cluster in KUBECONFIG; set it (make run plays the "
              "stories on the simulated cluster)", file=sys.stderr)
        return 2
    return watch_real_cluster(kubeconfig, act=os.environ.get("VMEVENTS_ACT", "").lower() == "true")


if __name__ == "__main__":
    sys.exit(main())

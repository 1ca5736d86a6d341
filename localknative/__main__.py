"""`make run` with KUBECONFIG set: every function, the broker and the sources of deploy/, run locally against that
cluster until Ctrl-C, printing the timeline, with the kubeconfig's own credentials; `python -m localknative`.
vmi-cleanup only says what it would do unless VMEVENTS_ACT=true (CLEANUP_AFTER, when set, replaces deploy/'s);
the reporting functions do record their Events.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

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
                           env_overrides={"vmi-cleanup": cleanup_env(act)},
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
    if not kubeconfig:
        print("python -m localknative watches the cluster in KUBECONFIG; set it (make run without it plays the "
              "stories on the simulated cluster)", file=sys.stderr)
        return 2
    watch_real_cluster(kubeconfig, act=os.environ.get("VMEVENTS_ACT", "").lower() == "true")
    return 0


if __name__ == "__main__":
    sys.exit(main())

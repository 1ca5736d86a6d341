"""Knative's own ApiServerSource receive adapter, run as a local process instead of our stand-in.

Knative's controller turns an ApiServerSource into a Deployment of `apiserver_receive_adapter` whose
environment carries the whole configuration (knative/eventing pkg/reconciler/apiserversource/resources/
receive_adapter.go `makeEnv`). This module builds that same environment from the manifest in deploy/ and
starts the binary with a kubeconfig for the source's ServiceAccount, so the events our functions receive
are the ones Knative itself sends. The binary comes from controlplane/ (built from knative.dev/eventing).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from localknative.serving import free_port
from localknative.sources import PLURALS, guess_plural, label_selector


def source_config(manifest: Mapping[str, Any], namespaces_of: Callable[[Mapping[str, Any] | None], list[str]]
                  ) -> dict[str, Any]:
    """K_SOURCE_CONFIG as the Knative controller writes it: a nil namespaceSelector watches the source's own
    namespace, an empty one every namespace (`allNamespaces`), any other the namespaces it selects."""
    spec = manifest.get("spec") or {}
    selector = spec.get("namespaceSelector")
    own = manifest["metadata"].get("namespace", "default")
    every = selector is not None and not (selector.get("matchLabels") or selector.get("matchExpressions"))
    namespaces = [own] if selector is None else namespaces_of(None if every else selector)
    resources = []
    for res in spec.get("resources") or []:
        group, _, version = res["apiVersion"].rpartition("/")
        gvr = {"Group": group, "Version": version,
               "Resource": PLURALS.get(res["kind"]) or guess_plural(res["kind"])}
        watch: dict[str, Any] = {"gvr": gvr}
        if res.get("selector"):
            watch["selector"] = label_selector(res["selector"])
        resources.append(watch)
    config: dict[str, Any] = {"namespaces": namespaces, "allNamespaces": every, "resources": resources,
                              "mode": spec.get("mode") or "Reference"}
    if spec.get("owner"):
        config["owner"] = spec["owner"]
    if spec.get("filters"):
        config["filters"] = spec["filters"]
    return config


class KnativeApiServerSource:
    """One `apiserver_receive_adapter` process for one ApiServerSource manifest."""

    def __init__(self, manifest: Mapping[str, Any], binary: str | os.PathLike, kubeconfig: str | os.PathLike,
                 sink_url: str, namespaces_of: Callable[[Mapping[str, Any] | None], list[str]],
                 on_log: Callable[[str], None] | None = None,
                 listed: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
        """listed(manifest): True once the adapter's first LIST of every resource has been answered (the caller
        can see the API server's side; the adapter logs nothing then). From that point on no change is missed:
        its watches start from that LIST's resourceVersion."""
        self.manifest = manifest
        self.name = manifest["metadata"]["name"]
        self.binary = str(binary)
        self.kubeconfig = str(kubeconfig)
        self.sink_url = sink_url
        self.config = source_config(manifest, namespaces_of)
        self.on_log = on_log
        self.listed = listed
        self.errors: list[str] = []
        self.lines: list[str] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    def environment(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(),
            "KUBECONFIG": self.kubeconfig, "K_SINK": self.sink_url, "K_SOURCE_CONFIG": json.dumps(self.config),
            "SYSTEM_NAMESPACE": "knative-eventing", "NAMESPACE": self.manifest["metadata"].get("namespace", ""),
            "NAME": self.name, "METRICS_DOMAIN": "knative.dev/eventing", "K_LOGGING_CONFIG": "{}",
            "K_OBSERVABILITY_CONFIG": "{}", "PROFILING_PORT": str(free_port()),
        }

    def start(self, timeout: float = 30.0) -> KnativeApiServerSource:
        self._ready.clear()  # started again (after kill): ready once this process's informers start
        self._process = subprocess.Popen([self.binary], env=self.environment(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                         start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"knative-source-{self.name}")
        self._reader.start()
        deadline = time.monotonic() + timeout
        ready = self._ready.wait(timeout)
        while ready and self.listed is not None and not self.listed(self.manifest):
            if time.monotonic() > deadline or self._process.poll() is not None:
                ready = False
                break
            time.sleep(0.05)
        if not ready or self._process.poll() is not None:
            self.stop()
            raise RuntimeError(f"Knative's ApiServerSource adapter for {self.name} did not start watching in "
                               f"{timeout:.0f}s; its output:\n" + "".join(self.lines[-40:]))
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line)
            if self.on_log:
                self.on_log(line)
            # The delegate's informers have listed once: from here on, changes are sent.
            if "Starting in resilient mode" in line or "Starting informers" in line:
                self._ready.set()
            if '"level":"error"' in line or '"level":"fatal"' in line:
                self.errors.append(line.strip())
        self._ready.set()

    def kill(self) -> None:
        """SIGKILL, as when its pod is killed: `start()` then starts it again (it lists and watches anew)."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
        self.stop()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if process.stdout is not None:
            process.stdout.close()

"""A local stand-in for Knative Serving: one Knative Service = one functions-framework process.

The container's command is replaced by `python -m functions_framework --target $FUNCTION_TARGET
--source $FUNCTION_SOURCE --host 127.0.0.1 --port <free>` (functions-framework 3.10.2 CLI,
`_cli.py`), run from the repo root with PYTHONPATH = repo root. The environment is the
container's `env` from the manifest (not the test process's), plus what Knative Serving injects
(PORT, K_SERVICE, K_CONFIGURATION, K_REVISION), the KUBECONFIG for the Service's
`serviceAccountName`, and per-call overrides.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from localknative.paths import REPO

# Host variables a process needs to run at all; nothing else leaks from the test process.
_HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "VIRTUAL_ENV")


class ServingError(RuntimeError):
    """A Knative Service that cannot be run locally, or that did not start."""


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, wait: float = 5.0, leader_first: bool = False
               ) -> None:
    """Stop a process started with start_new_session=True and all its children (its process group):
    `first`, then SIGKILL to the whole group if it has not exited within `wait` seconds. leader_first: `first` goes
    to the group's leader only, which stops its own children (gunicorn's master its workers)."""
    for sig, timeout in ((first, wait), (signal.SIGKILL, 5.0)):
        try:
            if leader_first and sig == first:
                os.kill(proc.pid, sig)
            else:
                os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def container_env(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The first container's literal `env` (valueFrom is not supported locally)."""
    containers = manifest["spec"]["template"]["spec"].get("containers") or []
    if not containers:
        raise ServingError(f"Knative Service {manifest['metadata']['name']} has no container.")
    env = {}
    for item in containers[0].get("env") or []:
        if "valueFrom" in item:
            raise ServingError(
                f"Knative Service {manifest['metadata']['name']}: env {item['name']} uses valueFrom, "
                "which the local runtime cannot resolve; pass it in env_overrides."
            )
        env[item["name"]] = str(item.get("value", ""))
    return env


def service_account(manifest: Mapping[str, Any]) -> str:
    return manifest["spec"]["template"]["spec"].get("serviceAccountName") or "default"


class FunctionServer:
    """Runs one Knative Service manifest as a real HTTP server on 127.0.0.1.

    `lines` collects every stdout/stderr line (thread-safe); `on_log(line)` sees each as it comes.
    """

    def __init__(
        self,
        manifest: Mapping[str, Any],
        kubeconfig: str | os.PathLike | None = None,
        env_overrides: Mapping[str, str] | None = None,
        on_log: Callable[[str], None] | None = None,
        repo: Path = REPO,
    ) -> None:
        self.manifest = manifest
        self.name = manifest["metadata"]["name"]
        self.namespace = manifest["metadata"].get("namespace", "default")
        self.service_account = service_account(manifest)
        self.env = container_env(manifest)
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)
        self.env.update({k: str(v) for k, v in (env_overrides or {}).items()})
        for required in ("FUNCTION_TARGET", "FUNCTION_SOURCE"):
            if not self.env.get(required):
                raise ServingError(f"Knative Service {self.name}: env {required} is not set in the manifest.")
        self.on_log = on_log
        self.repo = Path(repo)
        self.port: int | None = None
        self.lines: list[str] = []
        self._lock = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._readers: list[threading.Thread] = []

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServingError(f"{self.name} is not started.")
        return f"http://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 20.0) -> FunctionServer:
        source = self.repo / self.env["FUNCTION_SOURCE"]
        if not source.exists():
            raise ServingError(f"Knative Service {self.name}: FUNCTION_SOURCE {self.env['FUNCTION_SOURCE']} "
                               f"does not exist in {self.repo}.")
        self.port = self.port or free_port()  # started again (after kill): the same address, as a Service keeps
        env = {k: os.environ[k] for k in _HOST_ENV if k in os.environ}
        env.update(self.env)
        env.update({
            "PYTHONPATH": str(self.repo),
            "PYTHONUNBUFFERED": "1",
            "PORT": str(self.port),
            "K_SERVICE": self.name,
            "K_CONFIGURATION": self.name,
            "K_REVISION": f"{self.name}-00001",
        })
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "functions_framework",
             "--target", self.env["FUNCTION_TARGET"], "--source", self.env["FUNCTION_SOURCE"],
             "--signature-type", "http", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, start_new_session=True,
        )
        for stream, label in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
            reader = threading.Thread(target=self._read, args=(stream,), daemon=True, name=f"{self.name}-{label}")
            reader.start()
            self._readers.append(reader)
        self._wait_ready(timeout)
        return self

    def _read(self, stream) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._lock:
                self.lines.append(line)
                self._lock.notify_all()
            if self.on_log:
                try:
                    self.on_log(line)
                except Exception:
                    pass

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc else None
                self.stop()
                raise ServingError(
                    f"Knative Service {self.name} exited with code {code} while starting:\n"
                    + "\n".join(self.logs()[-30:])
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ServingError(f"Knative Service {self.name} did not listen on port {self.port} within {timeout}s.")

    def logs(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for_log(self, predicate: Callable[[str], bool], timeout: float = 10.0) -> str | None:
        """The first captured line for which `predicate` holds, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(remaining)

    def kill(self) -> None:
        """SIGKILL, as an OOM kill does: nothing finishes. `start()` then starts it again on the same port."""
        self._stop(signal.SIGKILL)

    def stop(self) -> None:
        self._stop(signal.SIGINT)

    def _stop(self, first: int) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # The process group we created (gunicorn and its worker). SIGINT is gunicorn's quick shutdown;
        # SIGTERM would wait out keep-alive connections (2 s) for nothing. SIGINT goes to the master alone, which
        # sends its workers SIGQUIT: sent to the whole group, a worker took both and, about one stop in ten, hung
        # until the SIGKILL 5 s later (seven functions stopped one after another outlasted `make run`'s Ctrl-C).
        stop_group(proc, first, leader_first=first != signal.SIGKILL)
        for reader in self._readers:
            reader.join(timeout=2)
        self._readers.clear()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()

    def __enter__(self) -> FunctionServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

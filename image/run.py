"""Runs one Knative Service's container from the image with the pod settings deploy/ gives it.

ContainerFunction is a localknative FunctionServer whose process is the image's container: the manifest's
env plus what Knative Serving injects (PORT, K_SERVICE, K_CONFIGURATION, K_REVISION), its securityContext
(read-only root without podman's extra tmpfs mounts, so only /dev/shm is writable as in a pod; all
capabilities dropped; no privilege escalation), its memory limit, the image's own non-root user, and the
credentials a pod of that ServiceAccount would have: for an https API server a projected-token folder at
/var/run/secrets/kubernetes.io/serviceaccount with KUBERNETES_SERVICE_HOST/PORT (the in-cluster path the
kubernetes client takes); for the simulator (plain http, no in-cluster form) its kubeconfig; and nothing at
all where the pod spec says automountServiceAccountToken: false. The container shares the host's network
(the API server and the broker listen on the loopback) and its server binds 127.0.0.1 (HOST).
"""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from image.engine import Engine
from localknative.serving import FunctionServer, ServingError, free_port

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KUBECONFIG_IN_CONTAINER = "/var/run/vmevents/kubeconfig"
# Knative Serving gives a revision's pods terminationGracePeriodSeconds = the revision's timeoutSeconds,
# whose default is 300 (knative/serving pkg/reconciler/revision/resources/deploy.go, config-defaults
# revision-timeout-seconds).
KNATIVE_GRACE_SECONDS = 300.0


def image_user(engine: Engine, image: str) -> tuple[int, int]:
    """The image's USER as numbers (deploy/ sets runAsNonRoot, not runAsUser: the image's user runs)."""
    user = engine.run("image", "inspect", "--format", "{{.Config.User}}", image, timeout=60).stdout.strip()
    uid, _, gid = user.partition(":")
    if not uid.isdigit():
        raise ServingError(f"image {image} has no numeric USER ({user!r}): Kubernetes cannot check runAsNonRoot")
    return int(uid), int(gid or uid)


def _memory(limit: str) -> str:
    """A Kubernetes quantity (Mi, Gi, M, plain bytes) as the engine's --memory value."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if limit.endswith(suffix):
            return str(int(float(limit[:-len(suffix)]) * factor))
    return str(int(limit))


class ContainerFunction(FunctionServer):
    """One Knative Service from the image. After stop(): `exit_code` and `stopped_in` (seconds from SIGTERM)."""

    def __init__(self, manifest: Mapping[str, Any], kubeconfig: str | os.PathLike | None = None,
                 env_overrides: Mapping[str, str] | None = None, on_log: Callable[[str], None] | None = None,
                 repo: Path | None = None, *, engine: Engine, image: str,
                 grace: float = KNATIVE_GRACE_SECONDS, mounts: Mapping[str, str] | None = None) -> None:
        """mounts: {host path: container path}, read-only, beside what the pod settings mount (bench/image.py
        mounts its no-op function this way)."""
        super().__init__(manifest, kubeconfig=None, env_overrides=env_overrides, on_log=on_log,
                         **({"repo": repo} if repo else {}))
        self.kubeconfig = str(kubeconfig) if kubeconfig else None
        self.engine, self.image, self.grace = engine, image, grace
        self.mounts = dict(mounts or {})
        self.container = f"vmevents-{self.name}-{uuid.uuid4().hex[:8]}"
        self.exit_code: int | None = None
        self.stopped_in: float | None = None
        self._secrets: str | None = None
        self.args: list[str] = []  # the engine's arguments, once started

    @property
    def pod_spec(self) -> Mapping[str, Any]:
        return self.manifest["spec"]["template"]["spec"]

    @property
    def container_spec(self) -> Mapping[str, Any]:
        return self.pod_spec["containers"][0]

    def run_args(self) -> list[str]:
        """`<engine> run …` for this Service's pod settings (the test of image/run.py reads them too)."""
        security = self.container_spec.get("securityContext") or {}
        args = ["run", "--rm", "--name", self.container, "--network", "host", "--pull", "never"]
        if security.get("readOnlyRootFilesystem"):
            # podman mounts tmpfs on /tmp, /var/tmp and /run with --read-only unless told not to; a pod has none.
            args += ["--read-only"] + (["--read-only-tmpfs=false"] if self.engine.kind == "podman" else [])
        if "ALL" in ((security.get("capabilities") or {}).get("drop") or []):
            args += ["--cap-drop", "ALL"]
        if security.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if security.get("runAsUser") is not None:
            args += ["--user", str(security["runAsUser"])]
        limit = ((self.container_spec.get("resources") or {}).get("limits") or {}).get("memory")
        if limit:
            args += ["--memory", _memory(limit)]
        env = {**self.env, "PORT": str(self.port), "HOST": "127.0.0.1", "K_SERVICE": self.name,
               "K_CONFIGURATION": self.name, "K_REVISION": f"{self.name}-00001"}
        env.update(self._credentials(args))
        for host, inside in self.mounts.items():
            args += ["--volume", f"{host}:{inside}:ro"]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        return [*args, self.image]

    def _credentials(self, args: list[str]) -> dict[str, str]:
        """Mounts for what a pod of this ServiceAccount gets, appended to args; the env they need. The files
        go in a fresh folder each call (the previous one removed), which stop() removes."""
        if self.pod_spec.get("automountServiceAccountToken") is False or not self.kubeconfig:
            return {}
        if self._secrets:
            shutil.rmtree(self._secrets, ignore_errors=True)
        uid, gid = image_user(self.engine, self.image)
        self._secrets = tempfile.mkdtemp(prefix=f"vmevents-{self.name}-")
        os.chmod(self._secrets, 0o755)  # the container's user must reach the files, each readable by it alone
        config = yaml.safe_load(Path(self.kubeconfig).read_text())
        cluster = config["clusters"][0]["cluster"]
        token = config["users"][0]["user"].get("token")
        server = urlsplit(cluster["server"])
        if server.scheme == "https" and token:
            if "certificate-authority-data" in cluster:
                ca = base64.b64decode(cluster["certificate-authority-data"])
            else:
                ca = Path(cluster["certificate-authority"]).read_bytes()
            files = {"token": token.encode(), "ca.crt": ca, "namespace": self.namespace.encode()}
            args += ["--volume", f"{self._secrets}:{TOKEN_DIR}:ro"]
            env = {"KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
                   "KUBERNETES_SERVICE_PORT": str(server.port or 443)}
        else:
            files = {"kubeconfig": Path(self.kubeconfig).read_bytes()}
            args += ["--volume", f"{self._secrets}/kubeconfig:{KUBECONFIG_IN_CONTAINER}:ro"]
            env = {"KUBECONFIG": KUBECONFIG_IN_CONTAINER}
        for name, content in files.items():
            path = Path(self._secrets) / name
            path.write_bytes(content)
            os.chown(path, uid, gid)
            os.chmod(path, 0o400)
        return env

    def pids(self) -> list[int]:
        """The container's processes as the host sees them (its first process and every descendant)."""
        first = int(self.engine.run("inspect", "--format", "{{.State.Pid}}", self.container, timeout=60).stdout)
        children: dict[int, list[int]] = {}
        for status in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = status.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(status.parent.name))
        found, todo = [], [first]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def start(self, timeout: float = 60.0) -> ContainerFunction:
        self.port = free_port()
        self.args = self.run_args()
        command = self.engine.command(*self.args)
        self._proc = subprocess.Popen(command, env={**os.environ, **self.engine.env}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
        for stream, label in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
            reader = threading.Thread(target=self._read, args=(stream,), daemon=True, name=f"{self.name}-{label}")
            reader.start()
            self._readers.append(reader)
        try:
            self._wait_ready(timeout)
        except ServingError:
            self._cleanup()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM to the container's first process, as the kubelet sends it; SIGKILL after the grace period."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        started = time.monotonic()
        self.engine.run("kill", "--signal", "TERM", self.container, check=False, timeout=60)
        try:
            proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self.engine.run("kill", "--signal", "KILL", self.container, check=False, timeout=60)
            proc.wait(timeout=60)
        self.stopped_in = time.monotonic() - started
        self.exit_code = proc.returncode
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.engine.run("rm", "--force", self.container, check=False, timeout=60)
        if self._secrets:
            shutil.rmtree(self._secrets, ignore_errors=True)
            self._secrets = None


def factory(engine: Engine, image: str, env: Mapping[str, Mapping[str, str]] | None = None,
            **options: Any) -> Callable[..., ContainerFunction]:
    """A LocalKnative `function_server`: every Knative Service runs from `image`; `env` adds settings by
    Service name over the caller's overrides."""
    def make(manifest, **kwargs):
        extra = (env or {}).get(manifest["metadata"]["name"])
        if extra:
            kwargs["env_overrides"] = {**(kwargs.get("env_overrides") or {}), **extra}
        return ContainerFunction(manifest, engine=engine, image=image, **kwargs, **options)
    return make

"""Which container engine to use: the first of podman and docker that answers, not the first installed.

These machines have a `docker` client with no daemon behind it, so `command -v docker` picks an engine
that cannot build; a probe asks each one for its server side. podman runs with image/containers.conf
(runc, cgroupfs, no default ulimits) unless CONTAINERS_CONF is already set.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CONTAINERS_CONF = Path(__file__).resolve().parent / "containers.conf"
HOW_TO_ENABLE = ("install podman (Debian: apt-get install podman runc debootstrap) or run a docker daemon, "
                 "then `make image`")


class EngineError(RuntimeError):
    """No engine answers, or one failed: the message says which command and why."""


@dataclass(frozen=True)
class Engine:
    path: str
    kind: str  # "podman" or "docker"
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True, capture: bool = True, timeout: float | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([self.path, *args], env={**os.environ, **self.env}, text=True, input=stdin,
                              capture_output=capture, timeout=timeout)
        if check and done.returncode != 0:
            detail = (done.stderr or "").strip()[-1500:] if capture else ""
            raise EngineError(f"{self.kind} {' '.join(args[:3])} … failed (exit {done.returncode}): {detail}")
        return done

    def command(self, *args: str) -> list[str]:
        return [self.path, *args]

    def has_image(self, ref: str) -> bool:
        return self.run("image", "inspect", ref, check=False, timeout=60).returncode == 0


def _probe(path: str, kind: str) -> Engine | None:
    engine = Engine(path, kind, {"CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF") or str(CONTAINERS_CONF)}
                    if kind == "podman" else {})
    # `docker version` prints the client even without a daemon; the server's version needs one.
    args = ("info", "--format", "{{.Host.Arch}}") if kind == "podman" else ("version", "--format",
                                                                          "{{.Server.Version}}")
    try:
        done = engine.run(*args, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return engine if done.returncode == 0 and done.stdout.strip() else None


def find() -> Engine | None:
    """CONTAINER_ENGINE if set (a path or a name; empty means none), else podman, else docker — whichever
    answers its probe."""
    wanted = os.environ.get("CONTAINER_ENGINE")
    if wanted is not None:
        path = shutil.which(wanted) if wanted else None
        if not path:
            return None
        return _probe(path, "docker" if "docker" in Path(path).name else "podman")
    for kind in ("podman", "docker"):
        path = shutil.which(kind)
        found = _probe(path, kind) if path else None
        if found:
            return found
    return None


def require() -> Engine:
    engine = find()
    if engine is None:
        raise EngineError(f"no container engine answers here: {HOW_TO_ENABLE}")
    return engine

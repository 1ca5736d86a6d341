"""`make image`: the Dockerfile built with the engine that answers, on a base this machine can have.

PYTHON_IMAGE (the Dockerfile's build argument) is the upstream python:3.11 slim image when you name it
and your engine can pull it; otherwise (the default) the Debian-packaged base of image/base.py, built here
without any container registry. The host's TLS trust reaches pip as the build secret `pip-cert` (PIP_CERT,
else the system bundle), so a build behind an intercepting proxy works and the image carries none of it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from image import base
from image.engine import Engine

REPO = Path(__file__).resolve().parent.parent
# deploy/base/kustomization.yaml's `images` entry: the tag deploy/ and the chart name by default.
DEFAULT_TAG = "registry.example.com/vmevents/vmevents:0.1.0"
SYSTEM_TRUST = Path("/etc/ssl/certs/ca-certificates.crt")


def default_tag() -> str:
    return os.environ.get("IMAGE") or DEFAULT_TAG


def host_trust() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), str(SYSTEM_TRUST)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_args(engine: Engine, tag: str, python_image: str, trust: Path | None) -> list[str]:
    args = ["build", "--tag", tag, "--build-arg", f"PYTHON_IMAGE={python_image}", "--network", "host"]
    if engine.kind == "podman":
        # chroot isolation: no nested user namespace or cgroup setup, which these machines refuse.
        args += ["--isolation", "chroot"]
    if trust:
        args += ["--secret", f"id=pip-cert,src={trust}"]
    return [*args, str(REPO)]


def build(engine: Engine, tag: str | None = None, python_image: str | None = None, say=lambda text: None) -> str:
    tag = tag or default_tag()
    started = time.monotonic()
    python_image = python_image or os.environ.get("PYTHON_IMAGE") or base.ensure(engine, say)
    say(f"building {tag} on {python_image} with {engine.kind}")
    engine.run(*build_args(engine, tag, python_image, host_trust()), capture=False, timeout=3600)
    say(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


@dataclass(frozen=True)
class Layer:
    size: int
    created_by: str


def layers(engine: Engine, tag: str) -> list[Layer]:
    """The image's layers, oldest first, with the instruction that made each."""
    out = engine.run("history", "--no-trunc", "--format", "json", tag, timeout=60).stdout
    rows = json.loads(out)
    found = [Layer(int(r.get("size") or r.get("Size") or 0), r.get("createdBy") or r.get("CreatedBy") or "")
             for r in rows]
    return list(reversed(found))


def size(engine: Engine, tag: str) -> int:
    return int(engine.run("image", "inspect", "--format", "{{.Size}}", tag, timeout=60).stdout.strip())

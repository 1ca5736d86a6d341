"""A Python 3.11 base image built from Debian's packages, for machines that can pull no container image.

debootstrap installs Debian bookworm's python3 (3.11) into a folder, which is trimmed (apt's lists and
caches, documentation, locales), packed into a tarball and imported into the engine. Tarball and image are
cached outside the work tree, keyed by everything that decides their content (suite, variant, package set,
this recipe's version), so a second build costs nothing. The Dockerfile builds on it with
`--build-arg PYTHON_IMAGE=<its tag>` exactly as on python:3.11-slim.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from image.engine import Engine, EngineError

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# python-is-python3: the Dockerfile runs `python`, as on the upstream image; ca-certificates: alert-forwarder
# posts to https receivers with the system's trust.
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
RECIPE = 1  # raise when the trimming below changes what the tarball holds
TRIM = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log", "usr/share/doc", "usr/share/man",
        "usr/share/info", "usr/share/locale", "usr/share/lintian", "etc/resolv.conf", "etc/hostname")
ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")


def key() -> str:
    text = "\n".join([SUITE, "minbase", *sorted(PACKAGES), str(RECIPE)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tag() -> str:
    return f"localhost/vmevents-python-base:{SUITE}-{key()}"


def cache_dir() -> Path:
    return Path(os.environ.get("VMEVENTS_CACHE") or Path.home() / ".cache" / "vmevents") / "image"


def tarball() -> Path:
    return cache_dir() / f"python-base-{SUITE}-{key()}.tar"


def ensure(engine: Engine, say=lambda text: None) -> str:
    """The base image's tag, imported into `engine`, building the tarball first if it is not cached."""
    if engine.has_image(tag()):
        return tag()
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build waits, then reuses the first one's tarball
        if not tarball().is_file():
            _debootstrap(say)
        if not engine.has_image(tag()):
            started = time.monotonic()
            engine.run("import", *[arg for env in ENV for arg in ("--change", f"ENV {env}")],
                       str(tarball()), tag(), timeout=600)
            say(f"imported {tag()} in {time.monotonic() - started:.0f}s")
    return tag()


def _debootstrap(say) -> None:
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise EngineError("no Python base image here and no debootstrap to build one: "
                          "apt-get install debootstrap (or pass PYTHON_IMAGE=python:3.11.13-slim-bookworm)")
    root = cache_dir() / f"root-{key()}.partial"
    shutil.rmtree(root, ignore_errors=True)
    log = cache_dir() / f"python-base-{SUITE}-{key()}.log"
    say(f"building the Python base from Debian {SUITE} packages with debootstrap (about a minute; log: {log})")
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                               str(root), MIRROR], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise EngineError(f"debootstrap failed (exit {done.returncode}); the end of {log}:\n"
                          f"{log.read_text()[-1500:]}")
    for path in TRIM:
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            target.mkdir()
        elif target.exists() or target.is_symlink():
            target.unlink()
    partial = tarball().with_suffix(".tar.partial")
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."], check=True)
    partial.rename(tarball())
    shutil.rmtree(root, ignore_errors=True)
    say(f"built {tarball().name} ({tarball().stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s")

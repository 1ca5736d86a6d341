"""Builds the control plane's binaries from their published Go modules, once per version.

The wrapper modules in controlplane/modules/ pin each upstream version (their go.mod and go.sum); this
module builds them with the machine's Go into a cache outside the work tree, keyed by version, so a second
build of the same version costs nothing. `python -m controlplane build` runs it by hand.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = REPO / "controlplane" / "modules"


class BuildError(RuntimeError):
    """A component could not be built: the message says which, and how to see why."""


@dataclass(frozen=True)
class Component:
    name: str          # the cache folder's stem, e.g. "kube"
    module: str        # the upstream module whose version keys the cache
    packages: tuple[str, ...]
    binaries: tuple[str, ...]
    ldflags: str = "-s -w"  # {version} becomes the module's version
    folder: str = ""   # the wrapper module's folder when it is not `name` (one folder per pinned version)
    cgo: bool = False  # links C (libvirt, <linux/kvm.h>): built with CGO_ENABLED=1 and the machine's gcc

    @property
    def directory(self) -> Path:
        return MODULES / (self.folder or self.name)

    @property
    def version(self) -> str:
        text = (self.directory / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.M)
        if not match:
            raise BuildError(f"{self.directory / 'go.mod'} requires no {self.module}")
        return match.group(1)


def _kube_ldflags(version: str) -> str:
    # Without these, /version says v0.0.0-master+$Format:%H$ and clients that parse it fail.
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    flags = [f"-X k8s.io/component-base/version.{k}={v}" for k, v in stamp.items()]
    flags += [f"-X k8s.io/client-go/pkg/version.{k}={v}" for k, v in stamp.items()]
    return "-s -w " + " ".join(flags)


KUBE = Component("kube", "k8s.io/kubernetes", ("./cmd/kube-apiserver", "./cmd/kube-controller-manager"),
                 ("kube-apiserver", "kube-controller-manager"))
# The real node's Kubernetes parts (controlplane/node.py), from the same wrapper module: they share its build cache.
KUBE_NODE = Component("kube-node", "k8s.io/kubernetes", ("./cmd/kubelet", "./cmd/kube-scheduler", "./cmd/kube-proxy"),
                      ("kubelet", "kube-scheduler", "kube-proxy"), folder="kube")
ETCD = Component("etcd", "go.etcd.io/etcd/server/v3", (".",), ("etcd",))
# Knative Eventing's commands (the binary is named after the package's last element): the sources' adapters,
# the core controller and webhook, the MT channel-based broker and the in-memory channel (docs/control-plane.md).
KNATIVE_COMMANDS = ("apiserver_receive_adapter", "mtping", "controller", "webhook", "broker/ingress",
                    "broker/filter", "mtchannel_broker", "in_memory/channel_controller",
                    "in_memory/channel_dispatcher")
KNATIVE = Component("knative", "knative.dev/eventing",
                    tuple(f"knative.dev/eventing/cmd/{c}" for c in KNATIVE_COMMANDS),
                    tuple(c.rsplit("/", 1)[-1] for c in KNATIVE_COMMANDS))
# Knative Serving's admission webhook only: the rest of Serving needs pods and a network layer.
SERVING = Component("serving", "knative.dev/serving", ("knative.dev/serving/cmd/webhook",), ("webhook",))
# Helm installs deploy/chart on the real control plane (tests/deploy/test_chart.py); its version is stamped so
# `helm version` reports it (helm.sh/helm/v3/internal/version/version.go, `version` is set by the Makefile).
HELM = Component("helm", "helm.sh/helm/v3", ("helm.sh/helm/v3/cmd/helm",), ("helm",),
                 ldflags="-s -w -X helm.sh/helm/v3/internal/version.version={version}")


def _kubevirt(version: str) -> Component:
    # One wrapper module per KubeVirt version: each pins its own go.mod/go.sum (docs/control-plane.md).
    return Component("kubevirt", "kubevirt.io/kubevirt",
                     ("kubevirt.io/kubevirt/cmd/virt-controller", "./kubevirt-manifests"),
                     ("virt-controller", "kubevirt-manifests"), folder=f"kubevirt-{version}")


KUBEVIRT_VERSIONS = ("v1.8.3", "v1.3.0", "v1.1.1")   # the newest first
KUBEVIRT = {version: _kubevirt(version) for version in KUBEVIRT_VERSIONS}
# The real node's KubeVirt (controlplane/kubevirt_node.py), at the version Harvester 1.4 ships the minor of: the rest of
# virt-operator's install beside virt-controller, from the same wrapper module. virt-handler links C (<linux/kvm.h>, for
# the node labeller's KVM capabilities) and virt-launcher libvirt's Go binding (against Debian's libvirt-dev), so this
# component is built with cgo; Go's build cache keys every package by that setting, so one build with cgo for all of
# them compiles KubeVirt's dependencies once more, not twice (a first try that built the pure-Go ones without cgo, to
# share virt-controller's cache, then compiled everything again for these two).
KUBEVIRT_NODE_VERSION = "v1.3.0"
_KUBEVIRT_STAMP = "-s -w -X kubevirt.io/client-go/version.gitVersion={version} " \
                  "-X kubevirt.io/client-go/version.gitTreeState=clean"
_KUBEVIRT_NODE_COMMANDS = ("virt-api", "virt-operator", "virt-handler", "virt-launcher", "virt-chroot", "virt-freezer",
                           "virt-launcher-monitor", "virt-probe", "virt-tail")
KUBEVIRT_NODE = Component(
    "kubevirt-node", "kubevirt.io/kubevirt",
    (*(f"kubevirt.io/kubevirt/cmd/{c}" for c in _KUBEVIRT_NODE_COMMANDS),
     "./kubevirt-manifests"),  # its `operator` command: the release's kubevirt-operator.yaml (virt-controller's copy
                               # of the command is cached from before it had one)
    (*_KUBEVIRT_NODE_COMMANDS, "kubevirt-manifests"),
    ldflags=_KUBEVIRT_STAMP, folder=f"kubevirt-{KUBEVIRT_NODE_VERSION}", cgo=True)
# What the real node's lane needs (tests marked `realnode`), built after ALL's others.
NODE_COMPONENTS = (KUBE_NODE, KUBEVIRT_NODE)
# The order the builds run in, two at a time, and the tests that need them follow it (tests/conftest.py): most
# real-backend tests need kube, etcd, Knative's adapter and the default world's virt-controller (1.3.1 → v1.3.0),
# so those come first; Knative Serving's webhook and helm serve a few modules; the other KubeVirt versions last.
ALL = (KUBE, ETCD, KNATIVE, KUBEVIRT["v1.3.0"], SERVING, HELM, KUBEVIRT["v1.8.3"], KUBEVIRT["v1.1.1"])


def everything() -> tuple[Component, ...]:
    """What `python -m controlplane build` (and so the background build before the tests) builds: the real node's
    lane's components after all the others."""
    return (*ALL, *NODE_COMPONENTS)


def cache_root() -> Path:
    return Path(os.environ.get("VMEVENTS_CACHE") or Path.home() / ".cache" / "vmevents") / "bin"


def binary_dir(component: Component) -> Path:
    return cache_root() / f"{component.name}-{component.version}"


def go_available() -> str | None:
    return shutil.which("go")


def buildable() -> bool:
    """Go is here, or every binary is already cached: the control plane can be had without building."""
    return go_available() is not None or all_built()


def built(component: Component) -> bool:
    return all((binary_dir(component) / b).is_file() for b in component.binaries)


_background: list[subprocess.Popen] = []  # held, not waited for: the build outlives a short caller


def all_built(components: tuple[Component, ...] | None = None) -> bool:
    return all(built(c) for c in (everything() if components is None else components))


def background_log() -> Path:
    return cache_root() / "background.build.log"


def start_background(command: list[str] | None = None) -> str:
    """Start every build not cached in a process of its own, at a low priority, and return at once: "built"
    (nothing to do), "running" (another caller's is under way) or "started". The tests that need no binary run
    meanwhile, and the first that needs one waits for it (tests/conftest.py), so a cold build costs the test run
    only what the tests leave of the two cores. The process holds `.background.lock` while it lives."""
    if all_built():
        return "built"
    cache_root().mkdir(parents=True, exist_ok=True)
    lock = open(cache_root() / ".background.lock", "w")  # noqa: SIM115 - handed to the child, then closed
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "running"
        command = ["nice", "-n", "15", *(command or [sys.executable, "-m", "controlplane", "build"])]
        with open(background_log(), "w") as log:
            child = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, pass_fds=(lock.fileno(),), start_new_session=True)
        _background.append(child)
        (cache_root() / ".background.pid").write_text(str(child.pid))  # its process group's id too
        return "started"
    finally:
        lock.close()  # the child's copy of the descriptor keeps the lock until it exits


def hurry_background() -> bool:
    """The background builds at the normal priority again, once a caller waits for them (tests/conftest.py):
    the low priority was for the tests that ran beside them. False when there is none, or lowering the nice
    value is not allowed here (only root may)."""
    try:
        pgid = int((cache_root() / ".background.pid").read_text())
        with open(cache_root() / ".background.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return False  # no background build holds it: the pid is an old one's
            except BlockingIOError:
                pass
        os.setpriority(os.PRIO_PGRP, pgid, 0)  # the build, its go command and the compilers it starts
        return True
    except (OSError, ValueError):
        return False


# Set by tests/conftest.py while a test runs that is not marked as needing binaries: called with the component before
# ensure() hands its folder over, it fails that test at once, cached or not. Unmarked tests run first, beside a
# cold build, and one that needed a binary would wait for that build with every test behind it waiting too.
guard: Callable[[Component], None] | None = None


def ensure(component: Component, say=lambda text: None) -> Path:
    """The folder holding the component's binaries, building them first if they are not cached."""
    if guard is not None:
        guard(component)
    target = binary_dir(component)
    if built(component):
        return target
    go = go_available()
    if not go:
        raise BuildError(f"cannot build {component.name} {component.version}: no `go` on PATH "
                         "(install Go 1.25 or newer)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # One lock per component and version: a second caller of the same build waits, then reuses it, while
    # another version (KubeVirt has three) builds beside it.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(component):
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        ldflags = (_kube_ldflags(component.version) if component.module == KUBE.module
                   else component.ldflags.format(version=component.version))
        env = dict(os.environ, CGO_ENABLED="1" if component.cgo else "0", GOTOOLCHAIN="local",
                   GOFLAGS="-mod=readonly")
        log = target.parent / f"{component.name}-{component.version}.build.log"
        say(f"building {component.name} {component.version} with {go} (a cold build takes minutes; log: {log})")
        started = time.monotonic()
        with open(log, "w") as out:
            result = subprocess.run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(partial) + "/",
                                     *component.packages], cwd=component.directory, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        if result.returncode != 0:
            tail = log.read_text()[-2000:]
            raise BuildError(f"building {component.name} {component.version} failed (exit {result.returncode}); "
                             f"the end of {log}:\n{tail}")
        for binary in component.binaries:
            if not (partial / binary).is_file():
                raise BuildError(f"building {component.name} {component.version} made no {binary}")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        say(f"built {component.name} {component.version} in {time.monotonic() - started:.0f}s")
    return target


JOBS = 2  # builds side by side (VMEVENTS_BUILD_JOBS overrides)


def ensure_all(say=lambda text: None, jobs: int | None = None,
               components: tuple[Component, ...] | None = None) -> dict[str, Path]:
    """Every component (of ALL, unless told), `jobs` builds at a time in that order. Go compiles one package per core,
    but loading the packages, a package with no sibling ready and the link are one thread each: a second build beside
    the first keeps both cores busy. The first failure is raised once the builds under way have ended."""
    jobs = jobs or int(os.environ.get("VMEVENTS_BUILD_JOBS") or JOBS)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {binary_dir(c).name: pool.submit(ensure, c, say) for c in (ALL if components is None else components)}
    return {name: future.result() for name, future in futures.items()}


def main() -> int:
    try:
        for name, path in ensure_all(say=lambda text: print(text, file=sys.stderr, flush=True),
                                     components=everything()).items():
            print(f"{name}: {path}")
    except BuildError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 1
    return 0

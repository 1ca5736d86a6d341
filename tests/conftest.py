"""Shared fixtures: an isolated environment, kubeconfig helpers and a function served through HTTP."""
from __future__ import annotations

import functools
import re
import socket
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
REAL_TIMEOUT = 300


def write_kubeconfig(path: Path, server: str, token: str = "none") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path


@pytest.fixture
def unreachable_kubeconfig(tmp_path) -> Path:
    """A kubeconfig whose API server refuses connections: any API call fails loudly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")


@pytest.fixture
def serve(monkeypatch, unreachable_kubeconfig):
    """serve(source, settings=(), **env): functions-framework's test client for the function at
    `source`, its API server refusing connections, none of the `settings` names taken from the
    developer's environment, and `env` set. A bad setting stops it with SystemExit."""
    from functions_framework import create_app  # only the HTTP tests need it

    def make(source: str, settings=(), **env: str):
        for name in settings:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return create_app(target="handle", source=source).test_client()
    return make


@functools.cache
def _declared_settings() -> tuple[str, ...]:
    from catalog import declarations

    return tuple(sorted({s.name for f in declarations() for s in f.settings}))


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch):
    """No test sees the developer's cluster or settings (every setting a function declares)."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", *_declared_settings()):
        monkeypatch.delenv(name, raising=False)


def needs_binaries(item) -> bool:
    """The item needs what controlplane/build.py builds: a real-backend row, a test marked `built`, or the real node's
    lane (`realnode`)."""
    return any(item.get_closest_marker(mark) is not None for mark in ("real", "built", "realnode"))


# A KubeVirt version in a test's id or its module's source: "kubevirt-1.8.3-real", "v1.1.1", "1.3.1".
_KUBEVIRT_VERSION = re.compile(r"(?<![\w.])v?(1\.\d{1,2}\.\d+)(?![\w.])")
# What in a module's source means Knative's own broker and webhooks run (controlplane/knative.py, both halves).
_KNATIVE_BROKER = re.compile(r"tests\.delivery|bench\.broker|controlplane\.knative\b|from controlplane import knative")
_HELM = re.compile(r"build\.HELM|tests\.deploy\.test_chart import")  # helm, or the chart test's helm fixture


@functools.cache
def _module_needs(path: str) -> tuple[bool, bool, frozenset[str], bool, bool]:
    """What a module's source says of the binaries its tests need, read once per module: whether it asks for every
    build, whether it asks for any itself, the KubeVirt versions it names, Knative's broker, helm."""
    text = Path(path).read_text(errors="replace")
    return ("ensure_all" in text, "build.ensure(" in text, frozenset(_KUBEVIRT_VERSION.findall(text)),
            bool(_KNATIVE_BROKER.search(text)), bool(_HELM.search(text)))


def components_for(item) -> tuple:
    """What of controlplane/build.py an item that needs binaries needs, as its id and its module's source tell:
    kube, etcd and Knative's ApiServerSource adapter always; the default world's virt-controller (1.3.1 → v1.3.0)
    and that of each KubeVirt version named; Knative Serving's webhook where Knative's broker runs; helm
    where its module builds it; everything where it asks for everything. It errs towards more: a binary it needs and
    was not waited for is waited for inside the test, under the test's timeout."""
    from controlplane import build, kubevirt

    if item.get_closest_marker("realnode") is not None:
        # The real node's lane (tests/realnode/): every test runs on `make cluster NODE=real`, KubeVirt included.
        return (build.KUBE, build.ETCD, build.KUBEVIRT[build.KUBEVIRT_NODE_VERSION], *build.NODE_COMPONENTS)
    everything, ensures, versions, broker, helm = _module_needs(str(item.path))
    if everything or (item.get_closest_marker("real") is None and not ensures and not helm):
        return build.ALL  # every component but the real node's, which only its lane needs
    needed = [build.KUBE, build.ETCD, build.KNATIVE]
    # The default world's version always: a module may name only versions no virt-controller stands for.
    for version in sorted({"1.3.1", *_KUBEVIRT_VERSION.findall(item.nodeid), *versions}):
        try:
            needed.append(build.KUBEVIRT[kubevirt.controller_version(version)])
        except kubevirt.VirtControllerError:  # a version no virt-controller is built for (Kubernetes' own, say)
            continue
    if broker:
        needed.append(build.SERVING)
    if helm:
        needed.append(build.HELM)
    return tuple(dict.fromkeys(needed))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorldScheduling(), "vmevents-world-scheduling")


_SHARED = re.compile(r"""scope=["'](class|module|package|session)["']""")


@functools.cache
def world_of(module: str) -> str | None:
    """What the tests of a module share when they share a fixture wider than one test (an end-to-end world: a
    cluster, KubeVirt, a broker and function processes): the module, or the folder whose conftest holds a session
    fixture (the fuzz suite's); None when each test stands alone. Read from the sources, once per module."""
    path = REPO / module
    for folder in path.parents:
        if folder == REPO / "tests" or REPO / "tests" not in folder.parents:
            break
        conftest = folder / "conftest.py"
        if conftest.is_file() and _SHARED.search(conftest.read_text()):
            return str(folder.relative_to(REPO))
    return module if path.is_file() and _SHARED.search(path.read_text()) else None


class _WorldScheduling:
    """`make test-fast` (pytest-xdist, `--dist loadscope`): the tests that share a world run in one process, so it
    is built once (`world_of`); every other test goes to whichever process is free. xdist's own `loadgroup` cannot
    do it with pytest 9, which no longer reads a node id that xdist rewrites."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getoption("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return world_of(nodeid.split("::", 1)[0]) or nodeid

        return Scheduling(config, log)


@pytest.hookimpl(trylast=True)  # after pytest's own grouping of items by their higher-scoped parameters
def pytest_collection_modifyitems(config, items):
    """A test marked `sim_only` (it needs what a real kube-apiserver cannot be made to do, and says why; faults
    are not such a thing: controlplane/faultproxy.py injects them there) runs on the simulator backend only: its
    real-backend rows are deselected, and counted. A test marked `one_kubevirt` (its decisions do not depend on
    KubeVirt's version) runs in its module's default-version world only: its `other_kubevirt` rows are deselected
    too (docs/control-plane.md, "Which rows each suite runs"). The tests that need the control plane's binaries run
    after all the others, so a cold build (`make test` starts it in the background) runs beside the tests that need
    none; among them, a module whose binaries are built sooner (build.ALL's order) runs sooner, each module's
    items together and in pytest's order."""
    from controlplane import build

    early, late, dropped, repeated = [], [], [], []
    for item in items:  # the real backend's parameters carry the `real` mark (tests/backends.py)
        real_row = item.get_closest_marker("real") is not None
        if real_row and item.get_closest_marker("timeout") is None:
            # The first test of a real world also starts the control plane, installs KubeVirt's CRDs (megabytes
            # of schema the server compiles) and starts virt-controller: more than the default 120 s allows on
            # a loaded 2-core machine.
            item.add_marker(pytest.mark.timeout(REAL_TIMEOUT))
        if real_row and item.get_closest_marker("sim_only"):
            dropped.append(item)
        elif item.get_closest_marker("one_kubevirt") and item.get_closest_marker("other_kubevirt"):
            repeated.append(item)  # its decisions do not depend on KubeVirt's version: the default's row is enough
        else:
            (late if needs_binaries(item) else early).append(item)
    if dropped or repeated:
        config.hook.pytest_deselected(items=dropped + repeated)
    modules: dict[str, list] = {}
    for item in late:
        modules.setdefault(str(item.path), []).append(item)
    rank = {component: i for i, component in enumerate(build.everything())}
    ready = {path: max(rank[c] for part in group for c in components_for(part)) for path, group in modules.items()}
    items[:] = early + [item for path in sorted(modules, key=ready.__getitem__) for item in modules[path]]


_hurried = False


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's timer: the wait is not the test's
def pytest_runtest_protocol(item, nextitem):
    """Before a test that needs the control plane's binaries: wait for the builds of those it needs
    (components_for), building what no one is building, and run the background build at normal priority from the
    first such wait on. A failed build is reported here; each test that needs it then fails with its error.
    While a test that is not marked so runs, build.guard fails it when it asks for a binary."""
    global _hurried
    from controlplane import build

    if needs_binaries(item) and build.go_available():
        waiting = [c for c in components_for(item) if not build.built(c)]
        if waiting:
            say = item.config.pluginmanager.get_plugin("terminalreporter").write_line
            hurried = not _hurried and build.hurry_background()
            _hurried = True
            say(f"\nwaiting for {', '.join(f'{c.name} {c.version}' for c in waiting)} "
                f"(log: {build.background_log()})"
                + ("; the background build runs at normal priority now" if hurried else ""))
            started = time.monotonic()
            for component in waiting:
                try:
                    build.ensure(component, say=say)
                except build.BuildError as exc:
                    say(f"the control plane's build failed: {exc}")
            say(f"ready after {time.monotonic() - started:.0f}s of waiting")
    build.guard = None if needs_binaries(item) else functools.partial(_unmarked, item.nodeid)
    try:
        yield
    finally:
        build.guard = None


def _unmarked(nodeid: str, component) -> None:
    from controlplane import build

    raise build.BuildError(f"{nodeid} needs {component.name} {component.version} but is not marked `real` or "
                           "`built`: mark it, so that it runs after the tests that need no binary (tests/conftest.py) "
                           "instead of waiting for a cold build with every test behind it")

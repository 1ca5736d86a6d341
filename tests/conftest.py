"""Shared fixtures: an isolated environment, kubeconfig helpers and a function served through HTTP."""
from __future__ import annotations

import functools
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


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch):
    """No test sees the developer's cluster or settings."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "CLEANUP_AFTER", "CLEANUP_FAILED", "CLEANUP_DRY_RUN",
                 "CLEANUP_NAMESPACES", "CLEANUP_EXCLUDE_NAMESPACES"):
        monkeypatch.delenv(name, raising=False)


def needs_binaries(item) -> bool:
    """The item needs what controlplane/build.py builds: a real-backend row, or a test marked `built`."""
    return item.get_closest_marker("real") is not None or item.get_closest_marker("built") is not None


@pytest.hookimpl(trylast=True)  # after pytest's own grouping of items by their higher-scoped parameters
def pytest_collection_modifyitems(config, items):
    """A test marked `sim_only` (it needs what a real kube-apiserver cannot be made to do, and says why; faults
    are not such a thing: controlplane/faultproxy.py injects them there) runs on the simulator backend only: its
    real-backend rows are deselected, and counted. The tests that need the control plane's binaries run after
    all the others, in their order, so a cold build (`make test` starts it in the background) runs beside the
    tests that need none."""
    early, late, dropped = [], [], []
    for item in items:  # the real backend's parameters carry the `real` mark (tests/backends.py)
        real_row = item.get_closest_marker("real") is not None
        if real_row and item.get_closest_marker("timeout") is None:
            # The first test of a real world also starts the control plane, installs KubeVirt's CRDs (megabytes
            # of schema the server compiles) and starts virt-controller: more than the default 120 s allows on
            # a loaded 2-core machine.
            item.add_marker(pytest.mark.timeout(REAL_TIMEOUT))
        if real_row and item.get_closest_marker("sim_only"):
            dropped.append(item)
        else:
            (late if needs_binaries(item) else early).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = early + late


_builds_awaited = False


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's timer: the wait is not the test's
def pytest_runtest_protocol(item, nextitem):
    """Before the first test that needs the control plane's binaries: wait for the builds (and build what no
    one is building). A failed build is reported here once; each test that needs it then fails with its error.
    While a test that is not marked so runs, build.guard fails it when it asks for a binary."""
    global _builds_awaited
    if not _builds_awaited and needs_binaries(item):
        _builds_awaited = True
        from controlplane import build

        if build.go_available() and not build.all_built():
            say = item.config.pluginmanager.get_plugin("terminalreporter").write_line
            hurried = build.hurry_background()
            say(f"\nwaiting for the control plane's builds (log: {build.background_log()})"
                + ("; the background build runs at normal priority now" if hurried else ""))
            started = time.monotonic()
            try:
                build.ensure_all(say=say)
                say(f"the control plane's binaries are ready after {time.monotonic() - started:.0f}s of waiting")
            except build.BuildError as exc:
                say(f"the control plane's build failed: {exc}")
    from controlplane import build

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

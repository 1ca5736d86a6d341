"""controlplane/build.py with a stand-in `go` on PATH: builds run side by side, a cached build is reused,
one version's build does not wait on another's, and a failure says which component failed."""
from __future__ import annotations

import functools
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from controlplane import build

FAKE_GO = """#!{python}
import os, sys, time
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("-o") + 1])
log = Path(os.environ["FAKE_GO_LOG"])
name = Path.cwd().name
with log.open("a") as f:
    f.write(f"start {{name}} {{time.monotonic()}}\\n")
time.sleep(float(os.environ.get("FAKE_GO_SLEEP", "0.5")))
if name == os.environ.get("FAKE_GO_FAIL"):
    print("compile error in " + name)
    sys.exit(2)
for package in args[args.index("-o") + 2:]:
    (out / package.rstrip("/").rsplit("/", 1)[-1]).write_text("binary")
with log.open("a") as f:
    f.write(f"end {{name}} {{time.monotonic()}}\\n")
"""


@pytest.fixture
def fake_go(tmp_path, monkeypatch):
    bindir = tmp_path / "gobin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(FAKE_GO.format(python=sys.executable))
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("VMEVENTS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_GO_LOG", str(tmp_path / "go.log"))
    modules = tmp_path / "modules"
    monkeypatch.setattr(build, "MODULES", modules)
    components = []
    for name in ("alpha", "beta", "gamma"):
        (modules / name).mkdir(parents=True)
        (modules / name / "go.mod").write_text(f"module x\n\nrequire example.com/{name} v1.0.0\n")
        components.append(build.Component(name, f"example.com/{name}", (f"./cmd/{name}",), (name,)))
    monkeypatch.setattr(build, "ALL", tuple(components))
    monkeypatch.setattr(build, "NODE_COMPONENTS", ())
    # These tests build fakes in a cache of their own: not what the guard of unmarked tests is for.
    monkeypatch.setattr(build, "guard", None)
    return tmp_path / "go.log"


def spans(log: Path) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        _, name, at = line.split()
        seen.setdefault(name, []).append(float(at))
    return seen


def test_two_builds_run_side_by_side_and_a_cached_one_is_reused(fake_go):
    paths = build.ensure_all(jobs=2)
    assert sorted(paths) == ["alpha-v1.0.0", "beta-v1.0.0", "gamma-v1.0.0"]
    assert all((path / path.name.split("-")[0]).read_text() == "binary" for path in paths.values())
    seen = spans(fake_go)
    assert seen["alpha"][0] < seen["beta"][1] and seen["beta"][0] < seen["alpha"][1]  # overlapping
    assert seen["gamma"][0] >= min(seen["alpha"][1], seen["beta"][1])                 # at most two at once
    fake_go.write_text("")
    started = time.monotonic()
    assert build.ensure_all(jobs=2) == paths
    assert fake_go.read_text() == "" and time.monotonic() - started < 0.5              # nothing rebuilt


def test_one_at_a_time_when_asked(fake_go, monkeypatch):
    monkeypatch.setenv("VMEVENTS_BUILD_JOBS", "1")
    build.ensure_all()
    seen = spans(fake_go)
    assert seen["alpha"][1] <= seen["beta"][0] and seen["beta"][1] <= seen["gamma"][0]


def test_a_failed_build_names_its_component_and_keeps_no_partial_binary(fake_go, monkeypatch):
    monkeypatch.setenv("FAKE_GO_FAIL", "beta")
    with pytest.raises(build.BuildError, match=r"building beta v1\.0\.0 failed \(exit 2\)[\s\S]*compile error in beta"):
        build.ensure_all(jobs=2)
    assert not (build.binary_dir(build.ALL[1]) / "beta").exists()
    assert (build.binary_dir(build.ALL[0]) / "alpha").is_file()  # the others finished and are kept


def test_one_background_build_at_a_time_and_none_when_all_is_built(fake_go, tmp_path):
    release = tmp_path / "release"
    waiter = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"]
    assert build.start_background(waiter) == "started"
    try:
        assert build.start_background(waiter) == "running"   # the first one's child holds the lock
    finally:
        release.write_text("")
    deadline = time.monotonic() + 30
    while build.start_background(waiter) == "running":       # the child exits, its lock with it
        assert time.monotonic() < deadline
        time.sleep(0.1)
    build.ensure_all()
    assert build.start_background(waiter) == "built"


def test_make_test_starts_the_builds_in_the_background_and_returns_at_once(fake_go, tmp_path, monkeypatch):
    from controlplane import __main__ as cli

    started = []
    monkeypatch.setattr(build, "start_background", lambda: started.append(True) or "started")
    assert cli.prepare() == 0 and started == [True]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may lower a nice value")
def test_a_waiter_gives_the_background_build_its_normal_priority_back(fake_go, tmp_path):
    release = tmp_path / "release"
    waiter = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"]
    assert build.hurry_background() is False                   # nothing in the background
    assert build.start_background(waiter) == "started"
    try:
        pid = int((build.cache_root() / ".background.pid").read_text())
        deadline = time.monotonic() + 10
        while os.getpriority(os.PRIO_PROCESS, pid) != 15:    # `nice -n 15` has exec'd the waiter
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert build.hurry_background() is True
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0
    finally:
        release.write_text("")
    deadline = time.monotonic() + 30
    while build.hurry_background():                            # gone with its lock: nothing to hurry
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_unmarked_test_that_asks_for_a_binary_fails_at_once_even_when_it_is_cached(fake_go, monkeypatch):
    """tests/conftest.py sets build.guard while an unmarked test runs: it runs before the builds are awaited, and
    waiting in it for a cold build would hold up every test after it."""
    from tests.conftest import _unmarked

    alpha = build.ALL[0]
    build.ensure(alpha)  # cached now
    monkeypatch.setattr(build, "guard", functools.partial(_unmarked, "tests/x.py::test_y"))
    with pytest.raises(build.BuildError, match=r"tests/x.py::test_y needs alpha v1.0.0 but is not marked `real`"):
        build.ensure(alpha)

"""controlplane.kubevirt.VirtController restarts virt-controller when it exits, as the kubelet restarts a crashed
container: after a backoff that doubles per exit up to a cap and starts again from the first after a long run, and
never after stop(). virt-controller exits when an outage outlasts its lease's renew deadline (docs/control-plane.md).
A stand-in process plays it here: each run appends a line to a file, and exits with code 255 when told to."""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace

from controlplane.kubevirt import VirtController

# Exits 255 ("leaderelection lost": golog.Fatal) while the file has fewer than `crashes` lines, else runs on.
PLAYER = """
import sys, time
runs = open(sys.argv[1], "a+")
runs.write("run\\n"); runs.flush(); runs.seek(0)
if len(runs.read().split()) <= int(sys.argv[2]):
    sys.exit(255)
time.sleep(60)
"""


def _controller(tmp_path, crashes: int, backoff=(0.2, 0.5, 60.0)) -> tuple[VirtController, object]:
    runs = tmp_path / "runs"
    controller = VirtController(SimpleNamespace(workdir=tmp_path), "v0.0.0", backoff=backoff)
    controller.run([sys.executable, "-c", PLAYER, str(runs), str(crashes)])
    return controller, runs


def _eventually(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_each_exit_is_restarted_after_a_doubling_backoff_up_to_its_cap(tmp_path):
    controller, runs = _controller(tmp_path, crashes=3)
    try:
        _eventually(lambda: runs.exists() and len(runs.read_text().split()) == 4 and controller.running())
        assert [(e.code, e.restart_in) for e in controller.exits] == [(255, 0.2), (255, 0.4), (255, 0.5)]
        assert "restarting in" in controller.log.read_text()
    finally:
        controller.stop()
    assert not controller.running()


def test_a_long_run_resets_the_backoff(tmp_path):
    controller, runs = _controller(tmp_path, crashes=2, backoff=(0.2, 5.0, 0.0))  # every run counts as long
    try:
        _eventually(lambda: runs.exists() and len(runs.read_text().split()) == 3 and controller.running())
        assert [e.restart_in for e in controller.exits] == [0.2, 0.2]
    finally:
        controller.stop()


def test_nothing_is_restarted_after_stop(tmp_path):
    controller, runs = _controller(tmp_path, crashes=0)
    _eventually(lambda: runs.exists() and controller.running())
    controller.stop()
    time.sleep(0.5)
    assert runs.read_text().split() == ["run"] and controller.exits == [] and not controller.running()

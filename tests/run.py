"""`make test`: the whole suite as two pytest runs side by side, the tests that need no binary and those that do.

The first half (everything but the `real` rows and the `built` tests) spends most of its time waiting on simulated
clusters and brokers, and the second on a real control plane that answers in its own time: on two cores, each
leaves most of the CPU to the other. Run one after the other they took the sum of the two; side by side, the longer
of them. The second half's first tests also wait for the control plane's builds (tests/conftest.py), which the
first half's run covers.

The first half prints as it runs; the second writes to `.run/test-binaries.log` (or VMEVENTS_TEST_LOG), printed
when the first half has ended and followed until the second has. The exit status is the first failure's (pytest's
5, "no tests collected", counts as success: a selection can be empty). Any arguments go to both runs.

    python -m tests.run [PYTEST ARGS...]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = Path(os.environ.get("VMEVENTS_TEST_LOG") or REPO / ".run" / "test-binaries.log")
HALVES = (("the tests that need no binary", "not real and not built"),
          ("the tests that need the control plane's binaries", "real or built"))
NO_TESTS = 5
# The second half in this many pytest-xdist processes, each with a control plane of its own (tests/backends.py
# starts one per process), a world's tests kept in one of them (tests/conftest.py `world_of`): its tests wait on
# kube-apiserver, KubeVirt and guests under TCG far more than they compute (docs/control-plane.md, "Where the time
# goes"). VMEVENTS_BINARY_JOBS=1 runs it in one process.
BINARY_JOBS = int(os.environ.get("VMEVENTS_BINARY_JOBS") or 2)


def _follow(log: Path, process: subprocess.Popen, out) -> None:
    """Copy what `log` holds to `out`, and what is written to it until `process` has exited."""
    with open(log, "rb") as source:
        while True:
            chunk = source.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            if process.poll() is not None:
                rest = source.read()
                out.write(rest)
                out.flush()
                return
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    LOG.parent.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pytest", *argv]
    (first_name, first_marks), (second_name, second_marks) = HALVES
    with open(LOG, "wb") as log:
        spread = ["-n", str(BINARY_JOBS), "--dist", "loadscope"] if BINARY_JOBS > 1 else []
        second = subprocess.Popen([*command, "-m", second_marks, *spread, "--durations=40"], cwd=REPO, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    print(f"=== {first_name} (-m '{first_marks}'); {second_name} run beside them (-m '{second_marks}'), "
          f"printed when these end: {LOG} ===", flush=True)
    try:
        first_code = subprocess.call([*command, "-m", first_marks], cwd=REPO)
        print(f"\n=== {second_name} (-m '{second_marks}'), from {LOG} ===", flush=True)
        _follow(LOG, second, sys.stdout.buffer)
        second_code = second.wait()
    except KeyboardInterrupt:
        second.terminate()
        second.wait()
        raise
    codes = {first_name: first_code, second_name: second_code}
    print("\n=== " + "; ".join(f"{name}: {'passed' if code in (0, NO_TESTS) else f'FAILED (exit {code})'}"
                              for name, code in codes.items()) + " ===", flush=True)
    return next((code for code in codes.values() if code not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

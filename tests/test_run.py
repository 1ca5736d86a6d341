"""tests/run.py (`make test`): both halves run, the second's log is printed after the first's output, and the
status is a failure when either half fails, success when a half selects nothing."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

PASSING = "def test_fine():\n    pass\n"
FAILING_REAL = "import pytest\n\n@pytest.mark.real\ndef test_broken():\n    assert False, 'the real half failed'\n"


def _run(tmp_path, source: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_sample.py"
    test.write_text(source)
    return subprocess.run([sys.executable, "-m", "tests.run", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), "-c", "/dev/null", str(test)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "VMEVENTS_TEST_LOG": str(tmp_path / "binaries.log")})


def test_a_half_that_selects_nothing_is_not_a_failure(tmp_path):
    result = _run(tmp_path, PASSING)
    assert result.returncode == 0, result.stdout + result.stderr
    # the second half selects nothing: pytest says "1 deselected", or, in pytest-xdist's processes (tests/run.py
    # BINARY_JOBS), each deselecting on its own, "no tests ran"
    assert "1 passed" in result.stdout and ("1 deselected" in result.stdout or "no tests ran" in result.stdout)


def test_a_failure_in_the_half_that_runs_beside_fails_the_run_and_is_printed(tmp_path):
    result = _run(tmp_path, PASSING + "\n\n" + FAILING_REAL)
    assert result.returncode == 1, result.stdout + result.stderr
    first, _, second = result.stdout.partition(f"from {tmp_path / 'binaries.log'} ===")
    assert "1 passed" in first and "the real half failed" in second
    assert "FAILED (exit 1)" in result.stdout.splitlines()[-1]

"""localknative.serving.stop_group: how a function's process group is stopped. With leader_first the first signal
reaches the leader alone, which stops its children itself, as gunicorn's master does with its workers on SIGINT;
sent to the whole group, gunicorn's worker took two signals and now and then hung until the SIGKILL."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from localknative.serving import stop_group

# A leader that, on SIGINT, sends its child SIGTERM and exits once the child has; the child records each signal.
# The leader waits 0.3 s before it sends: a signal to the whole group reaches the child first even when the sender
# is descheduled between the group's members (in a loaded rehearsal the child once recorded the leader's SIGTERM
# before the group's SIGINT).
LEADER = textwrap.dedent("""
    import signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", '''
    import signal, sys, time
    def record(sig, _):
        with open(sys.argv[1], "a") as f:
            f.write(signal.Signals(sig).name + "\\\\n")
        if sig == signal.SIGTERM:
            sys.exit(0)
    signal.signal(signal.SIGINT, record)
    signal.signal(signal.SIGTERM, record)
    print("ready", flush=True)
    time.sleep(60)
    ''', sys.argv[1]], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    def stop(*_):
        time.sleep(0.3)
        child.terminate()
        child.wait()
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    signal.pause()
""")


def _run(tmp_path, **kwargs) -> list[str]:
    record = tmp_path / "signals"
    record.touch()
    proc = subprocess.Popen([sys.executable, "-c", LEADER, str(record)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    stop_group(proc, **kwargs)
    proc.stdout.close()
    return record.read_text().split()


def test_leader_first_reaches_the_children_only_through_the_leader(tmp_path):
    assert _run(tmp_path, first=signal.SIGINT, leader_first=True) == ["SIGTERM"]


def test_the_group_takes_the_first_signal_by_default(tmp_path):
    assert _run(tmp_path, first=signal.SIGINT)[0] == "SIGINT"

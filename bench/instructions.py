"""`make bench`: instructions per irrelevant event, each function next to the no-op, counted by callgrind.

Throughput on a shared 2-core machine moves by ±10 % between runs; the number of instructions an event
costs does not (two counts of the same build agree within 1 %). Each function's app is driven in-process
(bench/inprocess.py) under `valgrind --tool=callgrind`, with instrumentation off through start-up and
collection on only while the N measured events run, so the count is the events' alone: Flask's and
functions-framework's request handling, the function's intake, prefilter and log line, for the event of
bench/events.py. The ratio function ÷ no-op is what the function adds per event on top of answering at all
(gunicorn's HTTP parsing and the socket work are not counted: they are the same for both).

`--served` counts the gunicorn worker whole instead (`count_served`): what an event costs the process that
serves it, so function ÷ no-op there is the throughput ratio of a worker with a CPU to itself, free of the
machine's load (bench/irrelevant.py reports it next to the wrk rates).

    python -m bench.instructions [--events 200] [--served] [--json] [FUNCTION ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.events import IRRELEVANT, NOOP

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVENTS = 200
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


class Unavailable(RuntimeError):
    """valgrind (or its callgrind_control) is not installed."""


def available() -> bool:
    return bool(shutil.which("valgrind") and shutil.which("callgrind_control"))


def count(function: str, events: int = EVENTS) -> int:
    """Instructions callgrind counted for `events` of `function`'s irrelevant event (bench/events.py)."""
    if not available():
        raise Unavailable("valgrind is not installed (apt-get install -y valgrind)")
    with tempfile.TemporaryDirectory(prefix="vmevents-callgrind-") as tmp:
        env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        # sys.executable, not a `python3` on PATH: valgrind does not follow a shim's exec into the interpreter.
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no", "--toggle-collect=*qsort*",
             f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, "-m", "bench.inprocess", function,
             str(events), "--callgrind"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"callgrind of {function} failed (exit {done.returncode}):\n{tail}")
    return int(found[-1])


_TOTALS = re.compile(r"^totals:\s*(\d+)", re.MULTILINE)


def count_served(function: str, events: int = EVENTS) -> float:
    """Instructions per event in the gunicorn worker of a functions-framework server (as bench/irrelevant.py
    starts it) answering `function`'s irrelevant event, sent one after the other on one keep-alive connection:
    gunicorn's HTTP parsing and response writing, Flask, the function, every thread's. What one event costs the
    worker whole, so function ÷ no-op is the throughput ratio of a worker that has the CPU to itself (the
    kernel's socket work, the same for both, is not counted). A forked worker cannot be switched on and off
    (vgdb does not reach it), so the worker is counted whole, from fork to exit, twice: after 0 and after
    `events` events (each past a warm-up); the difference is the events'."""
    if not available():
        raise Unavailable("valgrind is not installed (apt-get install -y valgrind)")
    return (_served_total(function, events) - _served_total(function, 0)) / events


def _served_total(function: str, events: int) -> int:
    import http.client
    import signal
    import time

    from bench.vmi_cleanup import _free_port, _tree
    from localknative.serving import stop_group

    case = IRRELEVANT[function]
    headers, body = case.event()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="vmevents-callgrind-") as tmp:
        env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               **case.env(), "THREADS": "1"}  # gunicorn's sync worker: one thread, so a count does not
        # depend on how valgrind schedules the gthread worker's poller and pool threads (it did, by ±10 %)
        with open(f"{tmp}/server.log", "wb") as log:
            server = subprocess.Popen(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p", sys.executable, "-m",
                 "functions_framework", "--target", "handle", "--source", case.source, "--signature-type", "http",
                 "--host", "127.0.0.1", "--port", str(port)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while True:  # under valgrind the start takes a while
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{function} did not start under callgrind:\n"
                                       + Path(tmp, "server.log").read_text(errors="replace")[-2000:])
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                try:
                    conn.request("GET", "/")
                    conn.getresponse().read()
                    break
                except OSError:
                    conn.close()
                    time.sleep(0.2)
            workers = [pid for pid in _tree(server.pid) if pid != server.pid]
            for _ in range(20 + events):  # 20: first-request work, as in bench/inprocess.py
                conn.request("POST", "/", body=body, headers=dict(headers))
                answer = conn.getresponse()
                answer.read()
                if answer.status != case.status:
                    raise RuntimeError(f"{function} answered {answer.status} under callgrind")
            conn.close()
        finally:
            stop_group(server, signal.SIGTERM, wait=120)
        if len(workers) != 1:
            raise RuntimeError(f"{function}: expected one gunicorn worker under callgrind, found {workers}")
        dump = Path(tmp, f"cg.{workers[0]}")
        found = _TOTALS.findall(dump.read_text()) if dump.exists() else []
        if not found:
            raise RuntimeError(f"callgrind of the served {function} wrote no totals:\n"
                               + Path(tmp, "server.log").read_text(errors="replace")[-2000:])
        return int(found[-1])


def per_event(functions: list[str], events: int = EVENTS, parallel: int = 2,
              served: bool = False) -> dict[str, float]:
    """Instructions per event for each of `functions` and the no-op (each a process of its own): in-process
    (`count`), or `served` by gunicorn (`count_served`)."""
    names = [NOOP.function, *[f for f in functions if f != NOOP.function]]
    counted = (lambda name: count_served(name, events)) if served else (lambda name: count(name, events) / events)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return dict(zip(names, pool.map(counted, names), strict=True))


def render(figures: dict[str, float], events: int, served: bool = False) -> str:
    noop = figures[NOOP.function]
    how = "served by gunicorn, the worker whole" if served else "in-process WSGI"
    lines = [f"instructions per irrelevant event (callgrind, {how}, {events} events each; ratio to the no-op)",
             f"  {'function':<22}{'instructions':>14}{'ratio':>9}"]
    for name, value in figures.items():
        lines.append(f"  {name:<22}{value:>14,.0f}{value / noop:>8.3f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("functions", nargs="*", help=f"default: all of {', '.join(IRRELEVANT)}")
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--served", action="store_true",
                        help="count the gunicorn worker serving the events (count_served), not the app in-process")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not available():
        print("instructions per event: skipped: valgrind is not installed (apt-get install -y valgrind)")
        return 0
    figures = per_event(args.functions or list(IRRELEVANT), args.events, served=args.served)
    print(render(figures, args.events, args.served))
    if args.json:
        print(json.dumps({"events": args.events, "served": args.served, "instructions_per_event": figures},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

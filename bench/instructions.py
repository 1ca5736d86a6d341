"""`make bench`: instructions per irrelevant event, each function next to the no-op, counted by callgrind.

Throughput on a shared 2-core machine moves by ±10 % between runs; the number of instructions an event
costs does not (two counts of the same build agree within 1 %). Each function's app is driven in-process
(bench/inprocess.py) under `valgrind --tool=callgrind`, with instrumentation off through start-up and
collection on only while the N measured events run, so the count is the events' alone: Flask's and
functions-framework's request handling, the function's intake, prefilter and log line, for the event of
bench/events.py. The ratio function ÷ no-op is what the function adds per event on top of answering at all
(gunicorn's HTTP parsing and the socket work are not counted: they are the same for both).

`--served` counts the events a gunicorn worker serves instead (`count_served`): each request whole, from accept
to the closed connection (gunicorn's HTTP parsing and response writing too), and nothing else of the worker
(bench/served.py), so function ÷ no-op there is the throughput ratio of a worker with a CPU to itself, free of
the machine's load (bench/irrelevant.py reports it next to the wrk rates). `--events` defaults to 1,000 there.

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

from bench.events import IRRELEVANT, NOOP, baseline, case_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVENTS = 200
SERVED_EVENTS = 1000  # a request is ~2.5 in-process events; enough that a collection of the GC averages out
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


def count_served(function: str, events: int = SERVED_EVENTS) -> float:
    """Instructions per event in the gunicorn worker of a functions-framework server (as bench/irrelevant.py
    starts it, with gunicorn's sync worker) answering `function`'s irrelevant event `events` times, each on a
    connection of its own: gunicorn's HTTP parsing and response writing, Flask, the function, the cyclic GC's
    collections that land in a request. Only the events are counted (bench/served.py: each is handled inside
    libc's qsort, the one place callgrind collects), not the worker's start-up, idle loop and exit, nor the
    readiness probe and the 20 warm-up events before them, so function ÷ no-op is the throughput ratio of a worker
    that has the CPU to itself (the kernel's socket work and the log line's write(2) are not counted)."""
    if not available():
        raise Unavailable("valgrind is not installed (apt-get install -y valgrind)")
    return _served_total(function, events) / events


WARMUP = 20  # first-request work, as in bench/inprocess.py


def _served_total(function: str, events: int) -> int:
    import http.client
    import signal
    import time

    from bench.served import COUNT_AFTER
    from bench.vmi_cleanup import _free_port, _tree
    from localknative.serving import stop_group

    case = case_of(function)
    headers, body = case.event()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="vmevents-callgrind-") as tmp:
        env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               **case.env(), "THREADS": "1",  # gunicorn's sync worker: one thread, a connection per request
               COUNT_AFTER: str(1 + WARMUP)}  # the readiness probe's GET and the warm-up are not counted
        with open(f"{tmp}/server.log", "wb") as log:
            server = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=*qsort*",
                 f"--callgrind-out-file={tmp}/cg.%p", sys.executable, "-m", "bench.served", "--target", "handle",
                 "--source", case.source, "--signature-type", "http", "--host", "127.0.0.1", "--port", str(port)],
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
            conn.close()
            workers = [pid for pid in _tree(server.pid) if pid != server.pid]
            for _ in range(WARMUP + events):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                conn.request("POST", "/", body=body, headers=dict(headers))
                answer = conn.getresponse()
                answer.read()
                conn.close()
                if answer.status != case.status:
                    raise RuntimeError(f"{function} answered {answer.status} under callgrind")
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
    """Instructions per event for each of `functions` and the no-op answering the same event (each a process of its
    own; `baseline` names it): in-process (`count`), or `served` by gunicorn (`count_served`)."""
    functions = [f for f in functions if f in IRRELEVANT and f != NOOP.function]
    names = list(dict.fromkeys([NOOP.function, *(baseline(f) for f in functions), *functions]))
    counted = (lambda name: count_served(name, events)) if served else (lambda name: count(name, events) / events)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return dict(zip(names, pool.map(counted, names), strict=True))


def render(figures: dict[str, float], events: int, served: bool = False) -> str:
    how = "served by gunicorn, each request whole" if served else "in-process WSGI"
    lines = [f"instructions per irrelevant event (callgrind, {how}, {events} events each; ratio to the no-op answering "
             "the same event)", f"  {'function':<32}{'instructions':>14}{'ratio':>9}"]
    for name, value in figures.items():
        base = figures.get(baseline(name)) if name in IRRELEVANT and name != NOOP.function else None
        lines.append(f"  {name:<32}{value:>14,.0f}" + (f"{value / base:>8.3f}x" if base else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("functions", nargs="*", help=f"default: all of {', '.join(IRRELEVANT)}")
    parser.add_argument("--events", type=int, help=f"default: {EVENTS}, or {SERVED_EVENTS} with --served")
    parser.add_argument("--served", action="store_true",
                        help="count the gunicorn worker serving the events (count_served), not the app in-process")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not available():
        print("instructions per event: skipped: valgrind is not installed (apt-get install -y valgrind)")
        return 0
    events = args.events or (SERVED_EVENTS if args.served else EVENTS)
    figures = per_event(args.functions or list(IRRELEVANT), events, served=args.served)
    print(render(figures, events, args.served))
    if args.json:
        print(json.dumps({"events": events, "served": args.served, "instructions_per_event": figures},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: instructions per irrelevant event, each function next to the no-op, counted by callgrind.

Throughput on a shared 2-core machine moves by ±10 % between runs; the number of instructions an event
costs does not (two counts of the same build agree within 1 %). Each function's app is driven in-process
(bench/inprocess.py) under `valgrind --tool=callgrind`, with instrumentation off through start-up and
collection on only while the N measured events run, so the count is the events' alone: Flask's and
functions-framework's request handling, the function's intake, prefilter and log line, for the event of
bench/events.py. The ratio function ÷ no-op is what the function adds per event on top of answering at all
(gunicorn's HTTP parsing and the socket work are not counted: they are the same for both).

    python -m bench.instructions [--events 200] [--json] [FUNCTION ...]
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


def per_event(functions: list[str], events: int = EVENTS, parallel: int = 2) -> dict[str, float]:
    """Instructions per event for each of `functions` and the no-op (each a process of its own)."""
    names = [NOOP.function, *[f for f in functions if f != NOOP.function]]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        counts = dict(zip(names, pool.map(lambda name: count(name, events), names), strict=True))
    return {name: counts[name] / events for name in names}


def render(figures: dict[str, float], events: int) -> str:
    noop = figures[NOOP.function]
    lines = [f"instructions per irrelevant event (callgrind, in-process WSGI, {events} events each; "
             f"ratio to the no-op)",
             f"  {'function':<22}{'instructions':>14}{'ratio':>9}"]
    for name, value in figures.items():
        lines.append(f"  {name:<22}{value:>14,.0f}{value / noop:>8.3f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("functions", nargs="*", help=f"default: all of {', '.join(IRRELEVANT)}")
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not available():
        print("instructions per event: skipped: valgrind is not installed (apt-get install -y valgrind)")
        return 0
    figures = per_event(args.functions or list(IRRELEVANT), args.events)
    print(render(figures, args.events))
    if args.json:
        print(json.dumps({"events": args.events, "instructions_per_event": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

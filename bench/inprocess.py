"""One function's WSGI app driven in-process with one event, N times: for profilers and instruction counts.

The load benchmarks (bench/irrelevant.py) measure throughput through gunicorn and the kernel, which on a
shared 2-core machine moves by ±10 % from one minute to the next. This drives the same app that
functions-framework serves (`functions_framework.create_app`, the function's own `handle`) with the WSGI
environ gunicorn would build for the event, so a profiler or `valgrind --tool=callgrind` sees only the
Python work per event, and two runs differing only in N give the instructions of N events
(bench/instructions.py). The gunicorn HTTP parsing and the socket work it leaves out are the same for
the function and the no-op.

    python -m bench.inprocess FUNCTION N [--profile]      # FUNCTION: a name in bench.events.IRRELEVANT, or
                                                          # no-op/FUNCTION (the no-op answering its event)
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environ_for(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """The WSGI environ gunicorn (gunicorn/http/wsgi.py `create`) builds for a POST / with these headers."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/", "RAW_URI": "/", "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080", "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "40000", "HTTP_HOST": "127.0.0.1:8080",
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.multithread": True, "wsgi.multiprocess": False,
        "wsgi.run_once": False, "wsgi.errors": sys.stderr, "CONTENT_LENGTH": str(len(body)),
    }
    for key, value in headers.items():
        if key.lower() == "content-type":
            environ["CONTENT_TYPE"] = value
        else:
            environ["HTTP_" + key.upper().replace("-", "_")] = value
    return environ


def load_app(source: str, env: Mapping[str, str]) -> Callable:
    """The Flask app functions-framework builds for `--target handle --source SOURCE --signature-type http`."""
    os.environ.update(env)
    from functions_framework import create_app

    return create_app("handle", os.path.join(REPO, source), "http")


served = 0  # events served by this process, for the log line check


def serve(app: Callable, headers: Mapping[str, str], body: bytes, times: int) -> list[int]:
    """POST the event `times` times; the statuses answered."""
    template = environ_for(headers, body)
    statuses: list[int] = []

    def start_response(status: str, _headers: list, _exc_info: Any = None) -> None:
        statuses.append(int(status.split(" ", 1)[0]))

    global served
    served += times
    for _ in range(times):
        environ = dict(template)
        environ["wsgi.input"] = io.BytesIO(body)
        answer = app(environ, start_response)
        try:
            for _chunk in answer:
                pass
        finally:
            close = getattr(answer, "close", None)
            if close:
                close()
    return statuses


def under_callgrind(measured: Callable[[], list[int]], idle: Callable[[], Any]) -> list[int]:
    """Run `measured` so that callgrind counts exactly its instructions (bench/instructions.py starts it with
    --instr-atstart=no --collect-atstart=no --toggle-collect=qsort): switch instrumentation on (vgdb runs the
    command while this process keeps running Python, `idle`), then run `measured` as the comparison callback
    of a two-element libc qsort, the one place collection is on."""
    import ctypes
    import subprocess

    control = subprocess.Popen(["callgrind_control", "--instr=on", str(os.getpid())],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while control.poll() is None:
        idle()
    if control.returncode != 0:
        raise RuntimeError("callgrind_control could not switch instrumentation on: is this under callgrind?")
    result: list[list[int]] = []
    compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda _a, _b: result.append(measured()) or 0)
    pair = (ctypes.c_int * 2)(1, 2)
    libc = ctypes.CDLL(None)
    libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare)
    return result[0]


def main(argv: list[str] | None = None) -> int:
    from bench.events import IRRELEVANT, case_of

    parser = argparse.ArgumentParser(prog="python -m bench.inprocess")
    parser.add_argument("function", help=f"one of {', '.join(IRRELEVANT)}, or no-op/FUNCTION: the no-op answering "
                                         "FUNCTION's event")
    parser.add_argument("times", type=int)
    parser.add_argument("--profile", metavar="FILE", help="cProfile the N events into FILE (pstats)")
    parser.add_argument("--callgrind", action="store_true",
                        help="running under bench.instructions' callgrind: count the N events only")
    args = parser.parse_args(argv)
    try:
        case = case_of(args.function)
    except KeyError:
        parser.error(f"no such function: {args.function}")
    # The one log line per event goes to a file, as gunicorn's stdout would; it is checked below.
    log = tempfile.NamedTemporaryFile(prefix="vmevents-inprocess-", suffix=".log")
    os.dup2(log.fileno(), 1)
    app = load_app(case.source, case.env())
    headers, body = case.event()
    serve(app, headers, body, 20)  # first-request work (Flask's, the function's) is not per event
    if args.callgrind:
        statuses = under_callgrind(lambda: serve(app, headers, body, args.times),
                                   lambda: serve(app, headers, body, 1))
    elif args.profile:
        import cProfile

        profiler = cProfile.Profile()
        statuses = profiler.runcall(serve, app, headers, body, args.times)
        profiler.dump_stats(args.profile)
    else:
        statuses = serve(app, headers, body, args.times)
    wrong = sorted({s for s in statuses if s != case.status})
    if wrong:
        print(f"{args.function} answered {wrong} (expected {case.status})", file=sys.stderr)
        return 1
    if case.verdict is not None:
        lines = [json.loads(line) for line in open(log.name, "rb").read().splitlines() if line.startswith(b"{")]
        verdicts = {line.get("verdict") for line in lines}
        if len(lines) != served or verdicts != {case.verdict}:
            print(f"{args.function} logged {len(lines)} lines for {served} events, verdicts {verdicts} "
                  f"(expected one line each, {case.verdict!r})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

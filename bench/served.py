"""`python -m functions_framework`, with each request the gunicorn worker handles after the first few counted alone.

What `bench.instructions.count_served` starts under `valgrind --tool=callgrind --collect-atstart=no
--toggle-collect=*qsort*`: functions-framework's own command line (`functions_framework._cli`), with gunicorn's sync
worker (`THREADS=1`) handling each request after the first `VMEVENTS_COUNT_AFTER` inside the comparison callback of
a two-element libc `qsort`, the one place callgrind collects (as bench/inprocess.py does in-process). So the
worker's count is the counted requests' alone, from accept to the closed connection: gunicorn's HTTP parsing and
response writing, Flask, the function. Its start-up, its idle loop (the arbiter's heartbeat, the poll between
requests), its exit and the uncounted requests (the readiness probe, the warm-up) are not in it, so nothing is a
difference of two whole-worker totals (which wobbled by tens of thousands of instructions per event:
docs/hot-path.md). What a request does is all counted, the cyclic GC's collections that land in it included.

    VMEVENTS_COUNT_AFTER=21 python -m bench.served --target handle --source ... --signature-type http ...
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

COUNT_AFTER = "VMEVENTS_COUNT_AFTER"


def count_requests_after(skipped: int) -> None:
    """Make gunicorn's sync worker handle every request after the first `skipped` inside libc's qsort."""
    from gunicorn.workers.sync import SyncWorker

    handle = SyncWorker.handle
    libc = ctypes.CDLL(None)
    compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    pair = (ctypes.c_int * 2)(1, 2)
    seen = 0

    def counted(self: SyncWorker, listener: Any, client: Any, addr: Any) -> None:
        nonlocal seen
        seen += 1
        if seen <= skipped:
            handle(self, listener, client, addr)
            return
        failed: list[BaseException] = []

        def compare(_a: Any, _b: Any) -> int:
            try:
                handle(self, listener, client, addr)
            except BaseException as exc:  # noqa: BLE001 - raised again below, outside the C callback
                failed.append(exc)
            return 0

        libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare_type(compare))
        if failed:
            raise failed[0]

    SyncWorker.handle = counted  # type: ignore[method-assign]


def main() -> None:
    count_requests_after(int(os.environ.get(COUNT_AFTER, "0")))
    from functions_framework._cli import _cli

    sys.argv[0] = "python -m functions_framework"
    _cli(prog_name="python -m functions_framework")


if __name__ == "__main__":
    main()

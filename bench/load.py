"""Load generators for the benchmark: the same POST, over keep-alive connections, as fast as answered.

`wrk` (with a Lua script for the body and ce-* headers) when it is on PATH: it is C and LuaJIT, so on
a 2-core machine it leaves the servers the CPU it does not need. Otherwise a Python client
(http.client, one keep-alive connection per thread), which competes with the server for the CPU and
so understates absolute rates; ratios measured with the same client stay comparable.
Requests go to 127.0.0.1 only.
"""
from __future__ import annotations

import http.client
import json
import math
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Load:
    """How hard to push: for `seconds`, or until `max_requests` answers, whichever comes first."""

    seconds: int = 5
    connections: int = 8
    threads: int = 1
    max_requests: int | None = None


@dataclass(frozen=True)
class Result:
    requests: int       # answered requests (any status)
    seconds: float
    p50_ms: float
    p99_ms: float
    failed: int         # non-2xx answers and socket errors

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class LoadError(RuntimeError):
    pass


def choose(prefer: str = "auto") -> Generator:
    """`wrk` when it is on PATH (or asked for), else the Python client."""
    if prefer == "python" or (prefer == "auto" and not shutil.which("wrk")):
        return PythonClient()
    if not shutil.which("wrk"):
        raise LoadError("wrk is not on PATH; install it (apt-get install -y wrk) or use the Python client.")
    return Wrk()


class Generator:
    name = "?"

    def describe(self, load: Load) -> str:
        raise NotImplementedError

    def run(self, port: int, headers: Mapping[str, str], body: bytes, load: Load) -> Result:
        raise NotImplementedError


# -- wrk ------------------------------------------------------------------------------------------
_LUA = """\
wrk.method = "POST"
local f = assert(io.open({body_path}, "rb"))
wrk.body = f:read("*a")
f:close()
wrk.headers = {{{headers}}}
{limit}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCH {{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"status_errors":%d,"socket_errors":%d}}\\n', summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))
end
"""

# Each wrk thread has its own Lua state: each stops itself after its share of max_requests.
_LIMIT = """\
local answered, limit = 0, {per_thread}
response = function(status, headers, body)
  answered = answered + 1
  if answered >= limit then wrk.thread:stop() end
end
"""


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is also a valid Lua string literal


class Wrk(Generator):
    name = "wrk"

    def __init__(self, prefix: list[str] | None = None):
        self.prefix = list(prefix or [])  # a command wrk runs under: bench/irrelevant.py pins it with taskset

    def describe(self, load: Load) -> str:
        version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return (f"{version.split(' [')[0] or 'wrk'}: -t{load.threads} -c{load.connections} -d{load.seconds}s, "
                f"HTTP/1.1 keep-alive, Lua script sets the body and ce-* headers")

    def run(self, port: int, headers: Mapping[str, str], body: bytes, load: Load) -> Result:
        with tempfile.TemporaryDirectory(prefix="vmevents-wrk-") as tmp:
            body_path = Path(tmp, "body")
            body_path.write_bytes(body)
            limit = ""
            if load.max_requests:
                limit = _LIMIT.format(per_thread=math.ceil(load.max_requests / load.threads))
            script = Path(tmp, "post.lua")
            script.write_text(_LUA.format(
                body_path=_lua_string(str(body_path)), limit=limit,
                headers=", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items())))
            # wrk sleeps the whole -d even when every thread stopped early: keep it short for small runs.
            seconds = 1 if load.max_requests and load.seconds > 1 else load.seconds
            done = subprocess.run(
                [*self.prefix, "wrk", f"-t{load.threads}", f"-c{load.connections}", f"-d{seconds}s", "--timeout", "10s",
                 "-s", str(script), f"http://127.0.0.1:{port}/"],
                capture_output=True, text=True, timeout=seconds + 30)
        lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH ")]
        if done.returncode != 0 or not lines:
            raise LoadError(f"wrk failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        stats = json.loads(lines[-1][len("BENCH "):])
        return Result(requests=stats["requests"], seconds=stats["duration_us"] / 1e6,
                      p50_ms=stats["p50_us"] / 1000, p99_ms=stats["p99_us"] / 1000,
                      failed=stats["status_errors"] + stats["socket_errors"])


# -- Python fallback ------------------------------------------------------------------------------
class PythonClient(Generator):
    name = "python"

    def describe(self, load: Load) -> str:
        threads = max(load.connections, 1)
        return (f"Python http.client: {threads} threads, one keep-alive connection each, {load.seconds}s "
                f"(it shares the CPU with the servers: absolute rates are understated, ratios hold)")

    def run(self, port: int, headers: Mapping[str, str], body: bytes, load: Load) -> Result:
        deadline = time.perf_counter() + load.seconds
        budget = [load.max_requests or math.inf]
        lock = threading.Lock()
        latencies: list[float] = []
        failed = [0]

        def worker() -> None:
            mine, bad = [], 0
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                while time.perf_counter() < deadline:
                    with lock:
                        if budget[0] <= 0:
                            break
                        budget[0] -= 1
                    began = time.perf_counter()
                    try:
                        conn.request("POST", "/", body=body, headers=dict(headers))
                        response = conn.getresponse()
                        response.read()
                        if not 200 <= response.status < 300:
                            bad += 1
                    except (OSError, http.client.HTTPException):
                        bad += 1
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                        continue
                    mine.append(time.perf_counter() - began)
            finally:
                conn.close()
                with lock:
                    latencies.extend(mine)
                    failed[0] += bad

        began = time.perf_counter()
        workers = [threading.Thread(target=worker, daemon=True) for _ in range(max(load.connections, 1))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - began
        if not latencies:
            raise LoadError(f"no request to 127.0.0.1:{port} was answered ({failed[0]} failed)")
        cuts = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
        return Result(requests=len(latencies), seconds=elapsed, p50_ms=cuts[49] * 1000,
                      p99_ms=cuts[98] * 1000, failed=failed[0])

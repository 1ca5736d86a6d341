"""A real Alertmanager on loopback, and a local webhook receiver, for alert-forwarder's tests and story.

`Alertmanager` runs Debian's `prometheus-alertmanager` (installed by .ci/run) on 127.0.0.1 with a
free port, a temporary storage directory, clustering off, and a config that groups by
alertname/namespace with a short group_wait and sends every group to a `Receiver` (with
send_resolved), so grouping and resolution are observable from both sides: Alertmanager's API v2
and what its webhook delivered. `Receiver` also stands in for a plain or Slack webhook.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml

from localknative.serving import free_port, stop_group

BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name


def find_binary() -> str | None:
    explicit = os.environ.get("ALERTMANAGER_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return next((path for path in map(shutil.which, BINARIES) if path), None)


class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST (path, headers, JSON body).

    `fail_with(status)` makes it answer that status until `fail_with(None)` (`accept_then_fail`: after a
    number of POSTs); `stop()` + `start()` on the same port simulates a receiver that is down and comes back.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.posts: list[dict[str, Any]] = []
        self.status: int | None = None
        self.accept: int | None = None  # accept_then_fail: POSTs still accepted
        self.then = 503
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver.status or 200
                if receiver.accept is not None:
                    with receiver._cond:
                        status = 200 if receiver.accept > 0 else receiver.then
                        receiver.accept -= 1
                if status < 300:
                    with receiver._cond:
                        receiver.posts.append({"path": self.path, "headers": dict(self.headers.items()),
                                               "body": json.loads(raw or b"null"), "at": time.time()})
                        receiver._cond.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True, name="receiver").start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail_with(self, status: int | None) -> None:
        self.status = status
        self.accept = None

    def accept_then_fail(self, count: int, status: int) -> None:
        """Accept the next `count` POSTs, then answer `status` until `fail_with(None)`."""
        self.status, self.accept, self.then = None, count, status

    def bodies(self, path: str | None = None) -> list[Any]:
        with self._cond:
            return [p["body"] for p in self.posts if path is None or p["path"] == path]

    def wait_for(self, predicate: Callable[[list[dict]], Any], timeout: float = 15.0, what: str = "a POST") -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(list(self.posts))
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out waiting for {what}; received {len(self.posts)} POST(s)")
                self._cond.wait(remaining)


class Sizer:
    """An Alertmanager replica that only measures what it is posted: the POSTs, the largest body and the alerts
    (counted, not kept: a tick of 50,000 findings would otherwise be kept whole). alert-forwarder's bounded bodies
    are checked with it (bench/alert_forwarder.py, tests/functions/alert_forwarder/test_scale.py)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.posts = self.largest = self.alerts = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Sizer:
        sizer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sizer._lock:
                    sizer.posts += 1
                    sizer.largest = max(sizer.largest, len(raw))
                    sizer.alerts += raw.count(b'"labels":')
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def reset(self) -> None:
        with self._lock:
            self.posts = self.largest = self.alerts = 0

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


def config(receiver_url: str, group_wait: str = "200ms", group_interval: str = "1s") -> dict:
    """Route everything to one webhook receiver, grouped by alertname and namespace."""
    return {"route": {"receiver": "vmevents-test", "group_by": ["alertname", "namespace"],
                      "group_wait": group_wait, "group_interval": group_interval, "repeat_interval": "1h"},
            "receivers": [{"name": "vmevents-test",
                           "webhook_configs": [{"url": f"{receiver_url}/alertmanager", "send_resolved": True}]}]}


class Alertmanager:
    """A real Alertmanager process on 127.0.0.1:<free port>; `api(path)` reads its API v2."""

    def __init__(self, binary: str, receiver_url: str, **route: str):
        self.binary = binary
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="vmevents-alertmanager-"))
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(config(receiver_url, **route)))
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> Alertmanager:
        self._log = open(self.workdir / "log", "wb")
        self._proc = subprocess.Popen(
            [self.binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
             f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address=", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self.workdir / "log").read_text(errors="replace")
                raise RuntimeError(f"Alertmanager exited with {self._proc.returncode} while starting:\n{log[-2000:]}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=0.5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Alertmanager did not become ready on {self.url} within {timeout}s")

    def api(self, path: str, **params: Any) -> Any:
        response = requests.get(f"{self.url}/api/v2/{path}", params=params, timeout=5)
        response.raise_for_status()
        return response.json()

    def alerts(self, **labels: str) -> list[dict]:
        """Every alert Alertmanager holds (active or not yet expired) whose labels include `labels`."""
        return [a for a in self.api("alerts") if all(a["labels"].get(k) == v for k, v in labels.items())]

    def unresolved(self, timeout: float = 60.0) -> int:
        """How many unresolved alerts it holds, from its metrics (listing 50,000 alerts takes longer than counting),
        once none is waiting for its dispatcher: `alertmanager_alerts` counts them by state (active, suppressed,
        unprocessed), each state over a listing of its own (provider/mem/mem.go `count`), so while alerts pass from
        unprocessed to active the sum counts some twice."""
        deadline = time.monotonic() + timeout
        while True:
            gauges = {line.split('"')[1]: float(line.split()[-1])
                      for line in requests.get(f"{self.url}/metrics", timeout=30).text.splitlines()
                      if line.startswith("alertmanager_alerts{")}
            if not gauges.get("unprocessed") or time.monotonic() > deadline:
                return int(sum(gauges.values()))
            time.sleep(0.2)

    def version(self) -> str:
        return self.api("status")["versionInfo"]["version"]

    def restart(self) -> Alertmanager:
        """Stop the process and start it again on the same port and storage: what an upgrade or a rescheduled
        pod does. Its alerts live in memory only and are gone; silences and the notification log are kept."""
        return self.down().start()

    def down(self) -> Alertmanager:
        """Stop the process, keeping its port and storage for `start()`: an Alertmanager that is down (a POST to
        it is refused) until it comes back, without its alerts."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, signal.SIGTERM, wait=10)
        if self._log:
            self._log.close()
            self._log = None
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, signal.SIGTERM, wait=10)
        if self._log:
            self._log.close()
            self._log = None
        shutil.rmtree(self.workdir, ignore_errors=True)

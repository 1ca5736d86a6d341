"""`make bench`: a relevant event's latency on a real control plane, from the request arriving to the answer.

A real control plane (controlplane.server.ControlPlane: kube-apiserver 1.33 + etcd) holds a realistic cluster
(bench/population.py, 1,000 VMs by default). Each function runs as it is deployed: functions-framework (gunicorn)
from its own main.py, with its own ServiceAccount's kubeconfig and the settings bench/api_cost.py gives it, and is
sent its relevant event (bench/api_cost.FUNCTIONS: vmi-cleanup a Succeeded VMI in a dry run, io-pause-report a VMI
paused on an IO error, migration-report a failed migration, vm-stuck-report an unschedulable VM, device-conflict a
VM naming a host device), one POST at a time, N times. Measured per event:
- **in the function**: from the request reaching the function's app to its answer, as the function logs it
  (`duration_ms` in its one log line: shared/runtime.FunctionApp, from the call to the response);
- **round trip**: the same POST as a client on loopback sees it (a new connection each: gunicorn's parsing and
  the socket work added);
- its **API calls**: the requests its ServiceAccount made, from kube-apiserver's audit log.
The report gives p50 and p99 of both times and the median (max) of the calls. A report, not a test: exit 0.

    python -m bench.relevant [--vms 1000] [--events 100] [--functions vmi-cleanup,...] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.api_cost import FUNCTIONS, Function, event_object
from bench.population import Plan, populate
from bench.vmi_cleanup import Server, Spec, post
from shared.kube import Kube


@dataclass
class Row:
    function: str
    vms: int
    events: int
    decision: str
    in_function_ms: dict[str, float]
    round_trip_ms: dict[str, float]
    api_calls: dict[str, float]


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cut = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"p50": round(statistics.median(ordered), 2), "p99": round(cut[98], 2), "max": round(ordered[-1], 2)}


def binary_event(kind_name: str, obj: dict) -> tuple[dict[str, str], bytes]:
    """An ApiServerSource update event about `obj`, in binary mode, as the broker delivers it."""
    meta = obj["metadata"]
    plural = {"VirtualMachineInstance": "virtualmachineinstances", "VirtualMachine": "virtualmachines",
              "VirtualMachineInstanceMigration": "virtualmachineinstancemigrations"}[kind_name]
    headers = {"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": str(uuid.uuid4()),
               "ce-type": "dev.knative.apiserver.resource.update", "ce-source": "https://10.43.0.1:443",
               "ce-subject": f"/apis/kubevirt.io/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}",
               "ce-kind": kind_name, "ce-apiversion": obj["apiVersion"], "ce-name": meta["name"],
               "ce-namespace": meta["namespace"]}
    return headers, json.dumps(obj).encode()


def _logged(server: Server) -> list[dict[str, Any]]:
    lines = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
    return [line for line in lines if "duration_ms" in line]


def measure(cluster: Any, admin: Kube, plan: Plan, function: Function, events: int, workdir: Path) -> Row:
    kind, obj = event_object(admin, function, plan)
    server = Server(Spec(function.name, f"functions/{function.package}/main.py"),
                    cluster.kubeconfig(function.service_account), workdir, env=function.env).start()
    try:
        headers, body = binary_event(kind.kind, obj)
        # Start-up and the first event's one-time work (device-conflict's first repair takes seconds here).
        server.first_answer(headers, body, timeout=120)
        for _ in range(3):
            post(server.port, headers, body, timeout=30)
        trips, calls, ids = [], [], set()
        for _ in range(events):
            cluster.clear_requests()
            ids.add(event_id := str(uuid.uuid4()))
            began = time.perf_counter()
            status = post(server.port, {**headers, "ce-id": event_id}, body, timeout=30)
            trips.append((time.perf_counter() - began) * 1000)
            if not 200 <= status < 300:
                raise RuntimeError(f"{function.name} answered {status}:\n{server.log_tail()}")
            calls.append(sum(1 for r in cluster.requests if r.service_account == function.service_account))
        logged = [line for line in _logged(server) if line.get("event_id") in ids]  # not the warm-up's
    finally:
        server.stop()
    last = logged[-1] if logged else {}
    decision = f"{last.get('verdict')}/{last.get('effect')}: {last.get('reason') or ''}"[:200]
    assert len(logged) == events, f"{function.name} logged {len(logged)} of its {events} events"
    return Row(function.name, plan.vms, events, decision, _percentiles([float(x["duration_ms"]) for x in logged]),
               _percentiles(trips), {"median": statistics.median(calls), "max": max(calls)})


def run_bench(vms: int, events: int, say=print, only: set[str] | None = None) -> list[Row]:
    from kubernetes import config

    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    rows: list[Row] = []
    plane = ControlPlane(die_with_parent=True)
    try:
        plane.start(say=say)
        # Without the fault proxy: the functions talk to kube-apiserver directly, as in a cluster.
        cluster = RealCluster(plane, virt_controller=False, fault_proxy=False).start()
        client = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
        client.configuration.connection_pool_maxsize = 32
        admin = Kube(client)
        plan = Plan(vms)
        began = time.perf_counter()
        populate(admin, plan, say=say)
        say(f"{vms} VMs: populated in {time.perf_counter() - began:.0f} s")
        time.sleep(3)  # the watch cache and the garbage collector's informers catch up
        with tempfile.TemporaryDirectory(prefix="vmevents-relevant-") as workdir:
            for function in (f for f in FUNCTIONS if not only or f.name in only):
                rows.append(measure(cluster, admin, plan, function, events, Path(workdir)))
                row = rows[-1]
                say(f"  {row.function}: p50 {row.in_function_ms['p50']} ms, {row.api_calls['median']:.0f} calls")
        cluster.stop()
    finally:
        plane.remove()
    return rows


def render(rows: list[Row]) -> str:
    lines = ["A relevant event on a real control plane: request arriving → the function's answer (one run)", ""]
    head = (f"{'VMs':>6} {'function':<17} {'events':>6}  {'in function ms p50 / p99':>25}  "
            f"{'round trip ms p50 / p99':>24}  {'API calls':>10}  decision")
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.vms:>6} {r.function:<17} {r.events:>6}  "
                     f"{r.in_function_ms['p50']:>11.2f} / {r.in_function_ms['p99']:<11.2f}  "
                     f"{r.round_trip_ms['p50']:>10.2f} / {r.round_trip_ms['p99']:<11.2f}  "
                     f"{r.api_calls['median']:>4.0f} ({r.api_calls['max']:.0f})  {r.decision[:70]}")
    lines += ["", "in function: the function's own logged duration_ms (its app called → its answer); round trip: a "
                  "loopback client's POST on a new connection; API calls: its ServiceAccount's requests in "
                  "kube-apiserver's audit log, median (max) per event. Events one at a time, nothing else running."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relevant", description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--functions", default="", help="only these (comma-separated names); default: all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from controlplane import build

    if not build.buildable():
        print("relevant: skipped: the real control plane cannot be built here (needs Go; see docs/control-plane.md)")
        return 0
    only = {name.strip() for name in args.functions.split(",") if name.strip()}
    rows = run_bench(args.vms, args.events, say=lambda text: print(text, file=sys.stderr, flush=True), only=only)
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))

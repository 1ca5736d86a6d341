"""`make bench`: migration-report next to a no-op, on the events it sees most: VMIM updates of
migrations still under way (irrelevant: no API call, not even decoded), and duplicates of a failed
migration it already reported (relevant: the reads that find its own Event and stay quiet).

Reuses bench/vmi_cleanup.py's servers, A/B rounds and medians and bench/load.py's load
generators. A report, not a test: ratios, PASS/MISS against the targets, exit 0 either way.

    python -m bench.migration_report [--rounds 6] [--seconds 2] [--generator auto|wrk|python]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.load import Load, choose
from bench.vmi_cleanup import NOOP, SOURCE, Run, Server, Spec, _medians, _running, decisions
from simcluster.builders.migration import NOT_COMPLETED, create_guest, create_migration

SERVICE_ACCOUNT = "vmevents/migration-report"
MIGRATION_REPORT = Spec("migration-report", "functions/migration_report/main.py")
TARGET_RATIO = 0.9


def binary_event(vmim: dict) -> tuple[dict[str, str], bytes]:
    """The binary-mode CloudEvent ApiServerSource (Resource mode) sends for a VMIM update."""
    meta = vmim["metadata"]
    return ({"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": str(uuid.uuid4()),
             "ce-type": "dev.knative.apiserver.resource.update", "ce-source": SOURCE,
             "ce-subject": f"/apis/kubevirt.io/v1/namespaces/{meta['namespace']}/virtualmachineinstancemigrations/"
                           f"{meta['name']}",
             "ce-kind": vmim["kind"], "ce-apiversion": vmim["apiVersion"], "ce-name": meta["name"],
             "ce-namespace": meta["namespace"]},
            json.dumps(vmim, separators=(",", ":")).encode())


def calls(sim) -> int:
    return sum(1 for r in list(sim.requests) if r.service_account == SERVICE_ACCOUNT)


def settle(sim, log: Path, timeout: float = 5.0) -> None:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        now = (calls(sim), log.stat().st_size)
        if now == last:
            return
        last = now
        time.sleep(0.2)


def run(rounds: int, load: Load, generator_name: str, stack: contextlib.ExitStack, workdir: Path) -> dict:
    from simcluster.apiserver import SimCluster

    sim = SimCluster(kubevirt_version="1.8.3").start()
    stack.callback(sim.stop)
    kubeconfig = sim.kubeconfig(service_account=SERVICE_ACCOUNT)
    generator = choose(generator_name)
    _, vmi = create_guest(sim, "bench-running", guest="8Gi", labels={"harvesterhci.io/vmName": "bench-running"})
    running = create_migration(sim, "1.8", vmi, took=60, phase="Succeeded")
    running["status"] = {"phase": "Running",
                         "phaseTransitionTimestamps": running["status"]["phaseTransitionTimestamps"][:-1]}
    irrelevant = binary_event(running)

    servers = {spec.name: stack.enter_context(_running(Server(spec, kubeconfig, workdir)))
               for spec in (MIGRATION_REPORT, NOOP)}
    for server in servers.values():
        server.first_answer(*irrelevant)
        generator.run(server.port, *irrelevant, Load(seconds=1, connections=load.connections))
    before = calls(sim)
    runs = [Run.of(name, generator.run(server.port, *irrelevant, load))
            for _ in range(rounds) for name, server in servers.items()]
    log = servers[MIGRATION_REPORT.name].log_path
    settle(sim, log)
    counts, in_handler = decisions(log)
    by_server = {name: _medians([r for r in runs if r.server == name]) for name in servers}
    ratio = by_server[MIGRATION_REPORT.name]["events_per_s"] / by_server[NOOP.name]["events_per_s"]
    irrelevant_calls = calls(sim) - before

    # relevant: a failed migration, reported once; then a flood of duplicates of its update
    _, vmi2 = create_guest(sim, "bench-failed", guest="8Gi")
    failed = create_migration(sim, "1.8", vmi2, took=1351, reason=NOT_COMPLETED.format(1350))
    duplicate = binary_event(failed)
    function = servers[MIGRATION_REPORT.name]
    function.first_answer(*duplicate)
    counts_before, before = counts, calls(sim)
    result = generator.run(function.port, *duplicate, Load(seconds=3, connections=load.connections))
    settle(sim, log)
    counts, in_handler = decisions(log)
    handled = sum((counts - counts_before).values())
    reported = [e for e in sim.list("v1", "Event", "default") if (e.get("source") or {}).get("component")
                == MIGRATION_REPORT.name]
    return {"generator": generator.describe(load), "event_bytes": len(irrelevant[1]), "throughput": by_server,
            "ratio": round(ratio, 3), "irrelevant_calls": irrelevant_calls,
            "irrelevant_events": counts_before.get("irrelevant", 0),
            "duplicates": {"events": handled, "per_second": round(result.per_second, 1),
                           "p50_ms": round(result.p50_ms, 2),
                           "api_calls_per_event": round((calls(sim) - before) / handled, 2) if handled else None,
                           "decisions": dict(counts - counts_before),
                           "events_recorded": [(e["involvedObject"]["kind"], e["count"]) for e in reported]}}


def render(r: dict) -> str:
    fn, noop = r["throughput"][MIGRATION_REPORT.name], r["throughput"][NOOP.name]
    dup = r["duplicates"]
    per_event = r["irrelevant_calls"] / r["irrelevant_events"] if r["irrelevant_events"] else None
    return "\n".join([
        f"vmevents benchmark: migration-report vs a no-op functions-framework target ({os.cpu_count()} CPUs)",
        f"load generator: {r['generator']}",
        f"event: VMIM update of a migration under way ({r['event_bytes']} bytes); A/B rounds, medians",
        f"  {'':<20}{'events/s':>10}{'p50 ms':>9}{'p99 ms':>9}",
        f"  {'migration-report':<20}{fn['events_per_s']:>10.1f}{fn['p50_ms']:>9.2f}{fn['p99_ms']:>9.2f}",
        f"  {'no-op':<20}{noop['events_per_s']:>10.1f}{noop['p50_ms']:>9.2f}{noop['p99_ms']:>9.2f}",
        f"  throughput ratio migration-report / no-op: {r['ratio']:.3f} (target >= {TARGET_RATIO}) "
        f"{'PASS' if r['ratio'] >= TARGET_RATIO else 'MISS'}",
        f"  Kubernetes API calls per irrelevant event: {per_event} ({r['irrelevant_calls']} / "
        f"{r['irrelevant_events']}; target 0) {'PASS' if r['irrelevant_calls'] == 0 else 'MISS'}",
        f"duplicates of an already-reported failed migration (3 s): {dup['events']} events, {dup['per_second']}/s, "
        f"p50 {dup['p50_ms']} ms, {dup['api_calls_per_event']} API calls per event; decisions {dup['decisions']}; "
        f"Events recorded (kind, count): {dup['events_recorded']}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.migration_report", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
        report = run(args.rounds, Load(seconds=args.seconds, connections=args.connections), args.generator, stack,
                     workdir)
    print(render(report))
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: device-conflict next to a no-op, and what a relevant event costs at scale.

1. Irrelevant VM updates (a VM with no device: nearly every VM update in a cluster) answered by
   device-conflict and by the no-op, A/B rounds, medians and their ratio; API calls per event.
2. A relevant event (a VM naming a device another VM names) in a cluster of N simulated VMs
   (default 2,000; 10% with devices): API calls, LIST pages, time per event and RSS growth; and
   one re-scan tick. The machinery (servers, load generators, log parsing) is vmi-cleanup's bench.

    python -m bench.device_conflict [--rounds 6] [--seconds 2] [--vms 2000] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.load import Load, choose
from bench.vmi_cleanup import NOOP, Server, Spec, _running, binary_event, decisions, post
from simcluster.builders.devices import VF, host_device, seed_vm1, seed_vm2

SERVICE_ACCOUNT = "vmevents/device-conflict"
DEVICE_CONFLICT = Spec("device-conflict", "functions/device_conflict/main.py")
PAGE_SIZE = 250  # shared.kube.PAGE_SIZE


@dataclass
class Report:
    generator: str
    settings: dict
    throughput: dict = field(default_factory=dict)
    ratio: float = 0.0
    irrelevant: dict = field(default_factory=dict)
    relevant: dict = field(default_factory=dict)
    rescan: dict = field(default_factory=dict)
    rss_mib: dict = field(default_factory=dict)


def populate(sim, vms: int) -> None:
    """N VMs shaped like the seed's; one in ten names a device of its own; vm1 and vm2 share one."""
    for i in range(vms):
        devices = [host_device(f"harvester-ktmg4-{i:09x}", VF)] if i % 10 == 0 else []
        manifest = seed_vm1(f"bench-{i:05d}", host_devices=devices)
        if not devices:
            del manifest["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"]
        sim.create(manifest)
    sim.create(seed_vm1())
    sim.create(seed_vm2())


def _calls(sim) -> list:
    return [r for r in list(sim.requests) if r.service_account == SERVICE_ACCOUNT]


def run_bench(rounds: int, load: Load, vms: int, workdir: Path, stack: contextlib.ExitStack,
              say=lambda _: None) -> Report:
    from simcluster.apiserver import SimCluster

    generator = choose("auto")
    sim = SimCluster().start()
    stack.callback(sim.stop)
    kubeconfig = str(sim.kubeconfig(service_account=SERVICE_ACCOUNT))
    plain = seed_vm1("plain", host_devices=[])
    del plain["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"]
    plain = sim.create(plain)
    # KubeVirt's status write of a VM it has reconciled (observedGeneration = generation): the update a cluster
    # sends most; a VM spec edit not yet observed is worth one read of the parameter object (handler.target).
    plain.setdefault("status", {})["observedGeneration"] = plain["metadata"].get("generation", 1)
    irrelevant = binary_event(plain)
    report = Report(generator.name, {"rounds": rounds, "load": generator.describe(load), "vms": vms,
                                     "event_bytes": len(irrelevant[1])})

    servers = {}
    for spec in (DEVICE_CONFLICT, NOOP):
        servers[spec.name] = stack.enter_context(_running(Server(spec, kubeconfig, workdir)))
        servers[spec.name].first_answer(*irrelevant)
    before = len(_calls(sim))
    runs: dict[str, list[float]] = {name: [] for name in servers}
    for index in range(rounds):
        for name, server in servers.items():
            say(f"round {index + 1}/{rounds}: {name} ...")
            runs[name].append(generator.run(server.port, *irrelevant, load).per_second)
    time.sleep(0.5)
    counts, in_handler = decisions(servers[DEVICE_CONFLICT.name].log_path)
    calls = len(_calls(sim)) - before
    report.throughput = {name: round(statistics.median(v), 1) for name, v in runs.items()}
    report.ratio = round(report.throughput[DEVICE_CONFLICT.name] / report.throughput[NOOP.name], 3)
    report.irrelevant = {"events": counts["irrelevant"], "api_calls": calls,
                         "api_calls_per_event": (round(calls / counts["irrelevant"], 4)
                                                 if counts["irrelevant"] else None),
                         "in_handler_ms_p50": in_handler.get("irrelevant")}
    rss_before = servers[DEVICE_CONFLICT.name].rss_kib()

    say(f"populating {vms} VMs ...")
    populate(sim, vms)
    vm2 = sim.get("kubevirt.io/v1", "VirtualMachine", "default", "vm2")
    relevant = binary_event(vm2, operation="update")
    relevant[0]["ce-kind"] = "VirtualMachine"
    port = servers[DEVICE_CONFLICT.name].port
    timings, per_event = [], []
    for _ in range(5):
        before = len(_calls(sim))
        started = time.perf_counter()
        assert 200 <= post(port, *relevant, timeout=60) < 300
        timings.append((time.perf_counter() - started) * 1000)
        per_event.append(_calls(sim)[before:])
    lists = [r for r in per_event[-1] if r.verb == "list"]
    report.relevant = {"ms_p50": round(statistics.median(timings), 1),
                       "api_calls_per_event": len(per_event[-1]),
                       "list_pages": {kind: sum(1 for r in lists if r.resource == kind)
                                      for kind in sorted({r.resource for r in lists})},
                       "writes": sorted({f"{r.verb} {r.resource}" for r in per_event[-1] if r.verb != "list"})}
    say("one re-scan tick ...")
    tick = ({"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": "bench-tick",
             "ce-type": "dev.knative.sources.ping", "ce-source": "/bench"}, b'{"reason": "bench"}')
    before = len(_calls(sim))
    started = time.perf_counter()
    assert 200 <= post(port, *tick, timeout=120) < 300
    report.rescan = {"ms": round((time.perf_counter() - started) * 1000, 1),
                     "api_calls": len(_calls(sim)) - before}
    report.rss_mib = {"after_irrelevant": round(rss_before / 1024, 1),
                      "after_relevant": round(servers[DEVICE_CONFLICT.name].rss_kib() / 1024, 1),
                      "no-op": round(servers[NOOP.name].rss_kib() / 1024, 1)}
    return report


def render(r: Report) -> str:
    s, rel = r.settings, r.relevant
    return "\n".join([
        f"device-conflict vs a no-op ({r.generator}, {s['load']}; {s['rounds']} A/B rounds, medians)",
        f"  irrelevant VM updates (a VM with no device, {s['event_bytes']} bytes): "
        f"{r.throughput[DEVICE_CONFLICT.name]:.0f} vs {r.throughput[NOOP.name]:.0f} events/s, "
        f"throughput ratio device-conflict / no-op {r.ratio:.3f}",
        f"  Kubernetes API calls per irrelevant event: {r.irrelevant['api_calls_per_event']} "
        f"({r.irrelevant['api_calls']} calls / {r.irrelevant['events']} events); in-handler p50 "
        f"{r.irrelevant['in_handler_ms_p50']} ms",
        f"  relevant VM update with {s['vms'] + 3} VMs in the cluster ({s['vms'] // 10 + 2} with devices): "
        f"{rel['ms_p50']} ms per event, {rel['api_calls_per_event']} API calls "
        f"(LIST pages of {PAGE_SIZE}: {rel['list_pages']}; writes: {', '.join(rel['writes']) or 'none'})",
        f"  one re-scan tick: {r.rescan['ms']} ms, {r.rescan['api_calls']} API calls",
        f"  RSS MiB: {r.rss_mib['after_irrelevant']} after the irrelevant load, {r.rss_mib['after_relevant']} after "
        f"the relevant events (no-op {r.rss_mib['no-op']}; ratio "
        f"{r.rss_mib['after_relevant'] / r.rss_mib['no-op']:.2f}x)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device_conflict", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
        report = run_bench(args.rounds, Load(seconds=args.seconds, connections=8), args.vms, workdir, stack,
                           say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    print(render(report))
    if args.json:
        print(json.dumps(report.__dict__, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench` for io-pause-report, side by side with the no-op, reusing vmi-cleanup's machinery.

The broker sends io-pause-report every VMI update; nearly all are a Running VMI's status changing,
or a VMI paused for another reason: those must cost about what answering at all costs, and no
Kubernetes API call. A VMI paused on an IO error in an episode already reported is re-read (VMI,
Events, PVC, PV, Longhorn volume and engines) and held. Ratios, not verdicts; exits 0 either way.

    python -m bench.io_pause_report [--rounds 8] [--seconds 2] [--generator auto|wrk|python]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import vmi_cleanup as base
from bench.load import Load, choose

IO_PAUSE = base.Spec("io-pause-report", "functions/io_pause_report/main.py")
SERVICE_ACCOUNT = "vmevents/io-pause-report"


class Cluster(base.Cluster):
    """The simulated API server, counting io-pause-report's requests."""

    def kubeconfig(self) -> str:
        return str(self.sim.kubeconfig(service_account=SERVICE_ACCOUNT))

    def calls(self) -> int:
        return sum(1 for r in list(self.sim.requests) if getattr(r, "service_account", None) == SERVICE_ACCOUNT)


def paused_vmi(name: str, vm: dict, reason: str) -> dict:
    vmi = base.make_vmi(name, vm=vm)
    vmi["status"]["conditions"].append({"type": "Paused", "status": "True", "reason": reason, "lastProbeTime": None,
                                        "lastTransitionTime": base.stamp(datetime.now(UTC))})
    return vmi


def seed_io_paused(cluster: Cluster) -> dict:
    """A VM paused on an IO error, its disk a degraded Longhorn volume being rebuilt."""
    from simcluster.builders.io_pause import make_engine, make_pv, make_pvc, make_volume

    vm = cluster.create(base.make_vm("bench-io"))
    vmi = cluster.create(paused_vmi("bench-io", vm, "PausedIOError"))
    claim = vmi["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    cluster.create(make_pvc(claim, "pvc-bench-io"))
    cluster.create(make_pv("pvc-bench-io", claim))
    cluster.create(make_volume("pvc-bench-io"))
    cluster.create(make_engine("pvc-bench-io", rebuilding=40))
    return vmi


def run_bench(rounds: int, load: Load, generator_name: str, workdir: Path, stack: contextlib.ExitStack,
              say: Callable[[str], None]) -> dict:
    generator = choose(generator_name)
    cluster = Cluster()
    stack.callback(cluster.stop)
    kubeconfig = cluster.kubeconfig()
    vm = cluster.create(base.make_vm("bench-running"))
    running = base.binary_event(cluster.create(base.make_vmi("bench-running", vm=vm)))
    by_user = base.binary_event(paused_vmi("bench-user", vm, "PausedByUser"))
    report: dict = {"generator": generator.describe(load), "rounds": rounds}

    say("start-up ...")
    startups = {IO_PAUSE.name: [], base.NOOP.name: []}
    for _ in range(3):
        for spec in (IO_PAUSE, base.NOOP):
            startups[spec.name].append(base.measure_startup(spec, kubeconfig, workdir, running))
    report["startup_s"] = {k: round(statistics.median(v), 3) for k, v in startups.items()}

    servers = {spec.name: stack.enter_context(base._running(base.Server(spec, kubeconfig, workdir)))
               for spec in (IO_PAUSE, base.NOOP)}
    for server in servers.values():
        server.first_answer(*running)
        generator.run(server.port, *running, Load(seconds=1, connections=load.connections))
    calls_before = cluster.calls()
    runs: list[base.Run] = []
    for index in range(rounds):
        for name, server in servers.items():
            say(f"round {index + 1}/{rounds}: {name} ...")
            event = running if index % 2 == 0 else by_user  # a Running VMI, and one paused by its user
            runs.append(base.Run.of(name, generator.run(server.port, *event, load)))
    log = servers[IO_PAUSE.name].log_path
    cluster.settle(log)
    counts, in_handler = base.decisions(log)
    medians = {name: base._medians([r for r in runs if r.server == name]) for name in servers}
    noop = medians[base.NOOP.name]["events_per_s"]
    report.update(throughput=medians, ratio=round(medians[IO_PAUSE.name]["events_per_s"] / noop, 3) if noop else 0.0,
                  irrelevant={"events": counts["irrelevant"], "api_calls": cluster.calls() - calls_before,
                              "in_handler_ms_p50": in_handler.get("irrelevant")},
                  rss_mib={name: round(server.rss_kib() / 1024, 1) for name, server in servers.items()})

    say("relevant: a VMI paused on an IO error, episode already reported ...")
    paused = base.binary_event(seed_io_paused(cluster))
    function = servers[IO_PAUSE.name]
    base.post(function.port, *paused)  # the first one reports the episode
    cluster.settle(log)
    calls_before, counts_before = cluster.calls(), base.decisions(log)[0]
    result = generator.run(function.port, *paused, Load(seconds=2, connections=load.connections))
    cluster.settle(log)
    counts, in_handler = base.decisions(log)
    new = counts - counts_before
    handled = sum(new.values())
    report["relevant"] = {**base.asdict(base.Run.of(IO_PAUSE.name, result)), "decisions": dict(new),
                          "api_calls_per_event": (round((cluster.calls() - calls_before) / handled, 2)
                                                  if handled else None),
                          "in_handler_ms_p50": in_handler.get("hold")}
    return report


def render(report: dict) -> str:
    t, io, noop = report["throughput"], IO_PAUSE.name, base.NOOP.name
    irrelevant, rel = report["irrelevant"], report["relevant"]
    lines = ["vmevents benchmark: io-pause-report vs a no-op functions-framework target",
             f"load generator: {report['generator']}; {report['rounds']} rounds A/B, medians",
             f"{'irrelevant VMI updates':<26}{'events/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{'non-2xx':>9}"]
    for name in (io, noop):
        row = t[name]
        lines.append(f"  {name:<24}{row['events_per_s']:>10.1f}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}"
                     f"{row['requests']:>10}{row['failed']:>9}")
    lines += [f"  throughput ratio io-pause-report / no-op: {report['ratio']:.3f} (Running and PausedByUser VMIs)",
              f"  Kubernetes API calls on irrelevant events: {irrelevant['api_calls']} in {irrelevant['events']}",
              f"relevant (PausedIOError, episode already reported): {rel['per_second']:.1f} events/s, p50 "
              f"{rel['p50_ms']:.2f} ms; API calls per event {rel['api_calls_per_event']}; decisions {rel['decisions']}",
              f"start-up s: {report['startup_s'][io]:.3f} vs {report['startup_s'][noop]:.3f} "
              f"({report['startup_s'][io] / report['startup_s'][noop]:.2f}x); RSS MiB: {report['rss_mib'][io]} vs "
              f"{report['rss_mib'][noop]} ({report['rss_mib'][io] / report['rss_mib'][noop]:.2f}x)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.io_pause_report", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
        report = run_bench(args.rounds, Load(seconds=args.seconds, connections=args.connections), args.generator,
                           workdir, stack, say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

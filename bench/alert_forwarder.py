"""`make bench`: what alert-forwarder costs per finding, next to a no-op, in one run.

Two findings, each sent by the load generator as the broker would (binary-mode CloudEvent):
an informational one (dropped: below MIN_SEVERITY, no POST) and a warning one (forwarded: one POST
to a real local Alertmanager when `prometheus-alertmanager` is installed, else to the local
webhook receiver). The no-op answers both alike. Rounds alternate A/B and the report gives medians
and ratios; it is a report, not a verdict (exit 0 either way). Reuses vmi-cleanup's benchmark
machinery (servers, the load generators).

    python -m bench.alert_forwarder [--rounds 6] [--seconds 2] [--generator auto|wrk|python] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from bench.load import Load, choose
from bench.vmi_cleanup import NOOP, Run, Server, Spec, _running
from simcluster.alertmanager import Alertmanager, Receiver, find_binary
from simcluster.builders import findings as b

ALERT_FORWARDER = Spec("alert-forwarder", "functions/alert_forwarder/main.py")


def binary(type_: str, data: dict) -> tuple[dict[str, str], bytes]:
    event = b.finding_event(type_, data)
    headers = {f"ce-{k}": str(v) for k, v in event.get_attributes().items() if k != "datacontenttype"}
    headers["Content-Type"] = "application/json"
    return headers, json.dumps(data).encode()


def run_bench(rounds: int, load: Load, generator_name: str, workdir: Path, stack: contextlib.ExitStack,
              say=lambda _: None) -> dict:
    generator = choose(generator_name)
    receiver = stack.enter_context(_running(Receiver()))
    binary_path = find_binary()
    if binary_path:
        alertmanager = Alertmanager(binary_path, receiver.url)
        stack.callback(alertmanager.stop)
        target, env = f"Alertmanager {alertmanager.start().version()}", {"ALERTMANAGER_URL": alertmanager.url}
    else:
        target, env = "the local webhook receiver", {"WEBHOOK_URL": f"{receiver.url}/hook"}
    # alert-forwarder connects at start (it lists finding Events on a tick, which the bench never sends): a
    # kubeconfig whose server is never called.
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "bench", "user": {"token": "none"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
    events = {"dropped (info finding)": binary("io.vmevents.vmi-cleanup.cleaned", b.cleaned()),
              f"forwarded to {target}": binary("io.vmevents.device-conflict.detected", b.device_conflict())}
    servers = {}
    startup = {}
    for spec in (ALERT_FORWARDER, NOOP):
        server = Server(spec, str(kubeconfig), workdir, env=env)
        stack.callback(server.stop)
        startup[spec.name] = round(server.start().first_answer(*next(iter(events.values()))), 3)
        servers[spec.name] = server
    report = {"generator": generator.name, "load": generator.describe(load), "rounds": rounds, "target": target,
              "startup_s": startup, "events": {}}
    for label, event in events.items():
        runs: dict[str, list[Run]] = {name: [] for name in servers}
        for server in servers.values():
            generator.run(server.port, *event, Load(seconds=1, connections=load.connections))  # warm-up
        for index in range(rounds):
            for name, server in servers.items():
                say(f"{label}: round {index + 1}/{rounds}: {name} ...")
                runs[name].append(Run.of(name, generator.run(server.port, *event, load)))
        medians = {name: {"events_per_s": round(statistics.median(r.per_second for r in rs), 1),
                          "p50_ms": round(statistics.median(r.p50_ms for r in rs), 3),
                          "p99_ms": round(statistics.median(r.p99_ms for r in rs), 3),
                          "failed": sum(r.failed for r in rs)} for name, rs in runs.items()}
        noop = medians[NOOP.name]["events_per_s"]
        report["events"][label] = {**medians, "ratio": round(medians[ALERT_FORWARDER.name]["events_per_s"] / noop, 3)
                                   if noop else 0.0}
    report["rss_mib"] = {name: round(server.rss_kib() / 1024, 1) for name, server in servers.items()}
    if binary_path:
        report["alertmanager_alerts"] = len(alertmanager.api("alerts"))
    return report


def render(report: dict) -> str:
    lines = ["vmevents benchmark: alert-forwarder vs a no-op functions-framework target",
             f"load generator: {report['generator']} ({report['load']}); {report['rounds']} rounds A/B; medians", "",
             f"{'finding':<44}{'server':<17}{'events/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'non-2xx':>9}"]
    for label, row in report["events"].items():
        for name in (ALERT_FORWARDER.name, NOOP.name):
            r = row[name]
            lines.append(f"  {label:<42}{name:<17}{r['events_per_s']:>10.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
                         f"{r['failed']:>9}")
        lines.append(f"  {'':<42}{'ratio':<17}{row['ratio']:>10.3f}")
    fn, noop = ALERT_FORWARDER.name, NOOP.name
    lines += ["", f"{'process':<26}{'start-up s':>12}{'RSS MiB':>10}"]
    for name in (fn, noop):
        lines.append(f"  {name:<24}{report['startup_s'][name]:>12.3f}{report['rss_mib'][name]:>10.1f}")
    lines.append(f"  {'ratio':<24}{report['startup_s'][fn] / report['startup_s'][noop]:>11.2f}x"
                 f"{report['rss_mib'][fn] / report['rss_mib'][noop]:>9.2f}x")
    if "alertmanager_alerts" in report:
        lines.append(f"  Alertmanager holds {report['alertmanager_alerts']} alert(s) after every repeat of the "
                     f"forwarded finding (one alert, not duplicates)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.alert_forwarder", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2, help="per round and server")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--json", action="store_true", help="also print the whole report as JSON")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
            report = run_bench(args.rounds, Load(seconds=args.seconds, connections=args.connections), args.generator,
                               workdir, stack, say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        return 130
    print(render(report))
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make bench`: what alert-forwarder costs per finding, next to a no-op, and what its tick costs at 1k, 10k and
50k open findings, in one run.

Findings: two, each sent by the load generator as the broker would (binary-mode CloudEvent): an informational
one (dropped: below MIN_SEVERITY, no POST) and a warning one (forwarded: one POST to a real local Alertmanager
when `prometheus-alertmanager` is installed, else to the local webhook receiver). The no-op answers both alike.
Rounds alternate A/B and the report gives medians and ratios.

The tick (issue 34): the API server (the simulator; `--ticks-backend real`: kube-apiserver 1.33 with etcd, built by
controlplane/) holds 1,000, then 10,000, then 50,000 open findings (io-pause-report's Events, as a storage outage
pausing that many VMs leaves them, written by shared/ledger.py's own code); for each, a fresh
alert-forwarder process (gunicorn, as in the image) is sent one PingSource tick, which lists them page by page
and re-posts them to two Alertmanager replicas: the real one, and a stand-in that only measures each body. The
report gives the tick's time, its processes' peak RSS (VmHWM, master + worker) next to their RSS before the tick
and the pod's limit, and the largest body posted. It is a report, not a verdict (exit 0 either way). Reuses
vmi-cleanup's benchmark machinery (servers, the load generators).

    python -m bench.alert_forwarder [--rounds 6] [--seconds 2] [--generator auto|wrk|python] [--ticks 1000,10000,50000]
                                    [--ticks-backend sim|real] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.load import Load, choose
from bench.vmi_cleanup import NOOP, Run, Server, Spec, _running, _tree, post
from simcluster.alertmanager import Alertmanager, Receiver, Sizer, find_binary
from simcluster.builders import findings as b

ALERT_FORWARDER = Spec("alert-forwarder", "functions/alert_forwarder/main.py")
TICKS = (1_000, 10_000, 50_000)
POD_LIMIT_MIB = 192  # deploy/base/alert-forwarder.yaml: resources.limits.memory
SA = "vmevents/alert-forwarder"


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


# -- the tick at 1k, 10k, 50k open findings ---------------------------------------------------------
def _hwm_kib(server: Server) -> int:
    """VmHWM (peak RSS) of the gunicorn master and every descendant, in KiB: at most what the pod peaked at."""
    total = 0
    for pid in _tree(server.proc.pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total


def _cluster(backend: str, stack: contextlib.ExitStack, say) -> tuple[Any, Callable[[dict], dict]]:
    """The API server holding the findings, and how to create one object in it quickly: the simulator (its store
    directly), or a real kube-apiserver with etcd (controlplane/: its API, without the fault proxy)."""
    if backend == "sim":
        from simcluster.apiserver import SimCluster

        sim = SimCluster().start()
        stack.callback(sim.stop)
        return sim, sim.create
    from kubernetes import config

    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane
    from shared.kinds import EVENT
    from shared.kube import Kube

    plane = ControlPlane(die_with_parent=True)
    stack.callback(plane.remove)
    plane.start(say=say)
    real = RealCluster(plane, virt_controller=False, fault_proxy=False).start()
    stack.callback(real.stop)
    client = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
    client.configuration.connection_pool_maxsize = 32
    admin = Kube(client)
    return real, lambda body: admin.create(EVENT, body["metadata"]["namespace"], body)


def _populate(create: Callable[[dict], dict], start: int, stop: int) -> None:
    step = max(1, (stop - start + 15) // 16)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda first: b.open_findings(create, first, min(first + step, stop)), range(start, stop, step)))


def run_ticks(sizes: tuple[int, ...], workdir: Path, stack: contextlib.ExitStack, say=lambda _: None,
              backend: str = "sim") -> dict:
    cluster, create = _cluster(backend, stack, say)
    sizer = stack.enter_context(_running(Sizer()))
    receiver = stack.enter_context(_running(Receiver()))
    binary_path = find_binary()
    urls = [sizer.url]
    alertmanager = None
    if binary_path:
        alertmanager = Alertmanager(binary_path, receiver.url)
        stack.callback(alertmanager.stop)
        urls.insert(0, alertmanager.start().url)
    ping = {"ce-specversion": "1.0", "ce-type": "dev.knative.sources.ping", "ce-source": "/apis/v1/namespaces/"
            "vmevents/pingsources/vmevents-tick", "ce-id": "tick", "Content-Type": "application/json"}
    ready = binary("io.vmevents.vmi-cleanup.cleaned", b.cleaned())
    rows, made = [], 0
    for size in sorted(sizes):
        say(f"tick: {size} open findings on record ...")
        _populate(create, made, size)
        made = size
        server = Server(ALERT_FORWARDER, cluster.kubeconfig(service_account=SA), workdir,
                        env={"ALERTMANAGER_URL": ",".join(urls)})
        try:
            server.start().first_answer(*ready)
            before, cpu = server.rss_kib(), server.cpu_seconds()
            sizer.reset()
            started = time.perf_counter()
            status = post(server.port, ping, b'{"reason":"tick"}', timeout=300)
            took = time.perf_counter() - started
            cpu = server.cpu_seconds() - cpu
            peak = _hwm_kib(server)
            logged = [json.loads(x) for x in server.log_path.read_text(errors="replace").splitlines()
                      if x.startswith("{")]
            line = [x for x in logged if x.get("event_type") == "dev.knative.sources.ping"]
        finally:
            server.stop()
        held = alertmanager.unresolved() if alertmanager else None
        rows.append({"findings": size, "status": status, "seconds": round(took, 2), "cpu_s": round(cpu, 2),
                     "rss_before_mib": round(before / 1024, 1), "peak_mib": round(peak / 1024, 1),
                     "posts": sizer.posts, "alerts_posted": sizer.alerts,
                     "largest_body_kb": round(sizer.largest / 1000),
                     "alertmanager_active": held, "reason": line[-1]["reason"] if line else ""})
    return {"target": f"Alertmanager {alertmanager.version()} + a measuring replica" if alertmanager
            else "a measuring replica (prometheus-alertmanager not installed)", "limit_mib": POD_LIMIT_MIB,
            "backend": "the simulator" if backend == "sim" else "kube-apiserver 1.33 + etcd", "rows": rows}


def render_ticks(report: dict) -> str:
    lines = ["", f"alert-forwarder's tick: the open findings on record ({report['backend']}) re-posted to "
                 f"{report['target']}",
             f"{'open findings':>14}{'tick s':>9}{'CPU s':>8}{'RSS before MiB':>16}{'peak MiB':>10}{'of limit':>10}"
             f"{'posts':>7}{'largest body':>14}{'alerts posted':>15}{'AM firing':>11}"]
    for r in report["rows"]:
        held = "-" if r["alertmanager_active"] is None else str(r["alertmanager_active"])
        lines.append(f"{r['findings']:>14,}{r['seconds']:>9.2f}{r['cpu_s']:>8.2f}{r['rss_before_mib']:>16.1f}{r['peak_mib']:>10.1f}"
                     f"{r['peak_mib'] / report['limit_mib']:>9.0%} {r['posts']:>6}{r['largest_body_kb']:>11} kB"
                     f"{r['alerts_posted']:>15,}{held:>11}")
    first = report["rows"][0]
    for r in report["rows"][1:]:
        lines.append(f"  {r['findings']:,} vs {first['findings']:,}: {r['findings'] / first['findings']:.0f}x the "
                     f"findings, {r['seconds'] / first['seconds']:.1f}x the time, "
                     f"{r['peak_mib'] / first['peak_mib']:.2f}x the peak RSS")
    lines.append(f"  pod limit {report['limit_mib']} MiB; each line a fresh process; non-2xx: "
                 f"{[r['findings'] for r in report['rows'] if not 200 <= r['status'] < 300] or 'none'}")
    return "\n".join(lines)


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
    parser.add_argument("--ticks", default=",".join(map(str, TICKS)),
                        help="open findings on record for the tick's figures, comma-separated (empty: none)")
    parser.add_argument("--ticks-backend", choices=("sim", "real"), default="sim",
                        help="the API server holding the findings: the simulator, or kube-apiserver with etcd")
    parser.add_argument("--json", action="store_true", help="also print the whole report as JSON")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say = lambda m: print(f"  {m}", file=sys.stderr, flush=True)  # noqa: E731
    sizes = tuple(int(n) for n in args.ticks.split(",") if n.strip())
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
            report = run_bench(args.rounds, Load(seconds=args.seconds, connections=args.connections), args.generator,
                               workdir, stack, say=say) if args.rounds else {}
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
            ticks = run_ticks(sizes, workdir, stack, say=say, backend=args.ticks_backend) if sizes else {}
    except KeyboardInterrupt:
        return 130
    if report:
        print(render(report))
    if ticks:
        print(render_ticks(ticks))
    if args.json:
        print(json.dumps({**report, "ticks": ticks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make bench`: every function's irrelevant-event path next to the no-op, side by side in one run.

For each function of bench/events.py and the no-op (bench/noop.py), all served at once by
functions-framework (gunicorn, as in the image):

1. start-up: spawn → first 2xx answer to its irrelevant event, median of `--startups`, the servers
   started in turn (function, no-op, function, ...), so a slow minute hits all alike; the client configured
   in-cluster, as in a pod (a service-account token and CA in a mount namespace of the server's own, when
   this machine lets root make one; else, or with --kubeconfig, from a kubeconfig);
2. idle RSS (gunicorn master + worker) once the first answer is out, and RSS after the load;
3. throughput on the irrelevant event with wrk, in rounds: each round runs every server once, in an order
   that rotates, and each function's ratio is the median over rounds of its rate ÷ the no-op's in the same
   round; the Kubernetes API calls the functions made meanwhile (the simulated API server counts them);
4. instructions per irrelevant event, function ÷ no-op, counted by callgrind (bench/instructions.py),
   when valgrind is installed: the figure that does not move with the machine's load.

It prints PASS/MISS against the targets of issue 25 and exits 0 either way: a report, not a test
(tests/bench/test_instructions.py holds the instruction ratio).

    python -m bench.irrelevant [--rounds 6] [--seconds 2] [--startups 3] [--no-instructions] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import instructions
from bench.events import IRRELEVANT, NOOP, Case
from bench.load import Load, choose
from bench.vmi_cleanup import Server, Spec, decisions

SERVICE_ACCOUNT = "vmevents/bench"
TARGET_THROUGHPUT = 0.95   # ≥ this × the no-op's events/s
TARGET_STARTUP = 1.3       # ≤ this × the no-op's spawn → first answer
TARGET_RSS = 1.5           # ≤ this × the no-op's idle RSS


@dataclass
class Report:
    generator: str
    settings: dict
    startup_s: dict = field(default_factory=dict)        # name -> median seconds
    idle_rss_mib: dict = field(default_factory=dict)     # name -> MiB after the first answer
    loaded_rss_mib: dict = field(default_factory=dict)   # name -> MiB after the load
    rates: dict = field(default_factory=dict)            # name -> [events/s per round]
    ratios: dict = field(default_factory=dict)           # name -> median paired ratio to the no-op
    failed: dict = field(default_factory=dict)           # name -> non-2xx answers
    verdicts: dict = field(default_factory=dict)         # name -> logged verdict counts
    api_calls: int = 0
    instructions: dict = field(default_factory=dict)     # name -> per event


def _spec(case: Case) -> Spec:
    return Spec(case.function, case.source)


def _env(case: Case) -> dict[str, str]:
    return {k: v for k, v in case.env().items() if k != "KUBECONFIG"}


# In a pod, a function configures its client from the service account's token and CA at this path
# (kubernetes.config.incluster_config SERVICE_TOKEN_FILENAME), with KUBERNETES_SERVICE_HOST/PORT set.
SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run
_IN_CLUSTER = (f"mount -t tmpfs vmevents-bench /run && mkdir -p {SERVICE_ACCOUNT_DIR} && "
               f'cp "$0/token" "$0/ca.crt" {SERVICE_ACCOUNT_DIR}/ && exec "$@"')


def in_cluster_prefix(workdir: Path) -> list[str] | None:
    """A command that runs a server as in a pod: its own mount namespace (unshare, root only) where a tmpfs on
    /run holds a service-account token and CA, the host's /run untouched. None when this machine cannot."""
    secrets = workdir / "serviceaccount"
    secrets.mkdir(exist_ok=True)
    (secrets / "token").write_text("bench-token-for-nothing")
    (secrets / "ca.crt").write_text("not a certificate: no request is ever made\n")
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_CLUSTER, str(secrets)]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


def run_bench(rounds: int, load: Load, startups: int, workdir: Path, stack: contextlib.ExitStack,
              say=lambda _: None, with_instructions: bool = True, in_cluster: bool = True) -> Report:
    from simcluster.apiserver import SimCluster

    generator = choose("auto")
    sim = SimCluster().start()
    stack.callback(sim.stop)
    kubeconfig = str(sim.kubeconfig(service_account=SERVICE_ACCOUNT))
    prefix = in_cluster_prefix(workdir) if in_cluster else None
    cases = list(IRRELEVANT.values())
    events = {case.function: case.event() for case in cases}
    report = Report(generator.name, {"rounds": rounds, "load": generator.describe(load), "startups": startups,
                                     "event_bytes": {name: len(e[1]) for name, e in events.items()},
                                     "client_configuration": "in-cluster" if prefix else "KUBECONFIG"})

    def server(case: Case) -> Server:
        env = _env(case)
        if prefix:  # the API address is unreachable: a request would answer 503 and count as non-2xx
            env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT="9")
        return Server(_spec(case), kubeconfig, workdir, env=env, prefix=prefix)

    say("start-up ...")
    times: dict[str, list[float]] = {case.function: [] for case in cases}
    for _ in range(startups):
        for case in cases:
            running = server(case).start()
            try:
                times[case.function].append(running.first_answer(*events[case.function]))
            finally:
                running.stop()
    report.startup_s = {name: round(statistics.median(v), 3) for name, v in times.items()}

    servers: dict[str, Server] = {}
    for case in cases:
        servers[case.function] = server(case)
        stack.callback(servers[case.function].stop)
        servers[case.function].start().first_answer(*events[case.function])
    time.sleep(1)
    report.idle_rss_mib = {name: round(s.rss_kib() / 1024, 1) for name, s in servers.items()}

    calls_before = len(sim.requests)
    for name, server in servers.items():
        say(f"warm-up {name} ...")
        generator.run(server.port, *events[name], Load(seconds=1, connections=load.connections))
    rates: dict[str, list[float]] = {name: [] for name in servers}
    failed = dict.fromkeys(servers, 0)
    names = list(servers)
    for index in range(rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        say(f"round {index + 1}/{rounds} ...")
        for name in order:
            result = generator.run(servers[name].port, *events[name], load)
            rates[name].append(result.per_second)
            failed[name] += result.failed
    time.sleep(1)
    report.api_calls = len(sim.requests) - calls_before
    report.rates = {name: [round(r, 1) for r in v] for name, v in rates.items()}
    report.failed = failed
    report.ratios = {name: round(statistics.median(a / b for a, b in zip(v, rates[NOOP.function], strict=True)), 3)
                     for name, v in rates.items() if name != NOOP.function}
    report.loaded_rss_mib = {name: round(s.rss_kib() / 1024, 1) for name, s in servers.items()}
    report.verdicts = {name: dict(decisions(s.log_path)[0]) for name, s in servers.items() if name != NOOP.function}
    for server in servers.values():
        server.stop()

    if with_instructions and instructions.available():
        say("instructions per event (callgrind) ...")
        report.instructions = instructions.per_event(list(IRRELEVANT))
    return report


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(report: Report) -> str:
    noop = NOOP.function
    s = report.settings
    lines = ["vmevents benchmark: every function's irrelevant events vs a no-op functions-framework target",
             f"load generator: {report.generator} ({s['load']}); {s['rounds']} rounds, every server once a round "
             f"(order rotating); start-up median of {s['startups']}; client configured {s['client_configuration']}"
             + (" (as in a pod: token and CA in a mount namespace of its own)"
                if s["client_configuration"] == "in-cluster" else ""), "",
             f"  {'server':<18}{'events/s':>10}{'ratio':>8}{'':>6}{'start-up s':>12}{'ratio':>7}{'':>6}"
             f"{'idle MiB':>10}{'ratio':>7}{'':>6}{'loaded MiB':>11}{'instr/event':>13}{'ratio':>7}"]
    for name in report.rates:
        rate = statistics.median(report.rates[name])
        up = report.startup_s[name] / report.startup_s[noop]
        rss = report.idle_rss_mib[name] / report.idle_rss_mib[noop]
        ins = report.instructions.get(name)
        ins_text = f"{ins:>13,.0f}{ins / report.instructions[noop]:>6.2f}x" if ins else f"{'n/a':>13}{'':>7}"
        if name == noop:
            lines.append(f"  {name:<18}{rate:>10.1f}{'':>14}{report.startup_s[name]:>12.3f}{'':>13}"
                         f"{report.idle_rss_mib[name]:>10.1f}{'':>13}{report.loaded_rss_mib[name]:>11.1f}{ins_text}")
            continue
        ratio = report.ratios[name]
        lines.append(
            f"  {name:<18}{rate:>10.1f}{ratio:>7.3f}x {_verdict(ratio >= TARGET_THROUGHPUT)}"
            f"{report.startup_s[name]:>12.3f}{up:>6.2f}x {_verdict(up <= TARGET_STARTUP)}"
            f"{report.idle_rss_mib[name]:>10.1f}{rss:>6.2f}x {_verdict(rss <= TARGET_RSS)}"
            f"{report.loaded_rss_mib[name]:>11.1f}{ins_text}")
    lines += ["", f"  targets: throughput >= {TARGET_THROUGHPUT}x, start-up <= {TARGET_STARTUP}x, idle RSS <= "
                  f"{TARGET_RSS}x the no-op's (RSS: gunicorn master + worker)",
              "  per-round throughput ratios: " + "; ".join(
                  f"{name} " + ", ".join(f"{a / b:.2f}" for a, b in zip(v, report.rates[noop], strict=True))
                  for name, v in report.rates.items() if name != noop),
              f"  Kubernetes API calls during the load: {report.api_calls} (target 0) "
              f"{_verdict(report.api_calls == 0)}; non-2xx answers: {sum(report.failed.values())}",
              "  logged verdicts: " + "; ".join(f"{name} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                                                for name, c in report.verdicts.items())]
    if not report.instructions:
        lines.append("  instructions per event: not counted (valgrind is not installed, or --no-instructions)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.irrelevant", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--startups", type=int, default=3)
    parser.add_argument("--no-instructions", action="store_true")
    parser.add_argument("--kubeconfig", action="store_true",
                        help="configure the functions' client from a kubeconfig (the simulated API server), not "
                             "in-cluster")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with contextlib.ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmevents-bench-")))
            report = run_bench(args.rounds, Load(seconds=args.seconds, connections=args.connections),
                               args.startups, workdir, stack,
                               say=lambda m: print(f"  {m}", file=sys.stderr, flush=True),
                               with_instructions=not args.no_instructions, in_cluster=not args.kubeconfig)
    except KeyboardInterrupt:
        print("interrupted; every server the benchmark started has been stopped", file=sys.stderr)
        return 130
    print(render(report))
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

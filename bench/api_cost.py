"""`make bench`: what each function's re-scan and relevant event cost a real API server, naive vs now.

A real control plane (controlplane.server.ControlPlane: kube-apiserver 1.33 + etcd) is filled with a
realistic cluster (bench/population.py) of 1,000 and then 10,000 VMs. At each size, every function runs
through its real handler code with its own ServiceAccount, per tick (a PingSource re-scan) and per
relevant event, and so does the naive baseline (bench/naive.py: the full LISTs the re-scans did before).
Measured for each: requests, response bytes received, wall time, and kube-apiserver's CPU seconds (its
process's utime + stime from /proc/<pid>/stat, before and after) above its idle rate: the server does work of
its own all the time (leases, the garbage collector's informers, watch-cache upkeep), measured for a few seconds
before each function's rounds while nothing here calls it, and that rate times the call's wall time is taken off,
so that a call that waits (a one-second watch) is not charged for the server's background. Naive and now run
alternately, a few rounds, and the report gives medians and the ratio now ÷ naive from this one run. Targets (issue 15):
each re-scan costs the API server at most 10 % of the naive one, and a tick takes under 5 s at 10,000 VMs.
It prints PASS/MISS and exits 0 either way: a report, not a test.

    python -m bench.api_cost [--sizes 1000,10000] [--rounds 3] [--json] [--functions vm-stuck-report,...]
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import naive
from bench.population import MAINTAINED, Plan, populate
from shared import intake
from shared.kinds import EVENT, NODE, VM, VMI, VMIM, Kind
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext, Outcome, utcnow

TARGET_RATIO = 0.10     # a re-scan's API-server CPU and bytes ≤ 10 % of the naive full LIST
TARGET_TICK_S = 5.0     # a tick at 10,000 VMs
# VMIM updates between two ticks: about two migrations' worth (a migration under way is updated ~10 times).
CHURN = 20
PING = "dev.knative.sources.ping"


@dataclass(frozen=True)
class Function:
    name: str
    package: str                      # functions.<package>.handler / .settings
    env: dict[str, str]
    naive_tick: Callable[[KubeContext], Any]
    event_of: Callable[[Plan], tuple[Kind, str, str]]     # (kind, namespace, name) of a relevant object
    naive_event: Callable[[KubeContext], Any] | None = None  # None: the event path did not change
    # Also measured, each as its own row: a tick with these settings instead, e.g. migration-report without its
    # cursor ("list": its first tick, or one after the cursor expired) or settling every tick ("settle").
    variants: dict[str, dict[str, str]] = field(default_factory=dict)
    settle_every_ticks: int = 0  # an `amortised` tick happens once in this many: the report's amortised line
    amortised: str = "settle"
    # Before each tick of a variant: what the cluster must look like for it (e.g. vmi-cleanup's "renew": its
    # dry-run Events' bases forgotten, as when every one is due for renewal), done with the admin's client.
    prepare: dict[str, Callable[[Kube], None]] = field(default_factory=dict)

    @property
    def service_account(self) -> str:
        return f"vmevents/{self.name}"


def _vm_named(i: int) -> Callable[[Plan], tuple[Kind, str, str]]:
    return lambda plan: (VM, plan.namespace(i), f"vm-{i:05d}")


def _vmi_named(i: int) -> Callable[[Plan], tuple[Kind, str, str]]:
    return lambda plan: (VMI, plan.namespace(i), f"vm-{i:05d}")


def _forget_dry_run_bases(admin: Kube) -> None:
    """vmi-cleanup's dry-run Events without the basis of their verdict (functions/vmi_cleanup/memory.py): the next
    tick decides every candidate in full and counts its Event again, as every dry-run tick did before issue 25 and
    as a tick does when the bases are due for renewal (once in RENEW_AFTER, 15 ticks)."""
    from functions.vmi_cleanup.memory import BASIS

    for event in admin.list(EVENT, field_selector="reason=VMICleanupDryRun"):
        if BASIS in ((event["metadata"].get("annotations")) or {}):
            admin.merge_patch(EVENT, event["metadata"]["namespace"], event["metadata"]["name"],
                              {"metadata": {"annotations": {BASIS: None}}})


FUNCTIONS = (
    # vm-00007 left a Succeeded VMI (population.py: i % 200 == 7); dry run, so every tick finds the same: "tick" is
    # a steady one (each candidate reported on the same objects before), "renew" one that decides each in full.
    Function("vmi-cleanup", "vmi_cleanup", {"CLEANUP_DRY_RUN": "true"}, naive.vmi_cleanup, _vmi_named(7),
             variants={"renew": {}}, settle_every_ticks=15, amortised="renew",
             prepare={"renew": _forget_dry_run_bases}),
    # vm-00011 is paused on an IO error (i % 500 == 11).
    Function("io-pause-report", "io_pause_report", {}, naive.io_pause_report, _vmi_named(11)),
    # vm-00000's migration failed five minutes ago (i % 400 == 0).
    # Its steady tick reads the changes since its cursor: CHURN VMIMs change before each round.
    Function("migration-report", "migration_report", {}, naive.migration_report,
             lambda plan: (VMIM, plan.namespace(0), ""),
             variants={"list": {"MIGRATION_CURSOR": ""}, "settle": {"MIGRATION_SETTLE_EVERY": "0s"}},
             settle_every_ticks=5),  # MIGRATION_SETTLE_EVERY=5m, a tick a minute
    # vm-00017 is stuck ErrorUnschedulable (i % 1000 == 17), its VMI just created: VM_STUCK_AFTER=1s makes every
    # tick diagnose it (its pod, quotas, nodes...), as a tick does for a VM stuck past its threshold.
    Function("vm-stuck-report", "vm_stuck_report", {"VM_STUCK_AFTER": "1s"}, naive.vm_stuck_report, _vm_named(17)),
    # vm-00000 names a host device (i % 20 == 0): its update is one device-conflict looks at.
    Function("device-conflict", "device_conflict", {}, naive.device_conflict, _vm_named(0),
             naive.device_conflict_event),
    # harvester-node-7 is in Harvester's maintenance mode (population.py MAINTAINED), its VMs still on it: every
    # tick converges it (its VMIs by label, their migrations' rows, the KubeVirt CR), as during any maintenance.
    Function("evacuation-report", "evacuation_report", {}, naive.evacuation_report,
             lambda plan: (NODE, None, MAINTAINED)),
)


IDLE_SAMPLE_S = 3.0     # how long the idle rate is measured, before each function's rounds


@dataclass
class Sample:
    requests: int
    bytes: int
    cpu_s: float            # above the idle rate
    wall_s: float
    decision: str = ""


@dataclass
class Row:
    function: str
    what: str                      # "tick", "event", or a variant of the tick ("list", "settle")
    vms: int
    naive: dict[str, float] = field(default_factory=dict)
    now: dict[str, float] = field(default_factory=dict)
    ratio: dict[str, float | None] = field(default_factory=dict)
    decision: str = ""
    idle_cpu_per_s: float = 0.0    # kube-apiserver's idle rate, taken off each sample's CPU

    @property
    def verdict(self) -> str:
        if self.what != "tick":
            return ""
        cheap = all((self.ratio.get(k) or 0) <= TARGET_RATIO for k in ("cpu_s", "bytes"))
        fast = self.vms < 10000 or self.now.get("wall_s", 0) < TARGET_TICK_S
        return "PASS" if cheap and fast else "MISS"


def idle_rate(plane: Any) -> float:
    """kube-apiserver's CPU seconds per second while nothing here calls it."""
    before, began = plane.cpu_seconds(), time.perf_counter()
    time.sleep(IDLE_SAMPLE_S)
    return (plane.cpu_seconds() - before) / (time.perf_counter() - began)


def measure(plane: Any, kube: Kube, run: Callable[[], Any], idle: float = 0.0) -> Sample:
    requests, received, cpu, began = kube.calls, kube.bytes_received, plane.cpu_seconds(), time.perf_counter()
    result = run()
    wall = time.perf_counter() - began
    decision = f"{result.verdict}/{result.effect}" if isinstance(result, Outcome) else ""
    if isinstance(result, Outcome) and result.reason:
        decision = f"{decision}: {result.reason}"
    used = max(0.0, plane.cpu_seconds() - cpu - idle * wall)
    return Sample(kube.calls - requests, kube.bytes_received - received, used, wall, decision)


def _median(samples: list[Sample]) -> dict[str, float]:
    return {k: statistics.median(getattr(s, k) for s in samples) for k in ("requests", "bytes", "cpu_s", "wall_s")}


def _ratio(now: dict[str, float], before: dict[str, float]) -> dict[str, float | None]:
    return {k: (now[k] / before[k] if before[k] else None) for k in now}


def _event(kind: Kind, obj: dict, operation: str = "update") -> intake.Incoming:
    meta = obj["metadata"]
    headers = {"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": str(uuid.uuid4()),
               "ce-type": f"dev.knative.apiserver.resource.{operation}", "ce-source": "https://10.43.0.1:443",
               "ce-subject": kind.path(meta.get("namespace"), meta["name"]), "ce-kind": obj["kind"],
               "ce-apiversion": obj["apiVersion"], "ce-name": meta["name"],
               **({"ce-namespace": meta["namespace"]} if meta.get("namespace") else {})}
    return intake.parse(headers, json.dumps(obj).encode())


def _ping() -> intake.Incoming:
    return intake.parse({"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": str(uuid.uuid4()),
                         "ce-type": PING, "ce-source": "/apis/v1/namespaces/vmevents/pingsources/vmevents-rescan"},
                        b"{}")


def _long_done(admin: Kube) -> list[tuple[str, str]]:
    """CHURN VMIMs that ended long ago (namespace, name): the changes a tick sees most. A migration that just
    ended is a change worth a look, and makes the tick settle: the "settle" row measures that tick."""
    from functions.migration_report.decide import precheck
    from functions.migration_report.settings import Settings

    now, settings = utcnow(), Settings()
    done = (m for m in admin.list(VMIM, cached=True) if precheck(m, settings, now) is not None)
    return [(m["metadata"]["namespace"], m["metadata"]["name"]) for m in itertools.islice(done, CHURN)]


def _churn(admin: Kube, vmims: list[tuple[str, str]]) -> None:
    """One write on each of these VMIMs, as migrations under way write between two ticks (an annotation, new
    each time so that each patch is a write: no function's decision changes)."""
    for namespace, name in vmims:
        admin.merge_patch(VMIM, namespace, name,
                          {"metadata": {"annotations": {"bench.vmevents.io/churn": str(time.time_ns())}}})



def event_object(admin: Kube, function: Function, plan: Plan) -> tuple[Kind, dict]:
    """The kind and object of the function's relevant event in the population, read as the admin."""
    kind, namespace, name = function.event_of(plan)
    if not name:  # the migration of vm-00000: its generated name
        name = next(m["metadata"]["name"] for m in admin.list(VMIM, namespace,
                                                              label_selector="kubevirt.io/vmi-name=vm-00000"))
    obj = admin.get(kind, namespace, name)
    assert obj is not None, f"{kind.kind} {namespace}/{name} is missing from the population"
    return kind, obj

def bench_size(plane: Any, cluster: Any, admin: Kube, plan: Plan, rounds: int,
               say: Callable[[str], None], only: set[str] | None = None) -> list[Row]:
    import importlib

    rows = []
    churned = _long_done(admin)  # the same ones each round: listed once per size
    for function in (f for f in FUNCTIONS if not only or f.name in only):
        handler = importlib.import_module(f"functions.{function.package}.handler")
        settings_module = importlib.import_module(f"functions.{function.package}.settings")
        settings = settings_module.load(function.env)
        kube = Kube(cluster.api_client(service_account=function.service_account))
        ctx: KubeContext = KubeContext(function.name, settings, utcnow, kube, Recorder(kube, function.name))
        kind, obj = event_object(admin, function, plan)
        ticks: dict[str, list[Sample]] = {"naive": [], "now": []}
        events: dict[str, list[Sample]] = {"naive": [], "now": []}
        variants = {what: KubeContext(function.name, settings_module.load({**function.env, **env}), utcnow, kube,
                                      ctx.recorder) for what, env in function.variants.items()}
        varied: dict[str, list[Sample]] = {what: [] for what in variants}
        measure(plane, kube, lambda h=handler, c=ctx: h.on_event(_ping(), c))  # warm: connections, first Events
        idle = idle_rate(plane)
        for _ in range(rounds):
            _churn(admin, churned)
            ticks["naive"].append(measure(plane, kube, lambda f=function, c=ctx: f.naive_tick(c), idle))
            ticks["now"].append(measure(plane, kube, lambda h=handler, c=ctx: h.on_event(_ping(), c), idle))
            for what, variant in variants.items():
                _churn(admin, churned)
                if what in function.prepare:
                    function.prepare[what](admin)
                varied[what].append(measure(plane, kube, lambda h=handler, c=variant: h.on_event(_ping(), c), idle))
            event = _event(kind, obj)
            if function.naive_event is not None:
                events["naive"].append(measure(plane, kube, lambda f=function, c=ctx: f.naive_event(c), idle))
            events["now"].append(measure(plane, kube, lambda h=handler, c=ctx, e=event: h.on_event(e, c), idle))
        parts = [("tick", ticks), *((what, {"naive": ticks["naive"], "now": v}) for what, v in varied.items()),
                 ("event", events)]
        for what, samples in parts:
            now = _median(samples["now"])
            before = _median(samples["naive"]) if samples["naive"] else now
            rows.append(Row(function.name, what, plan.vms, before, now, _ratio(now, before),
                            samples["now"][-1].decision[:300], idle))
        tick = next(r for r in rows if r.function == function.name and r.vms == plan.vms and r.what == "tick")
        say(f"  {function.name}: tick {tick.now['wall_s']:.2f} s, {tick.verdict}")
    return rows


def run_bench(sizes: list[int], rounds: int, say: Callable[[str], None] = print,
              only: set[str] | None = None) -> list[Row]:
    from kubernetes import config

    from controlplane.cluster import RealCluster
    from controlplane.server import ControlPlane

    rows: list[Row] = []
    plane = ControlPlane(die_with_parent=True)
    try:
        plane.start(say=say)
        # The population is written as stored objects and read back by the re-scans: no KubeVirt acts on it (its
        # migration controller would update the VMIMs between rounds, and the writes would conflict).
        cluster = RealCluster(plane, virt_controller=False).start()
        client = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
        client.configuration.connection_pool_maxsize = 32
        admin = Kube(client)
        plan, made = Plan(0), 0
        for size in sorted(sizes):
            plan.vms = size
            began = time.perf_counter()
            populate(admin, plan, start=made, say=say)
            made = size
            say(f"{size} VMs: populated in {time.perf_counter() - began:.0f} s ({plan.expected})")
            time.sleep(3)  # let the watch cache and the garbage collector's informers catch up
            rows += bench_size(plane, cluster, admin, plan, rounds, say, only)
        cluster.stop()
    finally:
        plane.remove()
    return rows


def _bytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render(rows: list[Row]) -> str:
    lines = ["API-server cost per function, naive full LIST vs now (medians of one run; ratio = now / naive)", ""]
    head = (f"{'VMs':>6} {'function':<17} {'what':<5} {'requests':>13} {'bytes received':>27} "
            f"{'API-server CPU s':>25} {'wall s':>15}  target")
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.vms:>6} {r.function:<17} {r.what:<5} "
            f"{r.naive['requests']:>5.0f} → {r.now['requests']:<5.0f} "
            f"{_bytes(r.naive['bytes']):>9} → {_bytes(r.now['bytes']):<9} {_pct(r.ratio['bytes']):>6} "
            f"{r.naive['cpu_s']:>6.2f} → {r.now['cpu_s']:<6.2f} {_pct(r.ratio['cpu_s']):>6} "
            f"{r.naive['wall_s']:>5.2f} → {r.now['wall_s']:<5.2f}  {r.verdict}")
    lines += ["", f"targets: a re-scan's bytes and API-server CPU ≤ {TARGET_RATIO:.0%} of naive; a tick < "
                  f"{TARGET_TICK_S:.0f} s at 10,000 VMs. An event row whose naive equals now: that path did not "
              "change (the same code measured twice). A list row: the tick without its cursor (the first, or one after "
              "the cursor expired); a settle row: a tick that reads every finding on record; both against the same "
              "naive ticks."]
    idle = {vms: [r.idle_cpu_per_s for r in rows if r.vms == vms] for vms in sorted({r.vms for r in rows})}
    lines += ["API-server CPU is above its idle rate, measured before each function's rounds (CPU s per s): "
              + ", ".join(f"{min(rates):.3f}–{max(rates):.3f} at {vms} VMs" for vms, rates in idle.items()) + "."]
    lines += _amortised(rows)
    return "\n".join(lines)


_ING = {"settle": "settling", "renew": "renewing"}


def _amortised(rows: list[Row]) -> list[str]:
    """A function whose ticks settle once in n: its per-tick cost on average, against the naive tick."""
    lines = []
    for function in (f for f in FUNCTIONS if f.settle_every_ticks):
        n = function.settle_every_ticks
        for vms in sorted({r.vms for r in rows}):
            found = {r.what: r for r in rows if r.function == function.name and r.vms == vms}
            if "tick" not in found or function.amortised not in found:
                continue
            tick, settle = found["tick"], found[function.amortised]
            mean = {k: (tick.now[k] * (n - 1) + settle.now[k]) / n for k in ("bytes", "cpu_s")}
            ratio = _ratio(mean, {k: tick.naive[k] for k in mean})
            verdict = "PASS" if all((ratio[k] or 0) <= TARGET_RATIO for k in mean) else "MISS"
            lines.append(f"{function.name} at {vms} VMs, one tick in {n} {_ING[function.amortised]}: on average "
                         f"{_bytes(mean['bytes'])} ({_pct(ratio['bytes'])}) and {mean['cpu_s']:.2f} CPU s "
                         f"({_pct(ratio['cpu_s'])}) a tick  {verdict}")
    return [""] + lines if lines else []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--functions", default="", help="only these (comma-separated names); default: all")
    args = parser.parse_args(argv)
    from controlplane import build

    if not build.buildable():
        print("api_cost: skipped: the real control plane cannot be built here (needs Go; see docs/control-plane.md)")
        return 0
    only = {name.strip() for name in args.functions.split(",") if name.strip()}
    rows = run_bench([int(s) for s in args.sizes.split(",")], args.rounds,
                     say=lambda text: print(text, file=sys.stderr, flush=True), only=only)
    print(json.dumps([asdict(r) | {"verdict": r.verdict} for r in rows], indent=2) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))

"""`vmevents explain <namespace>/<vm>`, `vmevents check`, `vmevents knative plan|install` (cli/__init__.py)."""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmevents", description="vmevents, for the operator of a cluster.")
    commands = parser.add_subparsers(dest="command", required=True)
    explain = commands.add_parser(
        "explain", help="what every function would decide about one VM now, and why; its findings and Events",
        description="Read-only: every request is a GET, with your kubeconfig (KUBECONFIG, or --kubeconfig).")
    explain.add_argument("vm", metavar="NAMESPACE/VM")
    explain.add_argument("--output", "-o", choices=("text", "json"), default="text")
    explain.add_argument("--kubeconfig", help="default: KUBECONFIG, else ~/.kube/config")
    explain.add_argument("--functions-namespace", default="vmevents",
                         help="where vmevents' Knative Services are (their settings are read there)")
    knative = commands.add_parser("knative", help="the Knative that fits this cluster: plan it, or install it")
    knative.add_argument("action", choices=("plan", "install"))
    knative.add_argument("--kubeconfig", help="default: KUBECONFIG, else ~/.kube/config")
    knative.add_argument("--kubernetes", metavar="1.33", help="plan for this Kubernetes instead of asking the cluster")
    knative.add_argument("--from", dest="source", metavar="DIR",
                         help="the release's YAML files from this folder instead of Knative's GitHub releases")
    knative.add_argument("--components", default="serving,kourier,eventing",
                         help="comma-separated, of serving, kourier, eventing (default: all three)")
    knative.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for Ready (default 600)")
    knative.add_argument("--kubectl", default="kubectl", help="the kubectl to run (default: kubectl on PATH)")
    check = commands.add_parser("check", help="every function's settings, as its Knative Service or these give them",
                                description="Reads each Knative Service's env in the cluster (read-only), or the "
                                            "NAME=VALUE given for --function, and names every wrong setting.")
    check.add_argument("settings", nargs="*", metavar="NAME=VALUE")
    check.add_argument("--function", help="check these settings for this function instead of the cluster's")
    check.add_argument("--kubeconfig")
    check.add_argument("--functions-namespace", default="vmevents")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.command == "explain":
        return run_explain(args)
    if args.command == "knative":
        return run_knative(args)
    return run_check(args)


def run_knative(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from cli import knative

    try:
        if args.kubernetes:
            version = knative.kubernetes_version(args.kubernetes)
        else:
            from shared.kubeconfig import connect

            version = knative.kubernetes_version(str(connect().request("GET", "/version").get("gitVersion", "")))
    except Exception as exc:  # noqa: BLE001 - no cluster, no answer, an unreadable version: one line
        print(f"vmevents knative: cannot read the cluster's Kubernetes version: "
              f"{getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    found = knative.plan(version)
    if found.refused:
        print(f"vmevents knative: refused: {found.reason}", file=sys.stderr)
        return 3
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    print(found.reason)
    if args.action == "plan":
        for step in found.steps(components):
            print(f"  kubectl apply -f {step.url()}")
        return 0
    kubectl = [*shlex.split(args.kubectl), *([f"--kubeconfig={os.environ['KUBECONFIG']}"]
                                              if os.environ.get("KUBECONFIG") else [])]
    try:
        knative.install(found, kubectl, source=Path(args.source) if args.source else None, timeout=args.timeout,
                        components=components)
    except knative.InstallError as exc:
        print(f"vmevents knative: {exc}", file=sys.stderr)
        return 1
    return 0


def run_check(args: argparse.Namespace) -> int:
    from cli import explain, registry
    from shared.settings import SettingsError, lookalikes

    if args.function:
        given = dict(item.partition("=")[::2] for item in args.settings)
        envs: dict[str, dict[str, str] | None] = {args.function: given}
    else:
        from shared.kubeconfig import connect

        try:
            kube = explain.read_only(connect())
        except RuntimeError as exc:
            print(f"vmevents check: {exc}", file=sys.stderr)
            return 1
        envs = {f: explain.service_env(kube, args.functions_namespace, f) for f in explain.FUNCTIONS}
    wrong = 0
    for function, env in envs.items():
        if env is None:
            print(f"{function}: its Knative Service {args.functions_namespace}/{function} could not be read")
            wrong += 1
            continue
        try:
            registry.settings_loader(function)(env)
        except SettingsError as exc:
            print(f"{function}: {exc}")
            wrong += 1
        else:
            print(f"{function}: every setting is right")
        for line in lookalikes(function, env):
            print(line)
    return 1 if wrong else 0


def run_explain(args: argparse.Namespace) -> int:
    from cli import explain
    from shared.errors import VmeventsError
    from shared.kubeconfig import connect

    namespace, _, name = args.vm.partition("/")
    if not namespace or not name or "/" in name:
        print(f"vmevents explain: {args.vm!r} is not NAMESPACE/VM", file=sys.stderr)
        return 2
    try:
        found = explain.explain(connect(), namespace, name, functions_namespace=args.functions_namespace)
    except (RuntimeError, VmeventsError) as exc:
        print(f"vmevents explain: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    print(explain.as_json(found) if args.output == "json" else explain.text(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

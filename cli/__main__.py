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
    args = parser.parse_args(argv)
    if args.command == "explain":
        return run_explain(args)
    return 2


def run_explain(args: argparse.Namespace) -> int:
    from cli import explain
    from shared.errors import VmeventsError
    from shared.kubeconfig import connect

    namespace, _, name = args.vm.partition("/")
    if not namespace or not name or "/" in name:
        print(f"vmevents explain: {args.vm!r} is not NAMESPACE/VM", file=sys.stderr)
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    try:
        found = explain.explain(connect(), namespace, name, functions_namespace=args.functions_namespace)
    except (RuntimeError, VmeventsError) as exc:
        print(f"vmevents explain: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    print(explain.as_json(found) if args.output == "json" else explain.text(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())

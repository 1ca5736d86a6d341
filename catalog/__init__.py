"""The functions vmevents ships, and everything derived from their declarations.

FUNCTIONS is the one list a new function is added to (docs/ARCHITECTURE.md, "Adding a function"): its order is
the order of deploy/base/kustomization.yaml's resources, of README's table and of the `make run` stories. Each
name is a folder of functions/ with a declaration.py (shared/declaration.py); `python -m catalog` (make generate)
writes what derives from them, and tests/test_catalog.py fails, naming the file, when a committed one differs.
"""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

from shared.declaration import Function

REPO = Path(__file__).resolve().parents[1]

FUNCTIONS = (
    "vmi_cleanup",
    "device_conflict",
    "migration_report",
    "io_pause_report",
    "vm_stuck_report",
    "evacuation_report",
    "alert_forwarder",
    "dead_letter",
)


@functools.cache
def declarations() -> tuple[Function, ...]:
    """Every function's declaration, in FUNCTIONS' order."""
    found = []
    for package in FUNCTIONS:
        declared = importlib.import_module(f"functions.{package}.declaration").DECLARATION
        if declared.package != package:
            raise ValueError(f"functions/{package}/declaration.py declares {declared.name!r}, whose folder would be "
                             f"functions/{declared.package}/")
        found.append(declared)
    return tuple(found)


def declared(name: str) -> Function:
    """One function's declaration, by its name ("vmi-cleanup") or its Knative Service's ("vmevents-dead-letter")."""
    for function in declarations():
        if name in (function.name, function.service_name, function.package):
            return function
    raise KeyError(f"no function {name!r} in catalog.FUNCTIONS")


def discovered() -> list[str]:
    """The folders of functions/ that hold a declaration, whether FUNCTIONS lists them or not."""
    return sorted(p.parent.name for p in (REPO / "functions").glob("*/declaration.py"))

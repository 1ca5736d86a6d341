"""One decide contract (docs/ARCHITECTURE.md, "One function's files"): every function that makes decisions has
`decide(facts, settings, now)` in its decide.py, returning a frozen verdict with an `action` and a `reason`."""
from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from tests.conftest import REPO

DECIDING = sorted(p.parent.name for p in (REPO / "functions").glob("*/decide.py"))
# Functions whose move to the contract is another change's (each names it); remove a line as it lands.
PENDING = {"vm_stuck_report": "issue 35 moves it to decide(facts, settings, now)"}


def contract_breaches(package: str) -> list[str]:
    module = importlib.import_module(f"functions.{package}.decide")
    decide = getattr(module, "decide", None)
    if decide is None:
        return ["has no decide()"]
    breaches = []
    parameters = list(inspect.signature(decide).parameters)
    if parameters != ["facts", "settings", "now"]:
        breaches.append(f"decide{tuple(parameters)} is not decide(facts, settings, now)")
    verdict = getattr(module, "Verdict", None)
    if verdict is None or not dataclasses.is_dataclass(verdict) or not verdict.__dataclass_params__.frozen:
        breaches.append("its Verdict is not a frozen dataclass")
    elif not {"action", "reason"} <= {f.name for f in dataclasses.fields(verdict)}:
        breaches.append("its Verdict has no action and reason")
    facts = getattr(module, "Facts", None)
    if facts is None or not dataclasses.is_dataclass(facts) or not facts.__dataclass_params__.frozen:
        breaches.append("its Facts is not a frozen dataclass")
    return breaches


@pytest.mark.parametrize("package", DECIDING)
def test_every_decide_is_decide_of_facts_settings_and_now(package):
    breaches = contract_breaches(package)
    if package in PENDING:
        return
    assert not breaches, f"functions/{package}/decide.py: {'; '.join(breaches)} (docs/ARCHITECTURE.md)"


def test_the_pending_ones_are_functions_that_decide():
    assert set(PENDING) <= set(DECIDING)

"""`vmevents explain` asks every function that decides: each has its explain.py (functions/<name>/explain.py, the
file docs/ARCHITECTURE.md lists) and is in cli.explain.FUNCTIONS; a function added without them would be silently
left out of every answer."""
from __future__ import annotations

import catalog
from cli import explain, registry
from tests.conftest import REPO

NOT_ASKED = {"dead_letter": "logs what the broker could not deliver: nothing to decide about a VM"}


def test_every_function_that_decides_is_asked():
    deciding = [f for f in catalog.FUNCTIONS if f not in NOT_ASKED]
    assert sorted(f.replace("-", "_") for f in explain.FUNCTIONS) == sorted(deciding)
    for package in deciding:
        assert (REPO / "functions" / package / "explain.py").is_file(), f"functions/{package}/explain.py is missing"
    for function in explain.FUNCTIONS:
        assert callable(registry.explainer(function)) and callable(registry.settings_loader(function))

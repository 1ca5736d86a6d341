"""The fuzz suite's world: one simulated cluster in a quiet state (nothing in it needs an action), every
function served by functions-framework with its own ServiceAccount's credentials, and the tally of answers.

Bounded for `make test` (FUZZ_EXAMPLES requests per function and strategy); `make fuzz` sets
VMEVENTS_FUZZ=long, the hypothesis profile that draws ten times as many, and `make test-fast` VMEVENTS_FUZZ=quick,
a fifth as many. The tally (requests tried and
answers by status, per function) is printed at the end of the run and written to .run/fuzz-tally.json.
"""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from contextlib import ExitStack

import pytest
from hypothesis import HealthCheck, settings

from tests.conftest import REPO

FUZZ_EXAMPLES = 300
settings.register_profile("vmevents-fuzz", max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("vmevents-fuzz-long", max_examples=FUZZ_EXAMPLES * 10, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("vmevents-fuzz-quick", max_examples=FUZZ_EXAMPLES // 5, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
PROFILE = {"long": "vmevents-fuzz-long", "quick": "vmevents-fuzz-quick"}.get(os.environ.get("VMEVENTS_FUZZ", ""),
                                                                            "vmevents-fuzz")

# function -> family -> status -> count
TALLY: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))


def pytest_terminal_summary(terminalreporter):
    if not TALLY:
        return
    total = sum(sum(c.values()) for families in TALLY.values() for c in families.values())
    terminalreporter.section(f"fuzz: {total} requests ({PROFILE})")
    summary = {}
    for function, families in sorted(TALLY.items()):
        statuses = sum(families.values(), Counter())
        summary[function] = {"requests": sum(statuses.values()), "by_status": dict(sorted(statuses.items())),
                             "by_family": {f: dict(sorted(c.items())) for f, c in sorted(families.items())}}
        terminalreporter.write_line(f"{function:18} {sum(statuses.values()):6}  "
                                    + "  ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
    (REPO / ".run").mkdir(exist_ok=True)
    (REPO / ".run" / "fuzz-tally.json").write_text(json.dumps({"profile": PROFILE, "requests": total,
                                                               "functions": summary}, indent=1))


@pytest.fixture(scope="session")
def fuzz_world():
    from tests.fuzz.world import FuzzWorld

    with ExitStack() as stack:
        yield stack.enter_context(FuzzWorld())

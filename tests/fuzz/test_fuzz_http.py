"""Every function's HTTP entry point, fuzzed against the simulated cluster (tests/fuzz/world.py): whatever
arrives, the answer is 2xx, 400 or 503, the one log line is written, and nothing is written to the cluster
(the world is quiet, so any write would be a function acting on a payload's word). Some requests meet an API
that fails or is slow: the answer is then a 503 keeping the API's Retry-After."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import PROFILE, TALLY
from tests.fuzz.strategies import Case, requests_for
from tests.fuzz.world import FUNCTIONS

# What the API server does to every request of the function during one fuzzed request: nothing (most of the
# time), fail (the answer must be a 503 that keeps the API's Retry-After) or be slow.
FAULTS = st.sampled_from([None] * 6 + [{"status": 503}, {"status": 429, "retry_after": 7}, {"status": 500},
                                       {"status": 504, "retry_after": 2}, {"kind": "latency", "delay": 0.05}])


def check(world, function: str, case: Case, fault: dict | None = None) -> None:
    response, lines, writes = world.send(function, case.headers, case.body, fault)
    status = response.status_code
    TALLY[function][case.family if not fault else f"{case.family}+api-{fault.get('status', 'slow')}"][status] += 1
    assert 200 <= status < 300 or status in (400, 503), (status, response.data[:500])
    if status == 503 and fault and fault.get("retry_after"):
        assert response.headers.get("Retry-After") == str(fault["retry_after"]), response.headers
    assert not writes, f"{function} wrote {writes} for {case!r}"
    assert len(lines) == 1, f"{function} wrote {len(lines)} log lines"
    line = lines[0]
    assert line["function"] == function and line["outcome"] == status, line
    if status == 400:
        assert response.get_json()["error"], response.data


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_any_request_is_2xx_400_or_503_logged_and_writes_nothing(fuzz_world, function, data):
    check(fuzz_world, function, data.draw(requests_for(function), label="request"), data.draw(FAULTS, label="api"))

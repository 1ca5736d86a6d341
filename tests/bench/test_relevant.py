"""`make bench`'s relevant-event latency (bench/relevant.py) at a tiny size on the real control plane: the function
served as deployed answers its relevant event, and each part of the row is measured. No time is asserted."""
import pytest

from bench.relevant import render, run_bench
from controlplane import build

pytestmark = [pytest.mark.timeout(600), pytest.mark.real,
              pytest.mark.skipif(not build.buildable(), reason="the real control plane cannot be had here (Go)")]


@pytest.fixture(scope="module")
def rows():
    return run_bench(60, events=5, say=lambda text: None, only={"vmi-cleanup"})


def test_the_relevant_event_is_decided_and_timed_with_its_api_calls(rows):
    [row] = rows
    assert row.function == "vmi-cleanup" and row.events == 5
    assert "would-delete-vmi" in row.decision or "would-halt-vm" in row.decision, row.decision
    for times in (row.in_function_ms, row.round_trip_ms):
        assert 0 < times["p50"] <= times["p99"] <= times["max"]
    assert row.in_function_ms["p50"] <= row.round_trip_ms["p50"]
    # GET VMI, GET VM, KubeVirt CR, migrations, and its Event (create, then count again): a handful, never zero.
    assert 4 <= row.api_calls["median"] <= row.api_calls["max"] <= 12, row.api_calls
    assert "vmi-cleanup" in render(rows)

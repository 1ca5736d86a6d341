"""`make bench`'s API-cost part at a tiny size on the real control plane: every function, per tick and per
event, naive and now, measured through the real handlers. No cost is asserted at this size (a handful of
VMs says nothing about 10,000); what is asserted is that each part is measured and finds what it must."""
import pytest

from bench.api_cost import FUNCTIONS, render, run_bench
from controlplane import build

pytestmark = [pytest.mark.real, pytest.mark.timeout(600),
              pytest.mark.skipif(not build.buildable(), reason="the real control plane cannot be had here (Go)")]


@pytest.fixture(scope="module")
def rows():
    return run_bench([60], rounds=1, say=lambda text: None)


def test_every_function_is_measured_per_tick_and_per_event(rows):
    assert {(r.function, r.what) for r in rows} == {(f.name, w) for f in FUNCTIONS for w in ("tick", "event")} | {
        (f.name, what) for f in FUNCTIONS for what in f.variants}
    for row in rows:
        for side in (row.naive, row.now):
            assert side["requests"] >= 1 and side["bytes"] > 0 and side["wall_s"] > 0 and side["cpu_s"] >= 0


def test_the_ticks_find_the_candidates_the_population_holds(rows):
    decision = {(r.function, r.what): r.decision for r in rows}
    assert "visited 1 of 1 candidate(s)" in decision["vmi-cleanup", "tick"]       # vm-00007's Succeeded VMI
    assert "1 paused or in an episode" in decision["io-pause-report", "tick"]     # vm-00011, paused on IO errors
    # Steady, from its cursor: the bench's churn, every VMIM that ended long ago (3 of the 4 here: vm-00000's
    # failed five minutes ago); without the cursor, every VMIM's row.
    assert "3 change(s) since the cursor" in decision["migration-report", "tick"], decision
    assert "none to look at" in decision["migration-report", "tick"]              # nothing to settle
    assert "listed 4 migration(s)" in decision["migration-report", "list"]
    assert "none to look at" not in decision["migration-report", "settle"]
    assert "irrelevant" not in decision["device-conflict", "event"]
    assert "1 in a stuck state or on record" in decision["vm-stuck-report", "tick"]  # vm-00017, ErrorUnschedulable
    assert decision["vm-stuck-report", "event"].startswith("report/")
    # harvester-node-7, in Harvester's maintenance mode with vm-00057 still on it (vm-00007's VMI there ended)
    assert "1 being emptied, down or on record" in decision["evacuation-report", "tick"], decision
    assert decision["evacuation-report", "event"].startswith("report/"), decision


def test_a_tick_now_reads_fewer_bytes_than_the_naive_full_list(rows):
    # Not migration-report here: the bench's churn changes every one of the 4 VMIMs at this size, so its changes
    # are the whole list (at 10,000 VMs they are 20 of 500).
    for row in rows:
        if row.what == "tick" and row.function in ("vmi-cleanup", "io-pause-report", "vm-stuck-report",
                                                   "evacuation-report"):
            assert row.now["bytes"] < row.naive["bytes"], row


def test_the_report_shows_both_sides_and_the_ratio(rows):
    text = render(rows)
    for part in ("naive full LIST vs now", "bytes received", "API-server CPU s", "vmi-cleanup", "device-conflict",
                 "migration-report at 60 VMs, one tick in 5 settling: on average"):
        assert part in text

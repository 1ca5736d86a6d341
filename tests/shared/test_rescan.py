"""shared/rescan.py: a re-scan's visits stop at the budget (never cut off), run a few at once, keep each
object's failure its own, and over ticks skip nothing."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from shared import rescan
from shared.errors import TemporaryError
from shared.settings import SettingsError


@dataclass(frozen=True)
class Item:
    namespace: str
    name: str


class FakeTimer:
    """A clock that only moves when a visit says how long it took."""

    def __init__(self):
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def spend(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def settings(budget: float = 20, workers: int = 1) -> rescan.Settings:
    return rescan.Settings(budget=timedelta(seconds=budget), workers=workers)


def test_every_candidate_is_visited_when_the_budget_suffices():
    items = [Item("ns", f"vm{i}") for i in range(10)]
    scan = rescan.run(items, lambda item: item.name, settings(workers=4))
    assert sorted(scan.results) == sorted(i.name for i in items)
    assert scan.visited == 10 and not scan.stopped and not scan.failures
    assert scan.progress().startswith("visited 10 of 10 candidate(s)")


def test_the_budget_stops_new_visits_and_says_how_far_it_got():
    timer = FakeTimer()

    def visit(item: Item) -> str:
        timer.spend(3)
        return item.name

    scan = rescan.run([Item("ns", f"vm{i}") for i in range(10)], visit, settings(budget=10), timer=timer)
    # 0 → 3 → 6 → 9: a fourth visit would end at 12, past the budget of 10; it is not started.
    assert scan.results == ["vm0", "vm1", "vm2"] and scan.stopped and scan.visited == 3
    assert "stopped at the re-scan budget, the next tick visits the other 7" in scan.progress()


def test_the_listing_counts_against_the_budget_and_the_first_visit_always_starts():
    timer = FakeTimer()
    timer.spend(25)  # the candidates took longer to list than the whole budget

    def visit(item: Item) -> str:
        timer.spend(1)
        return item.name

    scan = rescan.run([Item("ns", "a"), Item("ns", "b")], visit, settings(budget=20), started=0.0, timer=timer)
    assert scan.results == ["a"] and scan.stopped  # progress every tick, whatever the API's speed


def test_a_visit_already_started_is_finished_not_cut_off():
    timer = FakeTimer()

    def visit(item: Item) -> str:
        timer.spend(30)  # far past the budget
        return item.name

    scan = rescan.run([Item("ns", "a"), Item("ns", "b")], visit, settings(budget=20), timer=timer)
    assert scan.results == ["a"] and scan.visited == 1 and scan.stopped


def test_one_objects_failure_is_its_own_and_reported():
    def visit(item: Item) -> str:
        if item.name == "bad":
            raise TemporaryError("GET default/bad: the server is currently unable to handle the request")
        if item.name == "odd":
            raise KeyError("status")  # a bug on one odd object stops nobody else either
        return item.name

    items = [Item("default", n) for n in ("a", "bad", "b", "odd", "c")]
    scan = rescan.run(items, visit, settings(workers=2))
    assert sorted(scan.results) == ["a", "b", "c"] and scan.visited == 5
    assert {f.subject for f in scan.failures} == {"default/bad", "default/odd"}
    assert "2 failed, retried next tick" in scan.progress() and "default/bad: GET default/bad" in scan.progress()


def test_at_most_workers_visits_run_at_once():
    running, most, lock = [0], [0], threading.Lock()

    def visit(item: Item) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    rescan.run([Item("ns", str(i)) for i in range(20)], visit, settings(workers=3))
    assert most[0] == 3


def test_rotation_moves_the_start_so_that_over_ticks_nothing_is_skipped():
    """A candidate that stays one (it waits, or keeps failing) cannot starve those after it: with the
    budget for two visits a tick, each tick starts one place further (tick_number moves by one a minute)."""
    items = [Item("ns", f"vm{i}") for i in range(5)]
    seen: set[str] = set()
    minute = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    for tick in range(len(items)):
        timer = FakeTimer()

        def visit(item: Item, timer: FakeTimer = timer) -> str:
            timer.spend(4)
            return item.name

        scan = rescan.run(items, visit, settings(budget=10), timer=timer,
                          rotation=rescan.tick_number(minute + timedelta(minutes=tick)))
        assert scan.stopped and len(scan.results) == 2
        seen |= set(scan.results)
    assert seen == {i.name for i in items}


def test_gather_reads_in_parallel_in_order_and_raises_the_first_error():
    began = time.monotonic()
    assert rescan.gather([3, 1, 2], lambda n: (time.sleep(0.2), n * 10)[1], settings(workers=3)) == [30, 10, 20]
    assert time.monotonic() - began < 0.5
    with pytest.raises(TemporaryError):
        rescan.gather([1, 2], lambda n: (_ for _ in ()).throw(TemporaryError("LIST failed")), settings(workers=2))


def test_settings_default_below_the_delivery_timeout_and_refuse_what_would_not_be():
    assert rescan.load({}) == rescan.Settings(budget=timedelta(seconds=20), workers=8)
    assert rescan.load({}).budget < rescan.DELIVERY_TIMEOUT
    assert rescan.load({"RESCAN_BUDGET": "10s", "RESCAN_WORKERS": "2"}) == rescan.Settings(timedelta(seconds=10), 2)
    for env, name in (({"RESCAN_BUDGET": "45s"}, "RESCAN_BUDGET"), ({"RESCAN_BUDGET": "0s"}, "RESCAN_BUDGET"),
                      ({"RESCAN_BUDGET": "soon"}, "RESCAN_BUDGET"), ({"RESCAN_WORKERS": "0"}, "RESCAN_WORKERS"),
                      ({"RESCAN_WORKERS": "2.5"}, "RESCAN_WORKERS")):
        with pytest.raises(SettingsError, match=name):
            rescan.load(env)

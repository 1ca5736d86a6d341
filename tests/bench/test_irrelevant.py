"""bench/irrelevant.py's arithmetic and report, on figures made up for the purpose (no server is started: the
benchmark itself is `make bench`, a report, not a test)."""
from __future__ import annotations

import pytest

from bench import irrelevant
from bench.events import IRRELEVANT, NOOP


def test_a_pair_ratio_is_the_median_of_per_pair_ratios_with_their_quartiles():
    median, spread = irrelevant.paired_ratio([(90.0, 100.0), (200.0, 100.0), (95.0, 100.0), (99.0, 100.0),
                                              (50.0, 100.0)])
    assert median == pytest.approx(0.95)
    assert spread[0] == pytest.approx(0.5) and spread[-1] == pytest.approx(2.0)
    assert spread[0] <= spread[1] <= median <= spread[2] <= spread[3]


def test_a_pair_without_a_measure_is_left_out():
    assert irrelevant.paired_ratio([(90.0, 0.0), (80.0, 100.0)])[0] == pytest.approx(0.8)


def test_the_no_op_runs_first_in_half_of_each_functions_pairs_and_of_each_rounds():
    functions = [name for name in IRRELEVANT if name != NOOP.function]
    orders = {(r, p): irrelevant.pair_order(f, NOOP.function, r, p) for r in range(4) for p, f in
              enumerate(functions)}
    for position in range(len(functions)):
        assert sum(orders[r, position][0] == NOOP.function for r in range(4)) == 2
    for r in range(4):
        first = [orders[r, p][0] == NOOP.function for p in range(len(functions))]
        assert abs(sum(first) - (len(functions) - sum(first))) <= 1


def _report(served: bool) -> irrelevant.Report:
    names = list(IRRELEVANT)
    report = irrelevant.Report("wrk", {"rounds": 2, "load": "wrk -c8", "startups": 2, "client_configuration":
                                       "in-cluster", "cpu": 1})
    for index, name in enumerate(names):
        report.rates[name] = [1000.0 - index, 990.0]
        report.cpu_us[name] = [500.0 + index, 505.0]
        report.startup_s[name], report.idle_rss_mib[name], report.loaded_rss_mib[name] = 0.3, 63.0, 64.0
        report.instructions[name] = 486_000.0 + 10_000 * index
        if served:
            report.served_instructions[name] = 2_000_000.0 + 200_000 * index
        if name != NOOP.function:
            report.ratios[name], report.spread[name] = 0.97, [0.6, 0.9, 1.0, 1.4]
            report.cpu_ratios[name], report.cpu_spread[name] = 0.99, [0.8, 0.95, 1.01, 1.1]
            report.startup_ratios[name] = 1.1
            report.verdicts[name] = {"irrelevant": 10}
    return report


def test_the_throughput_verdict_is_on_events_per_cpu_second_with_the_served_ratio_beside_it():
    lines = {line.split()[0]: line for line in irrelevant.render(_report(served=True)).splitlines()
             if line.strip() and line.split()[0] in IRRELEVANT and "," in line}
    # device-conflict (the second function): 2.0 M ÷ 2.4 M instructions served = 0.833, shown; judged: 0.99
    assert "0.833x" in lines["device-conflict"] and "0.990x PASS" in lines["device-conflict"]
    assert "0.909x" in lines["vmi-cleanup"]


def test_without_served_counts_the_verdict_is_on_events_per_cpu_second():
    text = irrelevant.render(_report(served=False))
    assert "0.990x PASS" in text
    assert "per-pair events/s ratios, min / quartiles / max: vmi-cleanup 0.60 0.90 1.00 1.40" in text
    assert "servers and wrk pinned to CPU 1" in text

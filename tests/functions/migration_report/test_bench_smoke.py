"""`make bench` for migration-report, in miniature: it runs, and what it reports holds."""
import contextlib

from bench.load import Load
from bench.migration_report import render, run


def test_the_benchmark_runs_and_irrelevant_updates_make_no_api_call(tmp_path):
    with contextlib.ExitStack() as stack:
        report = run(1, Load(seconds=1, connections=2), "python", stack, tmp_path)
    assert report["irrelevant_events"] > 0 and report["irrelevant_calls"] == 0
    duplicates = report["duplicates"]
    assert duplicates["decisions"].get("report-failed") == 1          # reported once ...
    assert duplicates["api_calls_per_event"] <= 4.5                     # ... then 4 reads per duplicate
    # the Events for people on the VM and the VMI, and the finding's own on the VMIM (shared/ledger.py)
    assert sorted(duplicates["events_recorded"]) == [("VirtualMachine", 1), ("VirtualMachineInstance", 1),
                                                     ("VirtualMachineInstanceMigration", 1)]
    assert "throughput ratio migration-report / no-op" in render(report)

"""The node stand-in's part of a migration, pure: virt-launcher's monitor arithmetic and virt-handler's report."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from simcluster.kubevirt import migration as nm

START = datetime(2026, 12, 2, 5, 0, 0, tzinfo=UTC)


def _vmi(guest=None, requests=None):
    domain: dict = {}
    if guest:
        domain["memory"] = {"guest": guest}
    if requests:
        domain["resources"] = {"requests": {"memory": requests}}
    return {"spec": {"domain": domain}}


@pytest.mark.parametrize("vmi, gigabytes", [
    (_vmi("8Gi"), 9),                       # 8.59 GB, rounded up
    (_vmi("2Gi"), 3),
    (_vmi(None, "1365Mi"), 2),              # the request when no guest memory is set
    (_vmi("2Gi", "64Mi"), 3),               # guest memory overrides the request
    (_vmi("1G"), 1),
    (_vmi(), 0),
])
def test_the_data_size_is_the_memory_in_whole_decimal_gigabytes_rounded_up(vmi, gigabytes):
    assert nm.data_gigabytes(vmi) == gigabytes


def test_the_completion_budget_uses_what_virt_controller_wrote_else_the_versions_default():
    state = {"migrationUid": "u1", "migrationConfiguration": {"completionTimeoutPerGiB": 100, "progressTimeout": 150}}
    run = nm.run_for(nm.Plan(nm.COMPLETION_TIMEOUT), _vmi("2Gi"), state, (1, 8, 3))
    assert (run.seconds, run.failure) == (301, "Live migration is not completed after 300 seconds and has been aborted")
    old = nm.run_for(nm.Plan(nm.COMPLETION_TIMEOUT), _vmi("8Gi"), {"migrationUid": "u2"}, (1, 3, 0))
    assert old.failure == nm.NOT_COMPLETED.format(7200) and old.seconds == 7201
    new = nm.run_for(nm.Plan(nm.COMPLETION_TIMEOUT), _vmi("8Gi"), {"migrationUid": "u3"}, (1, 8, 3))
    assert new.failure == nm.NOT_COMPLETED.format(1350)


def test_a_stall_is_aborted_at_the_first_check_past_the_progress_timeout():
    state = {"migrationUid": "u1", "migrationConfiguration": {"progressTimeout": 40}}
    run = nm.run_for(nm.Plan(nm.PROGRESS_STALL), _vmi("2Gi"), state, (1, 3, 0))
    assert (run.seconds, run.failure) == (41, "Live migration stuck for 41 seconds and has been aborted")


def test_a_completing_migration_runs_as_long_as_planned():
    run = nm.run_for(nm.Plan(nm.COMPLETE, took=1234), _vmi("2Gi"), {"migrationUid": "u1"}, (1, 1, 1))
    assert (run.seconds, run.failure) == (1234, None)


def test_virt_handler_reports_the_abort_with_a_failure_reason_from_1_3():
    run = nm.Run("u1", 151, nm.STUCK.format(151))
    new = nm.failed_state({"migrationUid": "u1", "targetNode": "b"}, run, START, (1, 3, 0))
    assert new == {"migrationUid": "u1", "targetNode": "b", "failed": True, "completed": True,
                   "abortStatus": "Succeeded", "endTimestamp": "2026-12-02T05:02:31Z",
                   "failureReason": nm.STUCK.format(151)}
    assert "failureReason" not in nm.failed_state({"migrationUid": "u1"}, run, START, (1, 1, 1))


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="outcome"):
        nm.Plan("explodes")

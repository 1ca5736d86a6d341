"""migration-report's re-scan reads the cheap Table rows first (issue 15) and visits through shared/rescan.py
(issue 14): a Running migration, one that ended before MIGRATION_REPORT_WITHIN and one already on record are
never read in full; one migration's failure stops no other and the tick still answers; a later migration of
the same VMI that ended resolves the earlier finding from its row alone."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.migration_report.handler import FUNCTION, REASON_RESOLVED, rescan
from functions.migration_report.settings import Settings
from shared import rescan as rescans
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.apiserver import SimCluster
from simcluster.builders.migration import NOT_COMPLETED, create_guest, create_migration, make_vmim, stamp

SA = "vmevents/migration-report"
VMIMS = "/namespaces/default/virtualmachineinstancemigrations"


@pytest.fixture
def cluster():
    c = SimCluster(kubevirt_version="1.3.1").start()
    yield c
    c.stop()


def context(cluster, *, minutes: int = 0) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    settings = Settings(rescan=rescans.Settings(budget=timedelta(seconds=20), workers=4))
    return KubeContext(FUNCTION, settings, lambda: datetime.now(UTC) + timedelta(minutes=minutes), kube,
                       Recorder(kube, FUNCTION))


def full_reads(cluster, name: str):
    """A fault that changes nothing and counts the GETs of that VMIM (a LIST's path has no name after it)."""
    return cluster.faults.add(kind="latency", delay=0.0, method="GET", path=f"{VMIMS}/{name}$", times=None)


def failed(cluster, name: str, took: int = 451) -> dict:
    _, vmi = create_guest(cluster, name, guest="2Gi")
    return create_migration(cluster, "1.3", vmi, took=took, reason=NOT_COMPLETED.format(450))


def findings(outcome, state: str = "detected") -> set[str]:
    data = outcome.reply.data if outcome.reply is not None else {}
    items = data.get("findings", [data] if data else [])
    return {f["details"]["migration"].rpartition("/")[2] for f in items if f["state"] == state}


def test_running_long_ended_and_reported_migrations_are_never_read_in_full(cluster):
    reported = failed(cluster, "rep")
    _, vmi = create_guest(cluster, "old", guest="2Gi")
    ended = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    old = make_vmim("old", phase="Succeeded", took=60, started=ended - timedelta(seconds=61))
    old["metadata"].pop("uid")
    # As virt-controller leaves it: its last write (the final phase) stamped its managedFields entry.
    old["metadata"]["managedFields"] = [{"manager": "virt-controller", "operation": "Update", "time": stamp(ended),
                                         "apiVersion": "kubevirt.io/v1", "fieldsType": "FieldsV1", "fieldsV1": {}}]
    old = cluster.create(old)
    running = make_vmim("old", phase="Running", took=0, name="old-running")
    running["metadata"].pop("uid")
    running["status"]["phase"] = "Running"
    cluster.create(running)
    first = rescan(context(cluster), "tick-1")
    assert findings(first) == {reported["metadata"]["name"]}
    counters = {name: full_reads(cluster, name) for name in
                (reported["metadata"]["name"], old["metadata"]["name"], "old-running")}
    again = rescan(context(cluster), "tick-2")
    assert again.reply is None and "scanned 3 migration(s)" in again.reason, again.reason
    assert {name: c.hits for name, c in counters.items()} == dict.fromkeys(counters, 0)


def test_one_migration_that_fails_stops_no_other_and_is_retried_next_tick(cluster):
    vmims = [failed(cluster, f"g{i}") for i in range(3)]
    names = [v["metadata"]["name"] for v in vmims]
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}/{names[1]}$", status=500, times=None)
    outcome = rescan(context(cluster), "tick-1")
    assert outcome.verdict == "rescan"   # answered (200), not a 503
    assert f"1 failed, retried next tick (default/{names[1]}:" in outcome.reason, outcome.reason
    assert findings(outcome) == {names[0], names[2]}
    assert fault.hits >= 1
    cluster.faults.clear()
    again = rescan(context(cluster), "tick-2")
    assert findings(again) == {names[1]} and "failed" not in again.reason


def test_a_later_ended_migration_resolves_the_earlier_finding_from_its_row(cluster):
    _, vmi = create_guest(cluster, "twice", guest="2Gi")
    first = create_migration(cluster, "1.3", vmi, took=451, reason=NOT_COMPLETED.format(450))
    assert findings(rescan(context(cluster), "tick-1")) == {first["metadata"]["name"]}
    later = create_migration(cluster, "1.3", vmi, took=30, phase="Succeeded")
    # Its full read fails: what resolves the first migration's finding is the later one's row alone.
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}/{later['metadata']['name']}$", status=500, times=None)
    outcome = rescan(context(cluster), "tick-2")
    assert findings(outcome, "resolved") == {first["metadata"]["name"]}, outcome.reason
    resolved = outcome.reply.data
    assert f"a later migration of the VMI, {later['metadata']['name']}, has succeeded" in str(resolved)
    assert fault.hits >= 1 and "1 failed" in outcome.reason
    assert any(e["reason"] == REASON_RESOLVED for e in cluster.list("v1", "Event", "default")
               if e["involvedObject"]["uid"] == vmi["metadata"]["uid"])

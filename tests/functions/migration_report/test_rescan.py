"""migration-report's re-scan (issue 15) reads only what changed since its cursor, or without one the cheap
Table rows, and visits through shared/rescan.py (issue 14): a Running migration, one that ended before
MIGRATION_REPORT_WITHIN and one already on record are never read in full; with a cursor, a quiet tick lists no
VMIM at all, a migration the events missed is found from its change, a failure keeps the cursor where it was and
an expired cursor falls back to the list; one migration's failure stops no other and the tick still answers; a
later migration of the same VMI that ended resolves the earlier finding from its row, or its change, alone."""
from __future__ import annotations

from dataclasses import replace
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
CURSOR = ("vmevents", "vmevents-migration-report-cursor")
MODES = [pytest.param(None, id="listing"), pytest.param(CURSOR, id="cursor")]


@pytest.fixture
def cluster():
    c = SimCluster(kubevirt_version="1.3.1").start()
    yield c
    c.stop()


def context(cluster, *, minutes: int = 0, cursor: tuple[str, str] | None = CURSOR) -> KubeContext:
    kube = Kube(cluster.api_client(service_account=SA))
    settings = Settings(rescan=rescans.Settings(budget=timedelta(seconds=20), workers=4), cursor=cursor)
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


def reads(cluster, resource: str = "virtualmachineinstancemigrations") -> dict[str, int]:
    """This function's requests on that resource so far, by verb."""
    verbs: dict[str, int] = {}
    for r in list(cluster.requests):
        if r.service_account == SA and r.resource == resource:
            verbs[r.verb] = verbs.get(r.verb, 0) + 1
    return verbs


def stored_cursor(cluster) -> dict | None:
    found = [c for c in cluster.list("v1", "ConfigMap", CURSOR[0]) if c["metadata"]["name"] == CURSOR[1]]
    return found[0] if found else None


@pytest.mark.parametrize("cursor", MODES)
def test_running_long_ended_and_reported_migrations_are_never_read_in_full(cluster, cursor):
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
    first = rescan(context(cluster, cursor=cursor), "tick-1")
    assert findings(first) == {reported["metadata"]["name"]} and "listed 3 migration(s)" in first.reason
    counters = {name: full_reads(cluster, name) for name in
                (reported["metadata"]["name"], old["metadata"]["name"], "old-running")}
    again = rescan(context(cluster, cursor=cursor), "tick-2")
    said = "listed 3 migration(s)" if cursor is None else "0 change(s) since the cursor"
    assert again.reply is None and said in again.reason, again.reason
    assert {name: c.hits for name, c in counters.items()} == dict.fromkeys(counters, 0)


@pytest.mark.parametrize("cursor", MODES)
def test_one_migration_that_fails_stops_no_other_and_is_retried_next_tick(cluster, cursor):
    if cursor is not None:  # the cursor is set first: the three are changes since it
        assert rescan(context(cluster, cursor=cursor), "tick-0").reply is None and stored_cursor(cluster)
    vmims = [failed(cluster, f"g{i}") for i in range(3)]
    names = [v["metadata"]["name"] for v in vmims]
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}/{names[1]}$", status=500, times=None)
    outcome = rescan(context(cluster, cursor=cursor), "tick-1")
    assert outcome.verdict == "rescan"   # answered (200), not a 503
    assert f"1 failed, retried next tick (default/{names[1]}:" in outcome.reason, outcome.reason
    assert findings(outcome) == {names[0], names[2]}
    assert fault.hits >= 1
    cluster.faults.clear()
    again = rescan(context(cluster, cursor=cursor), "tick-2")
    assert findings(again) == {names[1]} and "failed" not in again.reason


@pytest.mark.parametrize("cursor", MODES)
def test_a_later_ended_migration_resolves_the_earlier_finding_from_its_row_or_change(cluster, cursor):
    _, vmi = create_guest(cluster, "twice", guest="2Gi")
    first = create_migration(cluster, "1.3", vmi, took=451, reason=NOT_COMPLETED.format(450))
    assert findings(rescan(context(cluster, cursor=cursor), "tick-1")) == {first["metadata"]["name"]}
    later = create_migration(cluster, "1.3", vmi, took=30, phase="Succeeded")
    # Its full read fails: what resolves the first migration's finding is the later one's row alone.
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}/{later['metadata']['name']}$", status=500, times=None)
    outcome = rescan(context(cluster, cursor=cursor), "tick-2")
    assert findings(outcome, "resolved") == {first["metadata"]["name"]}, outcome.reason
    resolved = outcome.reply.data
    assert f"a later migration of the VMI, {later['metadata']['name']}, has succeeded" in str(resolved)
    assert fault.hits >= 1 and "1 failed" in outcome.reason
    assert any(e["reason"] == REASON_RESOLVED for e in cluster.list("v1", "Event", "default")
               if e["involvedObject"]["uid"] == vmi["metadata"]["uid"])


def test_with_a_cursor_a_quiet_tick_lists_no_migration_and_a_missed_one_is_found_from_its_change(cluster):
    assert rescan(context(cluster), "tick-1").reply is None  # nothing yet: lists, and starts the cursor
    saved = stored_cursor(cluster)
    assert saved is not None and saved["data"]["resourceVersion"]
    assert saved["metadata"]["labels"]["app.kubernetes.io/managed-by"] == FUNCTION
    missed = failed(cluster, "missed")   # its events never reached the function
    before = reads(cluster)
    found = rescan(context(cluster), "tick-2")
    assert findings(found) == {missed["metadata"]["name"]} and "change(s) since the cursor" in found.reason
    assert reads(cluster).get("list", 0) == before.get("list", 0), "no VMIM was listed"
    assert stored_cursor(cluster)["data"]["resourceVersion"] != saved["data"]["resourceVersion"]
    counter, before = full_reads(cluster, missed["metadata"]["name"]), reads(cluster)
    quiet = rescan(context(cluster), "tick-3")
    assert quiet.reply is None and "0 change(s) since the cursor" in quiet.reason, quiet.reason
    assert counter.hits == 0 and reads(cluster).get("list", 0) == before.get("list", 0)
    assert reads(cluster)["watch"] == before["watch"] + 1


def test_a_failure_keeps_the_cursor_so_the_next_tick_sees_the_same_changes(cluster):
    rescan(context(cluster), "tick-1")
    saved = stored_cursor(cluster)
    vmim = failed(cluster, "flaky")
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}/{vmim['metadata']['name']}$", status=500, times=None)
    outcome = rescan(context(cluster), "tick-2")
    assert fault.hits >= 1 and "the cursor stays" in outcome.reason, outcome.reason
    assert stored_cursor(cluster)["metadata"]["resourceVersion"] == saved["metadata"]["resourceVersion"]
    cluster.faults.clear()
    again = rescan(context(cluster), "tick-3")
    assert findings(again) == {vmim["metadata"]["name"]} and "change(s) since the cursor" in again.reason


def test_an_expired_cursor_falls_back_to_the_list_and_reports_nothing_twice(cluster):
    first = failed(cluster, "before")
    assert findings(rescan(context(cluster), "tick-1")) == {first["metadata"]["name"]}
    later = failed(cluster, "during")  # changed after the cursor, then the history is compacted away
    cluster.compact()
    outcome = rescan(context(cluster), "tick-2")
    assert "the watch from the cursor failed" in outcome.reason and "listed 2 migration(s)" in outcome.reason
    assert findings(outcome) == {later["metadata"]["name"]}
    assert "0 change(s) since the cursor" in rescan(context(cluster), "tick-3").reason


def test_with_a_cursor_a_finding_whose_event_was_lost_is_reported_again_once(cluster):
    """Its VMIM did not change again: the cursor remembers what was reported within the window, and the next
    tick that settles (within MIGRATION_SETTLE_EVERY) reports it again."""
    vmim = failed(cluster, "lost")
    assert findings(rescan(context(cluster), "tick-1")) == {vmim["metadata"]["name"]}
    assert rescan(context(cluster), "tick-2").reply is None
    assert vmim["metadata"]["uid"] in stored_cursor(cluster)["data"]["reported"]
    [event] = [e for e in cluster.list("v1", "Event", "default")
               if e["involvedObject"]["uid"] == vmim["metadata"]["uid"] and e["reason"] == "MigrationReport"]
    cluster.delete("v1", "Event", "default", event["metadata"]["name"])
    assert rescan(context(cluster), "tick-3").reply is None  # settled a moment ago: not yet
    again = rescan(context(cluster, minutes=6), "tick-4")
    assert findings(again) == {vmim["metadata"]["name"]} and "0 change(s) since the cursor" in again.reason
    assert rescan(context(cluster, minutes=12), "tick-5").reply is None


def finding_lists(cluster) -> int:
    return reads(cluster, "events").get("list", 0)


def test_with_a_cursor_a_quiet_tick_reads_no_finding_and_one_settles_them_every_settle_period(cluster):
    vmim = failed(cluster, "settle")
    assert findings(rescan(context(cluster), "tick-1")) == {vmim["metadata"]["name"]}
    lists = finding_lists(cluster)
    quiet = rescan(context(cluster), "tick-2")
    assert "none to look at" in quiet.reason and finding_lists(cluster) == lists, quiet.reason
    later = rescan(context(cluster, minutes=5), "tick-3")    # MIGRATION_SETTLE_EVERY (5m) later
    assert "none to look at" not in later.reason and finding_lists(cluster) == lists + 1, later.reason
    settled_at = stored_cursor(cluster)["data"]["settledAt"]
    ctx = context(cluster)
    every = KubeContext(ctx.function, replace(ctx.settings, settle_every=timedelta(0)), ctx.clock, ctx.kube,
                        ctx.recorder)
    assert "none to look at" not in rescan(every, "tick-4").reason     # 0s: every tick settles
    assert stored_cursor(cluster)["data"]["settledAt"] != settled_at


@pytest.mark.parametrize("cursor", MODES)
def test_a_redelivered_tick_answers_with_the_report_it_made(cluster, cursor):
    vmim = failed(cluster, "again")
    first = rescan(context(cluster, cursor=cursor), "tick-1")
    assert findings(first) == {vmim["metadata"]["name"]}
    assert rescan(context(cluster, cursor=cursor), "tick-2").reply is None
    again = rescan(context(cluster, cursor=cursor), "tick-1")  # the broker never got the first answer
    assert findings(again) == {vmim["metadata"]["name"]}
    assert again.reply.data["findings"][0]["details"] == first.reply.data["findings"][0]["details"]

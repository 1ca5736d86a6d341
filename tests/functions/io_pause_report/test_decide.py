"""io-pause-report's decision table, pure: fixed clock, small builders, one row per rule."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from functions.io_pause_report.decide import Action, Facts, KubeVirtErrors, VolumeFacts, decide
from functions.io_pause_report.handler import kubevirt_errors, read_episode, target, worth_decoding
from functions.io_pause_report.settings import Settings, load
from functions.io_pause_report.volumes import longhorn_facts
from functions.io_pause_report.wording import advice
from shared.intake import Incoming
from simcluster.builders.io_pause import (
    NOW,
    episode_event,
    kubevirt_event,
    make_engine,
    make_vmi,
    make_volume,
)

SETTINGS = Settings()
PV = "pvc-3f1c2d9e"


def lh(robustness="degraded", rebuilding=42, **kw) -> VolumeFacts:
    """disk-0 → PVC vm1-disk-0 → PV → Longhorn volume, as fetch builds it."""
    base = VolumeFacts("disk-0", pvc="vm1-disk-0", pv=PV, longhorn_volume=PV)
    return longhorn_facts(base, make_volume(PV, robustness=robustness, **kw), [make_engine(PV, rebuilding=rebuilding)])


def not_longhorn(why="not a Longhorn volume (CSI driver nfs.csi.k8s.io)") -> VolumeFacts:
    return VolumeFacts("disk-0", pvc="vm1-disk-0", pv="pv-nfs", unknown=why)


def facts(*volumes, total=1, no_space=None, last=NOW, baseline=0) -> Facts:
    return Facts(tuple(volumes), KubeVirtErrors(total, ("disk-0",), no_space, last), baseline)


def episode(vmi, **kw):
    return read_episode([episode_event(vmi, **kw)], {"kind": "VirtualMachine"})


VMI = make_vmi()
FULL = "VM Paused due to not enough space on volume: disk-0"

NEW_EPISODES = [
    pytest.param(VMI, facts(lh()), Action.REPORT, "rebuild-related", id="degraded-and-rebuilding-is-rebuild-related"),
    pytest.param(VMI, facts(lh("healthy", None, last_degraded_at=NOW - timedelta(minutes=3))), Action.REPORT,
                 "rebuild-related", id="healthy-now-but-degraded-minutes-ago-is-rebuild-related"),
    pytest.param(VMI, facts(lh("healthy", None), no_space=FULL), Action.REPORT, "out-of-space",
                 id="kubevirt-says-not-enough-space"),
    pytest.param(VMI, facts(lh("healthy", None, conditions=[{
        "type": "Scheduled", "status": "False", "reason": "ReplicaSchedulingFailure",
        "message": "precheck new replica failed: insufficient storage"}])), Action.REPORT, "out-of-space",
        id="longhorn-says-insufficient-storage"),
    pytest.param(VMI, facts(not_longhorn()), Action.REPORT, "unknown-storage", id="not-longhorn-is-unknown-storage"),
    pytest.param(VMI, facts(not_longhorn("could not be read (GET ...: HTTP 503)")), Action.REPORT, "unknown-storage",
                 id="longhorn-unreadable-is-still-reported"),
    pytest.param(VMI, facts(), Action.REPORT, "unknown-storage", id="no-volume-found-is-unknown-storage"),
    pytest.param(VMI, facts(lh("healthy", None)), Action.REPORT, "storage-error",
                 id="healthy-longhorn-never-degraded-is-storage-error"),
    pytest.param(VMI, facts(lh("faulted", None)), Action.REPORT, "storage-error", id="faulted-is-storage-error"),
    pytest.param(make_vmi(since=NOW - timedelta(minutes=11)), facts(lh()), Action.REPORT, "stuck-paused",
                 id="paused-11m-is-stuck-paused"),
    pytest.param(make_vmi(paused="PausedByUser"), facts(lh()), Action.SKIP, None, id="paused-by-user-is-nothing"),
    pytest.param(make_vmi(paused="PausedByMigrationMonitor"), facts(lh()), Action.SKIP, None,
                 id="paused-by-migration-monitor-is-nothing"),
    pytest.param(make_vmi(paused=None), facts(lh()), Action.SKIP, None, id="running-without-episode-is-nothing"),
]


@pytest.mark.parametrize("vmi,known,action,category", NEW_EPISODES)
def test_a_pause_with_no_open_episode(vmi, known, action, category):
    verdict = decide(replace(known, vmi=vmi), SETTINGS, NOW + timedelta(seconds=5))
    assert verdict.action is action
    assert (verdict.category.value if verdict.category else None) == category
    if action is Action.REPORT:
        since = next(c["lastTransitionTime"] for c in vmi["status"]["conditions"] if c["type"] == "Paused")
        assert verdict.pauses == 1 and verdict.episode_start == since and advice(verdict, known, SETTINGS)


OPEN = [
    pytest.param(VMI, facts(lh(), total=2), dict(count=1), Action.COUNT, 2, id="second-pause-raises-the-count"),
    pytest.param(VMI, facts(lh(), total=2), dict(count=2), Action.HOLD, 2, id="same-pause-again-is-held"),
    pytest.param(make_vmi(since=NOW + timedelta(seconds=30)), facts(lh(), total=1), dict(count=1, last=NOW),
                 Action.COUNT, 2, id="a-new-pause-counts-even-before-kubevirts-event"),
    pytest.param(make_vmi(since=NOW - timedelta(minutes=11)), facts(lh()), dict(start=NOW - timedelta(minutes=11)),
                 Action.ESCALATE, 1, id="paused-too-long-escalates-to-stuck"),
    pytest.param(make_vmi(since=NOW - timedelta(minutes=11)), facts(lh()),
                 dict(start=NOW - timedelta(minutes=11), category="stuck-paused"), Action.HOLD, 1,
                 id="already-escalated-is-held"),
    pytest.param(make_vmi(paused=None), facts(lh(), total=3, last=NOW - timedelta(minutes=2)),
                 dict(count=3, last=NOW - timedelta(minutes=2)), Action.WAIT, 3, id="running-again-waits-for-quiet"),
    pytest.param(make_vmi(paused=None), facts(lh(), total=4, last=NOW - timedelta(minutes=2)),
                 dict(count=3, last=NOW - timedelta(minutes=3)), Action.COUNT, 4,
                 id="a-pause-missed-while-running-is-counted"),
    pytest.param(make_vmi(paused=None), facts(lh(), total=3, last=NOW - timedelta(minutes=11)),
                 dict(count=3, last=NOW - timedelta(minutes=11)), Action.RESOLVE, 3, id="quiet-10m-resolves"),
    pytest.param(make_vmi(paused=None), facts(lh("healthy", None), total=3, last=NOW - timedelta(minutes=1)),
                 dict(count=3, last=NOW - timedelta(minutes=1)), Action.RESOLVE, 3, id="rebuild-completed-resolves"),
    pytest.param(None, facts(), dict(count=2), Action.RESOLVE, 2, id="vmi-gone-resolves"),
    pytest.param(make_vmi(uid="vmi-uid-2"), facts(lh()), dict(count=2), Action.RESOLVE, 2,
                 id="restarted-vm-resolves-the-old-episode"),
]


@pytest.mark.parametrize("vmi,known,ep,action,pauses", OPEN)
def test_an_open_episode(vmi, known, ep, action, pauses):
    verdict = decide(replace(known, vmi=vmi, episode=episode(VMI, **ep)), SETTINGS, NOW)
    assert verdict.action is action, verdict.reason
    assert verdict.pauses == pauses


def test_a_new_episode_of_the_same_vmi_counts_from_where_the_last_ended():
    verdict = decide(replace(facts(lh(), total=5, baseline=3), vmi=VMI), SETTINGS, NOW)
    assert verdict.action is Action.REPORT and verdict.pauses == 2 and verdict.baseline == 3


def advised(vmi, known) -> tuple[str, ...]:
    """The advice wording.py gives for what decide() says of a pause with no open episode."""
    return advice(decide(replace(known, vmi=vmi), SETTINGS, NOW), known, SETTINGS)


def test_rebuild_advice_names_the_volume_progress_and_the_kb_mitigations():
    words = " ".join(advised(VMI, facts(lh())))
    for part in (PV, "42%", "fstrim.timer", "discard", "DisableDeleteNotify", "Upgrade Longhorn",
                 "the pauses end when the rebuild completes"):
        assert part in words


def test_out_of_space_advice_names_the_volume_and_its_size():
    words = " ".join(advised(VMI, facts(lh("healthy", None), no_space=FULL)))
    assert "disk-0" in words and PV in words and "10.0 GiB" in words and FULL in words


def test_stuck_advice_is_a_stop_and_start():
    known = facts(lh())
    verdict = decide(replace(known, vmi=make_vmi(since=NOW - timedelta(minutes=30))), SETTINGS, NOW)
    assert verdict.cause.value == "rebuild-related"
    words = advice(verdict, known, SETTINGS)
    assert "Stop and start the VM" in words[0] and "harvester#11585" in words[0]


def test_an_episode_with_a_resolved_event_is_closed_and_the_latest_open_one_wins():
    # One finding Event per episode identity: resolving it turns the same Event resolved (shared/ledger.py).
    done = episode_event(VMI, start=NOW - timedelta(hours=1), reason="IOErrorPauseResolved", final_count=4)
    assert read_episode([done], {"kind": "VirtualMachine"}) is None
    new = episode_event(VMI, start=NOW, count=3, message="new")
    found = read_episode([done, new], {"kind": "VirtualMachine"})
    assert found.start == "2026-11-30T12:00:00Z" and found.count == 3 and found.message == "new"


def test_kubevirt_errors_of_this_vmi_only():
    mine = kubevirt_event(VMI, count=3)
    earlier = kubevirt_event(make_vmi(uid="old-vmi"), count=9)
    errors = kubevirt_errors([mine, earlier, kubevirt_event(VMI, no_space=True, volume="disk-1")], VMI)
    # the pauses are the most one volume counted (3 on disk-0), not the sum over volumes (issue 26)
    assert errors.total == 3 and errors.volumes == ("disk-0", "disk-1") and "not enough space" in errors.no_space


def test_two_failing_volumes_are_one_pause_each_time_not_two():
    """One pause sends one IOerror Event per failing volume (docs/facts.md §5): two disks failing in the same
    three pauses are three pauses, and a new episode of one pause reports one."""
    both = [kubevirt_event(VMI, count=3, volume="disk-0"), kubevirt_event(VMI, count=3, volume="disk-1")]
    assert kubevirt_errors(both, VMI).total == 3
    first = [kubevirt_event(VMI, count=1, volume="disk-0"), kubevirt_event(VMI, count=1, volume="disk-1")]
    verdict = decide(Facts(kubevirt=kubevirt_errors(first, VMI), vmi=VMI), SETTINGS, NOW)
    assert verdict.action is Action.REPORT and verdict.pauses == 1


def incoming(obj, type_="dev.knative.apiserver.resource.update"):
    return Incoming(id="1", type=type_, source="s", data=obj, extensions={"kind": obj["kind"]})


@pytest.mark.parametrize("reason,wanted", [("PausedIOError", True), ("PausedByUser", False),
                                           ("PausedByMigrationMonitor", False), (None, False)],
                         ids=["io-error", "by-user", "by-migration-monitor", "running"])
def test_only_io_error_pauses_are_targets(reason, wanted):
    assert (target(incoming(make_vmi(paused=reason))) is not None) is wanted


def test_the_prefilter_decodes_only_vmi_events_that_mention_paused_io_error():
    headers = {"ce-type": "dev.knative.apiserver.resource.update", "ce-kind": "VirtualMachineInstance"}
    assert worth_decoding(headers, b'{"reason":"PausedIOError"}', SETTINGS)
    assert not worth_decoding(headers, b'{"reason":"PausedByUser"}', SETTINGS)
    assert worth_decoding({"ce-type": "dev.knative.sources.ping"}, b"{}", SETTINGS)


def test_settings_from_the_environment():
    s = load({"IO_PAUSE_STUCK_AFTER": "5m", "IO_PAUSE_RESOLVED_AFTER": "90s", "LONGHORN_NAMESPACE": "storage"})
    assert (s.stuck_after, s.resolved_after, s.longhorn_namespace) == (
        timedelta(minutes=5), timedelta(seconds=90), "storage")
    with pytest.raises(ValueError, match="LONGHORN_NAMESPACE='Longhorn System' is not a namespace name"):
        load({"LONGHORN_NAMESPACE": "Longhorn System"})

"""vmi-cleanup's decision table, row by row: pure, on a fixed clock (no cluster, no HTTP)."""
from datetime import timedelta

import pytest

from functions.vmi_cleanup.decide import Action, Facts, decide
from functions.vmi_cleanup.handler import halt_patch
from functions.vmi_cleanup.settings import Settings
from simcluster.builders.kubevirt import FINISHED, make_vm, make_vmi

DEFAULTS = Settings()
DUE = FINISHED + DEFAULTS.cleanup_after         # the default CLEANUP_AFTER has passed
OLD, NEW = (1, 1, 1), (1, 3, 1)


def case(vm_kwargs=None, vmi_kwargs=None, *, standalone=False, settings=DEFAULTS, now=DUE,
         version=OLD, migrating=False):
    vm = None if standalone else make_vm(**(vm_kwargs or {}))
    vmi = make_vmi(owner=vm, **(vmi_kwargs or {}))
    return decide(Facts(vmi, vm, kubevirt_version=version, migrating=migrating), settings, now)


ROWS = [
    # id, vm kwargs, vmi kwargs, extra, expected action
    ("standalone-vmi", None, None, {"standalone": True}, Action.DELETE_VMI),
    ("manual", {"run_strategy": "Manual"}, None, {}, Action.DELETE_VMI),
    ("halted", {"run_strategy": "Halted"}, None, {}, Action.DELETE_VMI),
    ("running-false", {"run_strategy": None, "running": False}, None, {}, Action.DELETE_VMI),
    ("neither-field-means-halted", {"run_strategy": None}, None, {}, Action.DELETE_VMI),
    ("once-halts", {"run_strategy": "Once"}, None, {}, Action.HALT_VM),
    ("rerun-on-old-kubevirt-halts", {"run_strategy": "RerunOnFailure"}, None, {"version": OLD}, Action.HALT_VM),
    ("rerun-on-unknown-kubevirt-halts", {"run_strategy": "RerunOnFailure"}, None, {"version": None}, Action.HALT_VM),
    ("rerun-on-new-kubevirt-leaves-it", {"run_strategy": "RerunOnFailure"}, None, {"version": NEW}, Action.LEAVE),
    ("rerun-on-new-kubevirt-still-there-one-delay-later-halts", {"run_strategy": "RerunOnFailure"}, None,
     {"version": NEW, "now": DUE + DEFAULTS.cleanup_after}, Action.HALT_VM),
    ("always-leaves-it", {"run_strategy": "Always"}, None, {}, Action.LEAVE),
    ("running-true-leaves-it", {"run_strategy": None, "running": True}, None, {}, Action.LEAVE),
    ("unknown-run-strategy-skips", {"run_strategy": "Sometimes"}, None, {}, Action.SKIP),
    ("not-due-yet-waits", None, None, {"now": DUE - timedelta(seconds=1)}, Action.WAIT),
    ("running-vmi-skips", None, {"phase": "Running"}, {}, Action.SKIP),
    ("failed-vmi-skips-by-default", None, {"phase": "Failed"}, {}, Action.SKIP),
    ("failed-vmi-with-cleanup-failed", None, {"phase": "Failed"}, {"settings": Settings(cleanup_failed=True)},
     Action.DELETE_VMI),
    ("failed-vmi-rerun-on-failure-is-rerun-by-kubevirt", {"run_strategy": "RerunOnFailure"}, {"phase": "Failed"},
     {"settings": Settings(cleanup_failed=True)}, Action.LEAVE),
    ("failed-vmi-once-halts", {"run_strategy": "Once"}, {"phase": "Failed"},
     {"settings": Settings(cleanup_failed=True)}, Action.HALT_VM),
    ("being-deleted-skips", None, {"deleting": True}, {}, Action.SKIP),
    ("no-transition-timestamp-skips", None, {"finished": None}, {}, Action.SKIP),
    ("vm-opts-out", {"annotations": {"vmevents.io/skip-cleanup": "true"}}, None, {}, Action.SKIP),
    ("vmi-opts-out", None, {"annotations": {"vmevents.io/skip-cleanup": "true"}}, {}, Action.SKIP),
    ("opt-out-false-cleans", {"annotations": {"vmevents.io/skip-cleanup": "false"}}, None, {}, Action.DELETE_VMI),
    ("opt-out-typo-skips", {"annotations": {"vmevents.io/skip-cleanup": "ture"}}, None, {}, Action.SKIP),
    ("per-vm-delay-not-due", {"annotations": {"vmevents.io/cleanup-after": "1h"}}, None, {}, Action.WAIT),
    ("per-vm-delay-due", {"annotations": {"vmevents.io/cleanup-after": "0s"}}, None,
     {"now": FINISHED}, Action.DELETE_VMI),
    ("per-vm-delay-unreadable-skips", {"annotations": {"vmevents.io/cleanup-after": "5 minutes"}}, None, {},
     Action.SKIP),
    ("pending-state-change-requests-skip", {"state_change_requests": [{"action": "Start"}]}, None, {}, Action.SKIP),
    ("migration-in-flight-on-vmi-skips", None,
     {"migration_state": {"startTimestamp": "2026-11-30T11:59:00Z"}}, {}, Action.SKIP),
    ("finished-migration-does-not-block", None,
     {"migration_state": {"startTimestamp": "2026-11-30T11:00:00Z", "completed": True}}, {}, Action.DELETE_VMI),
    ("vmim-in-flight-skips", None, None, {"migrating": True}, Action.SKIP),
    ("standalone-vmi-migrating-skips", None, None, {"standalone": True, "migrating": True}, Action.SKIP),
    ("namespace-not-listed-skips", None, None, {"settings": Settings(namespaces=frozenset({"prod"}))}, Action.SKIP),
    ("namespace-excluded-skips", None, None, {"settings": Settings(exclude_namespaces=frozenset({"default"}))},
     Action.SKIP),
]


@pytest.mark.parametrize("vm_kwargs,vmi_kwargs,extra,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decision_table(vm_kwargs, vmi_kwargs, extra, expected):
    verdict = case(vm_kwargs, vmi_kwargs, **extra)
    assert verdict.action is expected, verdict.reason


def test_typo_in_opt_out_warns_and_says_why():
    verdict = case({"annotations": {"vmevents.io/skip-cleanup": "yes"}})
    assert verdict.warning and "'yes'" in verdict.warning and "not understood" in verdict.warning


def test_vm_gone_deletes_the_orphan_vmi():
    vm = make_vm()
    assert decide(Facts(make_vmi(owner=vm), None), Settings(), DUE).action is Action.DELETE_VMI


def test_vmi_of_an_earlier_vm_with_the_same_name_is_left_alone():
    earlier, now_vm = make_vm(), make_vm()
    verdict = decide(Facts(make_vmi(owner=earlier), now_vm), Settings(), DUE)
    assert verdict.action is Action.SKIP and "earlier VirtualMachine" in verdict.reason


def test_halt_patch_tests_the_strategy_and_version_and_keeps_the_previous_one():
    vm = make_vm(run_strategy="Once", resource_version="42")
    ops = halt_patch(vm, "Once")
    assert ops[:3] == [{"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                       {"op": "test", "path": "/spec/runStrategy", "value": "Once"},
                       {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"}]
    assert ops[-1] == {"op": "add", "path": "/metadata/annotations/vmevents.io~1previous-run-strategy",
                       "value": "Once"}
    assert {"op": "add", "path": "/metadata/annotations", "value": {}} in ops  # the VM had no annotations

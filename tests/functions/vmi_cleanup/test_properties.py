"""vmi-cleanup's safety rules hold for every combination of facts, not only the rows of the decision table:
a VMI is never deleted where deleting it would boot the guest again (docs/facts.md §2), and nothing is
acted on before it is due, outside its phase or scope, or against an opt-out."""
from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from functions.vmi_cleanup.decide import ACTING, RERUN_SELF_CLEANING, Action, Facts, decide
from functions.vmi_cleanup.settings import Settings
from simcluster.builders.kubevirt import FINISHED, make_vm, make_vmi

# No example database: a test run leaves nothing behind in the work tree.
PROPERTY = settings(database=None, max_examples=200)

STRATEGIES = st.sampled_from(["Always", "RerunOnFailure", "Manual", "Once", "Halted", "Sometimes", None])
VERSIONS = st.none() | st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(0, 9))
PHASES = st.sampled_from(["Pending", "Scheduling", "Scheduled", "Running", "Succeeded", "Failed", "Unknown"])
SKIP = st.sampled_from([None, "true", "false", "yes", ""])
DELAYS = st.none() | st.sampled_from(["0s", "90s", "10m", "2h", "soon"])


@st.composite
def situations(draw):
    strategy, running = draw(STRATEGIES), draw(st.none() | st.booleans())
    vm_notes = {k: v for k, v in (("vmevents.io/skip-cleanup", draw(SKIP)),
                                  ("vmevents.io/cleanup-after", draw(DELAYS))) if v is not None}
    vm = make_vm(run_strategy=strategy, running=running, annotations=vm_notes or None)
    vmi = make_vmi(owner=vm, phase=draw(PHASES))
    vm_gone = draw(st.integers(0, 9)) == 0
    facts = Facts(vmi, None if vm_gone else vm, kubevirt_version=draw(VERSIONS), migrating=draw(st.booleans()))
    settings = Settings(cleanup_after=timedelta(minutes=draw(st.integers(0, 120))),
                        cleanup_failed=draw(st.booleans()),
                        exclude_namespaces=frozenset({"default"}) if draw(st.booleans()) else frozenset())
    now = FINISHED + timedelta(minutes=draw(st.integers(-10, 600)))
    return facts, settings, now


@PROPERTY
@given(situations())
def test_deleting_never_boots_the_guest_again(situation):
    facts, config, now = situation
    verdict = decide(facts, config, now)
    if verdict.action is Action.DELETE_VMI:  # only a VM that will not start again, or none at all
        assert facts.vm is None or verdict.run_strategy in ("Manual", "Halted"), verdict
    if verdict.run_strategy == "Once" or (verdict.run_strategy == "RerunOnFailure" and (
            facts.kubevirt_version is None or facts.kubevirt_version < RERUN_SELF_CLEANING)):
        assert verdict.action is not Action.DELETE_VMI, verdict


@PROPERTY
@given(situations())
def test_nothing_is_acted_on_out_of_phase_scope_or_time_or_against_an_opt_out(situation):
    facts, config, now = situation
    verdict = decide(facts, config, now)
    if verdict.action not in ACTING:
        return
    notes = (facts.vm["metadata"].get("annotations") or {}) if facts.vm else {}
    assert facts.vmi["status"]["phase"] in config.phases
    assert "default" not in config.exclude_namespaces
    assert notes.get("vmevents.io/skip-cleanup") in (None, "false")
    assert not facts.migrating
    delay = notes.get("vmevents.io/cleanup-after")
    due = FINISHED + (config.cleanup_after if delay is None else
                      timedelta(seconds={"0s": 0, "90s": 90, "10m": 600, "2h": 7200}[delay]))
    assert now >= due, verdict
    assert verdict.warning is None

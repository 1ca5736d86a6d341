"""migration-report's arithmetic and decision table, row by row: pure, on a fixed clock (no cluster, no HTTP).

Objects are shaped like KubeVirt 1.1, 1.3 and 1.8 (simcluster/builders/migration.py, after the CONSTRUCTED
examples in upstream/examples/).
"""
from datetime import timedelta

import pytest
import yaml

from functions.migration_report.decide import Action, Facts, Verdict, decide, row_precheck
from functions.migration_report.settings import Settings
from functions.migration_report.wording import reply_data
from shared.migrations import (
    data_size,
    defaults,
    effective_configuration,
    match_policy,
    quantity,
    read_failure_reason,
    scaled_giga,
)
from simcluster.builders.migration import (
    ABORTED_19,
    NOT_COMPLETED,
    NOW,
    STARTED,
    STUCK,
    make_event,
    make_kubevirt,
    make_namespace,
    make_policy,
    make_state,
    make_vmi,
    make_vmim,
    migrated_event,
)

VERSIONS = {"1.1": "1.1.1", "1.3": "1.3.1", "1.8": "1.8.3"}


# -- the data size and the budget (pkg/virt-launcher/virtwrap/manager.go getVMIMigrationDataSize) ---
@pytest.mark.parametrize("guest,requests,gigabytes", [
    ("8Gi", None, 9),              # 8589934592 B → 9 decimal GB, not 8
    ("2Gi", None, 3),              # 2147483648 B → 3
    ("1948Mi", None, 3),           # Harvester's default 2 GiB VM: 2042626048 B → 3
    ("8G", None, 8),
    ("8000000001", None, 9),
    ("1Gi", None, 2),
    (None, "5461Mi", 6),           # only resources.requests.memory: 5726273536 B → 6
    ("2Gi", "8Gi", 3),             # memory.guest overrides requests
], ids=["8Gi", "2Gi", "1948Mi", "8G", "8e9+1", "1Gi", "requests-only", "guest-over-requests"])
def test_data_size_rounds_up_to_decimal_gigabytes(guest, requests, gigabytes):
    assert data_size(make_vmi(guest=guest, requests=requests)).gigabytes == gigabytes


@pytest.mark.parametrize("guest,per_gib,budget", [("8Gi", 800, 7200), ("2Gi", 800, 2400), ("1948Mi", 800, 2400),
                                                  ("2Gi", 150, 450), ("8Gi", 150, 1350)],
                         ids=["8Gi-at-800-is-7200-not-6400", "2Gi-at-800", "1948Mi-at-800", "2Gi-at-150", "8Gi-at-150"])
def test_completion_budget(guest, per_gib, budget):
    assert per_gib * data_size(make_vmi(guest=guest)).gigabytes == budget


def test_block_migration_is_flagged_because_ephemeral_disks_are_invisible():
    size = data_size(make_vmi(method="BlockMigration"))
    assert size.block_migration and size.gigabytes == 3


@pytest.mark.parametrize("text,value", [("64Mi", 64 * 2 ** 20), ("1.5Gi", 3 * 2 ** 29), ("500m", 0.5), ("1e3", 1000),
                                        ("0", 0), ("lots", None)])
def test_quantity(text, value):
    assert quantity(text) == value


def test_scaled_giga_rounds_up_exactly_at_the_boundary():
    assert scaled_giga(quantity("1G")) == 1 and scaled_giga(quantity("1000000001")) == 2


# -- per-version defaults (pkg/virt-config/virt-config.go) ----------------------------------------
@pytest.mark.parametrize("version,per_gib", [((1, 1, 1), 800), ((1, 3, 1), 800), ((1, 4, 0), 150), ((1, 8, 3), 150),
                                             (None, 150)],
                         ids=["1.1.1", "1.3.1", "1.4.0", "1.8.3", "unknown"])
def test_completion_timeout_default_by_version(version, per_gib):
    assert defaults(version)["completionTimeoutPerGiB"] == per_gib
    assert defaults(version)["progressTimeout"] == 150


# -- MigrationPolicy matching (pkg/virt-controller/watch/migration/migrationpolicy.go matchPolicy) --
WORKLOAD = {"workload": "db"}
NS = {"hpc": "true"}
POLICY_ROWS = [
    ("no-policies", [], WORKLOAD, NS, None, ()),
    ("vmi-selector-matches", [make_policy("p", vmi=WORKLOAD)], WORKLOAD, NS, "p", ("p",)),
    ("vmi-selector-mismatch", [make_policy("p", vmi={"workload": "web"})], WORKLOAD, NS, None, ()),
    ("all-labels-must-match", [make_policy("p", vmi={**WORKLOAD, "tier": "1"})], WORKLOAD, NS, None, ()),
    ("namespace-selector-matches", [make_policy("p", namespace=NS)], WORKLOAD, NS, "p", ("p",)),
    ("namespace-selector-mismatch", [make_policy("p", namespace={"hpc": "false"})], WORKLOAD, NS, None, ()),
    ("more-labels-win", [make_policy("a", vmi=WORKLOAD), make_policy("z", vmi=WORKLOAD, namespace=NS)],
     WORKLOAD, NS, "z", ("z",)),
    ("total-tie-more-vmi-labels-win", [make_policy("a", namespace=NS), make_policy("z", vmi=WORKLOAD)],
     WORKLOAD, NS, "z", ("z",)),
    ("full-tie-first-name-wins", [make_policy("zeta", vmi=WORKLOAD), make_policy("alpha", vmi=WORKLOAD),
                                  make_policy("mid", vmi=WORKLOAD)], WORKLOAD, NS, "alpha", ("alpha", "mid", "zeta")),
    ("no-selectors-never-match", [make_policy("p", selectors=False)], WORKLOAD, NS, None, ()),
    ("empty-selectors-match-everything", [make_policy("p")], WORKLOAD, NS, "p", ("p",)),
    # The quirk: selectors are only checked when the VMI has labels (the namespace one tests vmiLabels too).
    ("quirk-unlabelled-vmi-ignores-namespace-selector", [make_policy("p", namespace={"hpc": "false"})],
     None, NS, "p", ("p",)),
    ("quirk-unlabelled-vmi-ignores-vmi-selector", [make_policy("p", vmi={"workload": "web"})], None, NS, "p", ("p",)),
    ("quirk-unlabelled-vmi-ties-every-policy", [make_policy("b", vmi=WORKLOAD), make_policy("a", namespace=NS)],
     None, NS, "a", ("a", "b")),
]


@pytest.mark.parametrize("policies,vmi_labels,ns_labels,chosen,ties", [r[1:] for r in POLICY_ROWS],
                         ids=[r[0] for r in POLICY_ROWS])
def test_policy_matching(policies, vmi_labels, ns_labels, chosen, ties):
    match = match_policy(policies, vmi_labels, ns_labels)
    assert (match.policy["metadata"]["name"] if match.policy else None) == chosen
    assert match.ties == ties


# -- the effective configuration, field by field --------------------------------------------------
def test_policy_then_kubevirt_cr_then_version_default():
    config = effective_configuration(make_policy("p", vmi=WORKLOAD, allowAutoConverge=True),
                                     {"completionTimeoutPerGiB": 300}, (1, 3, 1), None)
    assert config["allowAutoConverge"] == {"value": True, "source": "MigrationPolicy p"}
    assert config["completionTimeoutPerGiB"] == {"value": 300,
                                                 "source": "the KubeVirt CR (spec.configuration.migrations)"}
    assert config["progressTimeout"] == {"value": 150, "source": "KubeVirt v1.3.1's default"}


def test_policy_allow_post_copy_carries_allow_workload_disruption():
    config = effective_configuration(make_policy("p", allowPostCopy=True), {}, (1, 8, 3), None)
    assert config["allowWorkloadDisruption"]["value"] is True


def test_what_kubevirt_recorded_wins():
    config = effective_configuration(None, {}, (1, 8, 3), {"completionTimeoutPerGiB": 99})
    assert config["completionTimeoutPerGiB"]["value"] == 99
    assert "migrationState.migrationConfiguration" in config["completionTimeoutPerGiB"]["source"]


# -- failureReason wording (pkg/virt-launcher/virtwrap/live-migration-source.go) ------------------
@pytest.mark.parametrize("text,category,seconds", [
    (NOT_COMPLETED.format(7200), "completion-timeout", 7200),
    (STUCK.format(151), "progress-stall", 151),
    (ABORTED_19, "aborted-or-timeout", None),
    ("Live migration aborted ", "aborted", None),
    ("Migration aborted: no progress in 5 iterations", "progress-stall", None),
    ("virError(Code=1, Domain=7, Message='internal error: client socket is closed')", "libvirt-error", None),
], ids=["not-completed-1.3-1.8", "stuck-1.3-1.8", "has-been-aborted-1.9", "aborted-1.8", "stall-detector",
        "libvirt"])
def test_failure_reason_wording(text, category, seconds):
    read = read_failure_reason(text)
    assert (read.category, read.seconds) == (category, seconds)


# -- the decision table ---------------------------------------------------------------------------
UID = "22222222-2222-2222-2222-222222222222"


def facts(version="1.8", *, phase="Failed", took=451, reason=None, guest="2Gi", labels=None, migrations=None,
          policies=(), namespace=None, events=(), vmi=True, state=True, state_kwargs=None, vmim_kwargs=None,
          kubevirt_events=None):
    """One migration of VMI default/vm1, as KubeVirt `version` leaves it."""
    st = make_state(UID, took=took, failed=phase == "Failed", reason=reason, version=version,
                    **(state_kwargs or {})) if state else None
    the_vmi = make_vmi(guest=guest, labels=labels, state=st) if vmi else None
    vmim = make_vmim(phase=phase, took=took, state=st, uid=UID, version=version, **(vmim_kwargs or {}))
    evs = list(events)
    if version == "1.1" and reason and the_vmi is not None:
        evs.append(migrated_event(the_vmi, UID, reason))
    if kubevirt_events:
        evs += kubevirt_events(vmim, the_vmi)
    return Facts(vmim, the_vmi, None, make_kubevirt(VERSIONS[version], migrations), tuple(policies), namespace,
                 tuple(evs))


DEFAULTS = Settings()


def reported(known: Facts, settings: Settings = DEFAULTS, now=NOW) -> tuple[Verdict, dict]:
    """decide(), then the reply's data wording.py makes of a REPORT verdict (its advice and its sentence)."""
    verdict = decide(known, settings, now)
    return verdict, reply_data(verdict, known, settings) if verdict.action is Action.REPORT else {}


def unschedulable(vmim, vmi):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "virt-launcher-vm1-q8z2k", "namespace": "default",
                                                           "uid": "pod-uid"}}
    return [make_event(vmim, "migrationTargetPodUnschedulable",
                       "Migration target pod for VMI [default/vm1] is currently unschedulable."),
            make_event(pod, "FailedScheduling", "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity "
                       "rules, 2 Insufficient memory.", type_="Warning", component="default-scheduler")]


def target_removed(vmim, vmi):
    return [make_event(vmim, "FailedMigration", "Migration target pod was removed during active migration.")]


def vmi_shutdown(vmim, vmi):
    return [make_event(vmim, "FailedMigration", "Migration failed vmi shutdown during migration.")]


LIBVIRT = "virError(Code=1, Domain=7, Message='internal error: client socket is closed')"
ROWS = []
for v in ("1.1", "1.3", "1.8"):
    per_gib = 800 if v != "1.8" else 150
    ROWS += [
        (f"{v}-completion-timeout", dict(version=v, took=3 * per_gib + 1, reason=NOT_COMPLETED.format(3 * per_gib)),
         "completion-timeout"),
        (f"{v}-progress-stall", dict(version=v, took=300, reason=STUCK.format(150)), "progress-stall"),
        (f"{v}-target-unschedulable", dict(version=v, took=0, state=False, kubevirt_events=unschedulable,
                                           vmim_kwargs={"reached_running": False}), "target-unschedulable"),
        (f"{v}-target-pod-removed", dict(version=v, took=20, kubevirt_events=target_removed), "target-pod-removed"),
        (f"{v}-vmi-shutdown", dict(version=v, took=20, kubevirt_events=vmi_shutdown), "vmi-shutdown"),
        (f"{v}-aborted", dict(version=v, took=40, reason="Live migration aborted ",
                              state_kwargs={"abort_requested": True}), "aborted"),
        (f"{v}-libvirt-error", dict(version=v, took=12, reason=LIBVIRT), "libvirt-error"),
        (f"{v}-unknown", dict(version=v, took=12), "unknown"),
    ]
ROWS += [
    ("1.9-wording-completion-timeout", dict(took=451, reason=ABORTED_19), "completion-timeout"),
    ("1.9-wording-progress-stall", dict(took=200, reason=ABORTED_19), "progress-stall"),
    ("1.9-wording-aborted", dict(took=200, reason=ABORTED_19, state_kwargs={"abort_requested": True}), "aborted"),
    ("1.9-wording-aborted-by-condition", dict(took=200, reason=ABORTED_19, vmim_kwargs={"conditions": [
        {"type": "AbortRequested", "status": "True"}]}), "aborted"),
    ("vmi-gone-no-events", dict(took=20, vmi=False), "vmi-shutdown"),
    ("target-pod-down-in-reason", dict(version="1.1", took=5, reason=" target pod is down"), "target-pod-removed"),
    ("target-pod-down-capitalised", dict(version="1.8", took=5, reason="Target pod is down"), "target-pod-removed"),
]


@pytest.mark.parametrize("kwargs,category", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_failed_migration_is_categorised(kwargs, category):
    verdict, data = reported(facts(**kwargs))
    assert verdict.action is Action.REPORT and verdict.notice == "failed"
    assert verdict.report["category"] == category and data["category"] == category
    assert "(uid 22222222-2222-2222-2222-222222222222)" in data["message"]
    assert data["advice"], "every category comes with advice"


@pytest.mark.parametrize("version,guest,took,budget", [("1.1", "8Gi", 7201, 7200), ("1.3", "8Gi", 7201, 7200),
                                                       ("1.8", "8Gi", 1351, 1350), ("1.3", "1948Mi", 2401, 2400)],
                         ids=["1.1-8Gi", "1.3-8Gi", "1.8-8Gi", "1.3-1948Mi"])
def test_the_numbers_are_kubevirts(version, guest, took, budget):
    verdict, data = reported(facts(version, guest=guest, took=took, reason=NOT_COMPLETED.format(budget)))
    assert verdict.report["budget"]["completionTimeoutSeconds"] == budget
    assert verdict.report["kubevirtSeconds"] == budget
    assert f"of a {budget} s completion budget" in data["message"]
    assert verdict.report["failureReasonSource"] == ("KubeVirt Event Migrated on the VMI" if version == "1.1"
                                                     else "migrationState.failureReason")


def test_the_unschedulable_report_carries_the_schedulers_message():
    _, data = reported(facts(took=0, state=False, kubevirt_events=unschedulable,
                             vmim_kwargs={"reached_running": False}))
    assert "2 Insufficient memory" in data["message"]
    assert "2 Insufficient memory" in data["advice"][0]["why"]


@pytest.mark.parametrize("version", ["1.3", "1.8"])
def test_a_vmims_copy_of_another_migrations_state_is_ignored(version):
    """Up to v1.5 a VMIM that failed before its hand-off copies the VMI's migrationState, which is the previous
    migration's (seen on KubeVirt v1.3.0's virt-controller): its failureReason says nothing about this one."""
    known = facts(version, took=0, state=False, kubevirt_events=unschedulable, vmim_kwargs={"reached_running": False})
    previous = make_state("11111111-1111-1111-1111-111111111111", took=301, version=version,
                          reason="Live migration is not completed after 300 seconds and has been aborted")
    known.vmim["status"]["migrationState"] = previous
    known.vmi["status"]["migrationState"] = previous
    verdict, data = reported(known)
    assert verdict.report["category"] == "target-unschedulable" and verdict.report["failureReason"] is None
    assert "2 Insufficient memory" in data["message"]


@pytest.mark.parametrize("ratio,action", [(0.5, Action.SKIP), (0.79, Action.SKIP), (0.8, Action.REPORT),
                                          (0.95, Action.REPORT)], ids=["50%", "79%", "80%", "95%"])
def test_a_success_is_reported_only_near_its_timeout(ratio, action):
    verdict, data = reported(facts(phase="Succeeded", took=int(450 * ratio)))
    assert verdict.action is action
    if action is Action.REPORT:
        assert verdict.notice == "near-timeout" and data["category"] == "near-timeout"
        assert "succeeded but used" in data["message"]


def test_the_warn_ratio_is_a_setting():
    assert decide(facts(phase="Succeeded", took=300), Settings(warn_ratio=0.6), NOW).action is Action.REPORT


@pytest.mark.parametrize("kwargs,settings,now,why", [
    ({"phase": "Running"}, Settings(), NOW, "not final"),
    ({}, Settings(), STARTED + timedelta(hours=2), "MIGRATION_REPORT_WITHIN"),
    ({}, Settings(namespaces=frozenset({"prod"})), NOW, "out of scope"),
    ({}, Settings(exclude_namespaces=frozenset({"default"})), NOW, "out of scope"),
], ids=["running", "too-old", "not-in-namespaces", "excluded-namespace"])
def test_skips(kwargs, settings, now, why):
    verdict = decide(facts(reason=NOT_COMPLETED.format(450), **kwargs), settings, now)
    assert verdict.action is Action.SKIP and why in verdict.reason


def test_an_evacuation_migration_is_evacuation_reports_from_the_object_and_from_its_row():
    """KubeVirt's evacuation controller annotates its migrations with the drained node (docs/facts.md §10); the node's
    finding explains them (docs/evacuation-report.md, who speaks for what): no second notice here."""
    found = facts(reason=NOT_COMPLETED.format(450))
    found.vmim["metadata"]["annotations"] = {"kubevirt.io/evacuationMigration": "node-a"}
    verdict = decide(found, Settings(), NOW)
    assert verdict.action is Action.SKIP and "evacuation-report" in verdict.reason
    why = row_precheck(found.vmim["metadata"], "Failed", Settings(), NOW)
    assert why is not None and "node node-a" in why


# -- the policy KubeVirt chose, and the advice ----------------------------------------------------
def test_recorded_policy_name_wins_over_matching():
    policies = [make_policy("slow", vmi={"workload": "db"}, completionTimeoutPerGiB=400),
                make_policy("aaa-fast", completionTimeoutPerGiB=50)]
    verdict, data = reported(facts(labels=WORKLOAD, took=1201, reason=NOT_COMPLETED.format(1200), policies=policies,
                                   state_kwargs={"policy": "slow"}))
    assert verdict.report["policy"] == {"name": "slow", "how": "recorded", "ties": []}
    assert verdict.report["budget"]["completionTimeoutSeconds"] == 1200
    assert data["advice"][0]["action"] == "amend MigrationPolicy slow (the policy in effect)"


def test_matching_uses_namespace_labels_and_reports_ties():
    policies = [make_policy("b-ns", namespace=NS, completionTimeoutPerGiB=100),
                make_policy("a-ns", namespace=NS, completionTimeoutPerGiB=200)]
    verdict, data = reported(facts(labels=WORKLOAD, took=601, reason=NOT_COMPLETED.format(600), policies=policies,
                                   namespace=make_namespace(labels=NS)))
    assert verdict.report["policy"]["name"] == "a-ns" and verdict.report["policy"]["ties"] == ["a-ns", "b-ns"]
    assert verdict.report["budget"]["completionTimeoutSeconds"] == 600
    assert "policies tied: a-ns, b-ns" in data["message"]


def test_completion_timeout_advice_is_ready_to_apply_policies_scoped_to_the_vmi():
    _, data = reported(facts(labels={"harvesterhci.io/vmName": "vm1"}, reason=NOT_COMPLETED.format(450)))
    advice = data["advice"]
    documents = [yaml.safe_load(a["yaml"]) for a in advice]
    assert [d["kind"] for d in documents] == ["MigrationPolicy"] * 3
    assert all(d["spec"]["selectors"] == {"virtualMachineInstanceSelector": {"harvesterhci.io/vmName": "vm1"}}
               for d in documents)
    assert documents[0]["spec"]["allowAutoConverge"] is True
    assert documents[1]["spec"]["allowPostCopy"] is True and "crashing loses the VM" in advice[1]["why"]
    assert documents[2]["spec"]["completionTimeoutPerGiB"] == 300


def test_progress_stall_advice_names_bandwidth_and_the_migration_network():
    _, data = reported(facts(took=300, reason=STUCK.format(150), migrations={"bandwidthPerMigration": "64Mi"}))
    advice = data["advice"]
    assert yaml.safe_load(advice[0]["yaml"])["spec"]["bandwidthPerMigration"] == "0"
    assert "64Mi" in advice[0]["why"]
    assert advice[1]["action"] == "use a dedicated migration network" and "network" in advice[1]["yaml"]


# -- when a reported migration's finding ends -------------------------------------------------------------
def test_a_reported_migration_ends_with_a_later_migration_the_vmi_gone_or_restarted_or_its_lifetime():
    from functions.migration_report.decide import ended

    vmi = make_vmi()
    reported = {"uid": UID, "vmi": "default/vm1", "vmiUid": vmi["metadata"]["uid"],
                "createdAt": "2026-11-30T09:00:00Z"}
    opened = NOW - timedelta(minutes=5)
    assert ended(reported, vmi, [], opened, DEFAULTS, NOW) is None
    later = make_vmim(phase="Succeeded", name="vm1-mig-later", created=NOW - timedelta(minutes=1))
    assert "a later migration of the VMI, vm1-mig-later, has succeeded" in ended(reported, vmi, [later], opened,
                                                                                  DEFAULTS, NOW)
    running = make_vmim(phase="Running", name="vm1-mig-now", created=NOW - timedelta(minutes=1))
    assert ended(reported, vmi, [running], opened, DEFAULTS, NOW) is None  # not ended yet
    other_vmi = make_vmim("vm2", phase="Succeeded", name="vm2-mig", created=NOW - timedelta(minutes=1))
    assert ended(reported, vmi, [other_vmi], opened, DEFAULTS, NOW) is None
    assert "is gone" in ended(reported, None, [], opened, DEFAULTS, NOW)
    assert "restarted" in ended(reported, make_vmi(uid="another"), [], opened, DEFAULTS, NOW)
    assert "MIGRATION_RESOLVED_AFTER=360m" in ended(reported, vmi, [], NOW - timedelta(hours=6), DEFAULTS, NOW)

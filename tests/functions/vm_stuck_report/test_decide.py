"""vm-stuck-report's pure part: when a VM counts as stuck (one row per state), and the one cause each set of facts
names (one row per cause), with its evidence and next step; unknown when the facts say nothing."""
from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from functions.vm_stuck_report import advice, wording
from functions.vm_stuck_report.causes import RULES, Action, Cause, diagnose
from functions.vm_stuck_report.decide import decide
from functions.vm_stuck_report.facts import (
    DataVolumeFacts,
    Detail,
    Ended,
    EventFact,
    Facts,
    NodeFacts,
    PodFacts,
    QueueFacts,
    QuotaFacts,
    StartFailures,
    Stuck,
    VolumeFacts,
    Waiting,
    exceeded,
    quantity,
)
from functions.vm_stuck_report.settings import OPT_OUT, Settings, load
from shared.settings import SettingsError
from simcluster.builders import stuck as b

NOW = b.NOW
S = Settings()


def at(minutes: float):
    return NOW - timedelta(minutes=minutes)


def stuck(vm, vmi, vmim=None, settings=S, now=NOW):
    """decide() on the VM, VMI and VMIM alone: past its threshold, it asks for what explains it (EXPLAIN)."""
    return decide(Facts(vm, vmi, vmim), settings, now)


# -- stuck(): which states, since when, how long ------------------------------------------------------
def _vm_vmi(status, vmi_phase="Scheduling", vmi_age=11, **vm_kw):
    v = b.vm(status=status, **vm_kw)
    return v, (b.vmi(v, phase=vmi_phase, created=at(vmi_age)) if vmi_phase else None)


@pytest.mark.parametrize("status,vmi_phase,vmi_age,vm_kw,action,group", [
    pytest.param("Starting", "Scheduling", 11, {}, Action.EXPLAIN, "starting", id="starting-over-10m"),
    pytest.param("Starting", "Scheduling", 9, {}, Action.WAIT, "starting", id="starting-under-10m"),
    pytest.param("ErrorUnschedulable", "Scheduling", 11, {}, Action.EXPLAIN, "starting", id="unschedulable"),
    pytest.param("ErrorPvcNotFound", "Pending", 11, {}, Action.EXPLAIN, "starting", id="pvc-not-found"),
    pytest.param("ImagePullBackOff", "Scheduled", 30, {}, Action.EXPLAIN, "starting", id="image-pull-backoff"),
    pytest.param("WaitingForVolumeBinding", None, 0, {"ready_since": at(12)}, Action.WAIT, None,
                 id="no-vmi-is-not-timed-from-the-last-stop"),
    pytest.param("ErrorUnschedulable", "Failed", 60, {}, Action.WAIT, None, id="a-status-of-a-vmi-that-ended-is-stale"),
    pytest.param("Running", "Running", 60, {}, Action.SETTLED, None, id="running-is-settled"),
    # KubeVirt never prints a starting word over a Running VMI: one written from an older VMI (a virt-controller
    # whose VMI cache lags, as after a restart) is behind, not stuck
    pytest.param("Starting", "Running", 60, {}, Action.SETTLED, None, id="a-starting-word-over-a-running-vmi"),
    pytest.param("ErrorUnschedulable", "Running", 60, {}, Action.SETTLED, None,
                 id="an-unschedulable-word-over-a-running-vmi"),
    pytest.param("Stopped", None, 0, {}, Action.SETTLED, None, id="stopped-is-settled"),
    pytest.param("Paused", "Running", 60, {}, Action.SETTLED, None, id="paused-is-io-pause-reports"),
    pytest.param("WaitingForReceiver", "Pending", 60, {}, Action.SETTLED, None, id="waiting-for-receiver-is-normal"),
])
def test_stuck_states(status, vmi_phase, vmi_age, vm_kw, action, group):
    v, i = _vm_vmi(status, vmi_phase, vmi_age, **vm_kw)
    verdict = stuck(v, i)
    assert verdict.action is action
    assert (verdict.stuck.group if verdict.stuck else None) == group


def test_stopping_counts_from_the_vmis_deletion_and_terminating_from_the_vms():
    v = b.vm(status="Stopping")
    i = b.vmi(v, phase="Running", deleting=at(11))
    verdict = stuck(v, i)
    assert verdict.action is Action.EXPLAIN and verdict.stuck.since == at(11) and verdict.stuck.instance == \
        i["metadata"]["uid"]
    t = b.vm(status="Terminating", deleting=at(4))
    assert stuck(t, None).action is Action.WAIT


def test_stopping_without_a_deletion_is_not_timed_from_a_guess():
    v = b.vm(status="Stopping")
    assert stuck(v, b.vmi(v, phase="Running")).action is Action.WAIT


def test_a_threshold_per_state_and_the_opt_out_annotation():
    settings = load({"VM_STUCK_AFTER_BY_STATE": "Starting=30m"})
    v, i = _vm_vmi("Starting", vmi_age=20)
    assert stuck(v, i, settings=settings).action is Action.WAIT
    assert stuck(v, i).action is Action.EXPLAIN
    quiet = b.vm(status="Starting", annotations={OPT_OUT: "skip"})
    assert stuck(quiet, b.vmi(quiet, created=at(60))).action is Action.SKIP


def test_namespaces_out_of_scope_are_skipped():
    v, i = _vm_vmi("Starting", vmi_age=20)
    assert stuck(v, i, settings=load({"VM_STUCK_EXCLUDE_NAMESPACES": "default"})).action is Action.SKIP


@pytest.mark.parametrize("phase,age,action", [
    pytest.param("Pending", 11, Action.EXPLAIN, id="pending-over-10m"),
    pytest.param("Scheduling", 11, Action.EXPLAIN, id="scheduling-over-10m"),
    pytest.param(None, 11, Action.EXPLAIN, id="no-phase-yet-is-pending"),
    pytest.param("Pending", 5, Action.WAIT, id="pending-under-10m"),
    pytest.param("Running", 60, Action.SETTLED, id="running-is-not-stuck-starting"),
    pytest.param("Failed", 60, Action.DEFER, id="failed-is-migration-reports"),
])
def test_migration_states(phase, age, action):
    v = b.vm(status="Running")
    i = b.vmi(v, phase="Running", node="node-a")
    verdict = stuck(v, i, b.vmim(i, phase=phase, created=at(age)))
    assert verdict.action is action
    if action is Action.EXPLAIN:
        assert verdict.stuck.group == "migrating" and verdict.stuck.migration == "mig1"


@pytest.mark.parametrize("env,fragment", [
    ({"VM_STUCK_AFTER": "0s"}, "would report every VM"),
    ({"VM_STUCK_AFTER_BY_STATE": "Stopping=0s"}, "would report every VM as it begins to stop"),
    ({"VM_STUCK_AFTER_BY_STATE": "Sleeping=10m"}, "not a state"),
    ({"VM_STUCK_AFTER_BY_STATE": "Starting=soon"}, "not a duration"),
    ({"LONGHORN_NAMESPACE": "Longhorn System"}, "not a namespace"),
])
def test_bad_settings_name_the_variable(env, fragment):
    with pytest.raises(SettingsError, match=fragment):
        load(env)


def test_the_defaults_are_no_shorter_than_kubevirts_alerts():
    settings = load({})
    # VirtualMachineStuckInUnhealthyState: for 10m; VirtualMachineStuckOnNode: for 5m (docs/facts.md §7)
    assert all(settings.threshold(s) >= timedelta(minutes=10) for s in settings.thresholds)


# -- diagnose(): one cause, evidence, next step ---------------------------------------------------------
STARTING = Stuck("ErrorUnschedulable", "starting", at(15), "vmi-uid", timedelta(minutes=10), vm="vm1")
STOPPING = Stuck("Stopping", "stopping", at(15), "vmi-uid", timedelta(minutes=10), vm="vm1")
MIGRATING = Stuck("MigrationPending", "migrating", at(15), "vmim-uid", timedelta(minutes=10), "mig1", vm="vm1")


def case(s, **detail):
    """A stuck VM and what was read to explain it: diagnose's two arguments."""
    return s, Detail(**detail)


def _unschedulable(message, events=()):
    return PodFacts("virt-launcher-vm1-abcde", phase="Pending", scheduled=("False", "Unschedulable", message),
                    events=tuple(events))


GPU = "nvidia.com/NVIDIA_L40S-8Q"
ROWS = [
    pytest.param(case(STARTING, pod=_unschedulable(b.insufficient("memory"))), Cause.INSUFFICIENT,
                 "Insufficient memory", "lower the VM's request", id="insufficient-memory"),
    pytest.param(case(STARTING, pod=_unschedulable(b.insufficient("cpu", nodes=3, short=2))), Cause.INSUFFICIENT,
                 "Insufficient cpu", "add a node", id="insufficient-cpu-beats-fewer-affinity-misses"),
    pytest.param(case(STARTING, pod=_unschedulable(b.insufficient(GPU, nodes=3, short=3)),
                       device_resources=frozenset({GPU}), nodes_with={GPU: ("node-b",)}, nodes_total=3),
                 Cause.DEVICE_ON_ONE_NODE, "only node node-b of 3", "Only node node-b has",
                 id="device-only-one-node-has"),
    pytest.param(case(STARTING, pod=_unschedulable(b.insufficient(GPU, nodes=3, short=3)),
                       device_resources=frozenset({GPU}), nodes_with={GPU: ("node-a", "node-b")}, nodes_total=3),
                 Cause.INSUFFICIENT, f"Insufficient {GPU}", "free it", id="device-on-two-nodes"),
    pytest.param(case(STARTING, pod=_unschedulable(
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.")), Cause.PLACEMENT,
                 "didn't match", "nodeSelector", id="node-affinity"),
    pytest.param(case(STARTING, pod=_unschedulable(
        "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: gpu}.")), Cause.PLACEMENT,
                 "untolerated taint", "toleration", id="taints"),
    pytest.param(case(STARTING, pod=_unschedulable("0/2 nodes are available: 2 node(s) were unschedulable.")),
                 Cause.NODE_UNSCHEDULABLE, "were unschedulable", "uncordon", id="cordoned"),
    pytest.param(case(STARTING, volumes=(VolumeFacts("disk-0", "vm1-disk", found=False),),
                       kubevirt_events=(EventFact("VirtualMachineInstance/vm1", "FailedPvcNotFound",
                                                  "PVC default/vm1-disk does not exist, waiting for it to appear"),)),
                 Cause.VOLUME_MISSING, "does not exist", "Create PVC vm1-disk", id="pvc-missing"),
    pytest.param(case(STARTING, pod=_unschedulable(
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."),
        volumes=(VolumeFacts("disk-0", "vm1-disk", phase="Pending", storage_class="fast", class_found=False),)),
                 Cause.VOLUME_UNBOUND, "StorageClass fast does not exist", "Create StorageClass fast",
                 id="pvc-unbound-no-storage-class"),
    pytest.param(case(STARTING, volumes=(VolumeFacts("disk-0", "vm1-disk", phase="Pending", storage_class="longhorn",
                                                      class_found=True, provisioner="driver.longhorn.io"),)),
                 Cause.VOLUME_UNBOUND, "provisioner driver.longhorn.io", "has not provisioned", id="pvc-unbound"),
    pytest.param(case(STARTING, pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", ""),
                                              events=(EventFact("Pod/virt-launcher-vm1-abcde", "FailedAttachVolume",
                                                                "AttachVolume.Attach failed for volume pvc-1", 4),)),
                       volumes=(VolumeFacts("disk-0", "vm1-disk", phase="Bound", longhorn="pvc-1",
                                            longhorn_state="detached", longhorn_robustness="faulted"),)),
                 Cause.VOLUME_ATTACH, "robustness faulted", "Salvage", id="attach-longhorn-faulted"),
    pytest.param(case(STARTING, pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", ""),
                                              waiting=(Waiting("compute", "ImagePullBackOff",
                                                               'Back-off pulling image "reg/img:1"'),))),
                 Cause.IMAGE_PULL, "ImagePullBackOff", "cannot pull", id="image-pull"),
    # KubeVirt pulls a containerDisk's image in an init container; the others wait PodInitializing
    pytest.param(case(STARTING, container_disks={"containerdisk": "reg/img:1"},
                      pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", ""), waiting=(
                          Waiting("volumecontainerdisk-init", "ErrImagePull", "no such host", True, "reg/img:1"),
                          Waiting("compute", "PodInitializing"), Waiting("volumecontainerdisk", "PodInitializing")))),
                 Cause.IMAGE_PULL, "init container volumecontainerdisk-init (image reg/img:1) waits: ErrImagePull",
                 "containerDisk volume containerdisk", id="image-pull-in-the-init-container"),
    # the VMI controller's copy of it (checkForContainerImageError) is enough, with the VM's one containerDisk
    pytest.param(case(STARTING, container_disks={"containerdisk": "reg/img:1"},
                      synchronized=("False", "ImagePullBackOff", 'Back-off pulling image "reg/img:1"')),
                 Cause.IMAGE_PULL, "Synchronized=False (ImagePullBackOff)", "image reg/img:1",
                 id="image-pull-from-the-vmis-synchronized-condition"),
    pytest.param(case(MIGRATING, pod_looked_for="migration target",
                       quotas=(QuotaFacts("compute", "requests.memory", "8Gi", "7Gi", "2200Mi"),),
                       kubevirt_events=(EventFact("VirtualMachineInstance/vm1", "FailedCreate",
                                                  'Error creating pod: pods "virt-launcher-vm1-x" is forbidden: '
                                                  'exceeded quota: compute'),)),
                 Cause.QUOTA, "requests.memory used 7Gi of 8Gi", "`kubectl -n default edit resourcequota compute`",
                 id="migration-quota"),
]


@pytest.mark.parametrize("facts,cause,evidence,step", ROWS)
def test_one_cause_with_evidence_and_one_next_step(facts, cause, evidence, step):
    verdict = diagnose(*facts)
    assert verdict.action is Action.REPORT and verdict.cause is cause
    assert any(evidence in e for e in wording.evidence(verdict)), wording.evidence(verdict)
    assert step.lower() in advice.next_step(verdict).lower()
    assert wording.checked(facts[1])  # every report says what was looked at


@pytest.mark.parametrize("facts", [
    pytest.param(case(STARTING, pod=PodFacts("p", node="node-a", phase="Pending", scheduled=("True", "", "")),
                       node=NodeFacts("node-a", ready="True")), id="everything-fine"),
    pytest.param(case(STARTING, pod=_unschedulable("0/1 nodes are available: something new.")),
                 id="a-scheduler-message-we-cannot-read"),
    pytest.param(case(STOPPING, node=NodeFacts("node-a", ready="True")), id="stopping-on-a-ready-node"),
])
def test_without_a_fact_that_explains_it_the_cause_is_unknown_and_the_checks_are_listed(facts):
    verdict = diagnose(*facts)
    assert verdict.cause is Cause.UNKNOWN and not verdict.evidence
    assert any("pod" in c or "node" in c for c in wording.checked(facts[1]))


def test_a_start_device_conflict_reports_is_deferred_to_it():
    facts = case(STARTING, pod=_unschedulable(b.insufficient(GPU)), device_conflict="vm2 holds it")
    assert diagnose(*facts).action is Action.DEFER


@pytest.mark.parametrize("stuck", [STARTING, STOPPING], ids=["starting", "stopping"])
def test_a_vm_whose_node_stopped_answering_is_evacuation_reports(stuck):
    """Issue 37: a VM on a node that is not Ready is that node's finding (evacuation-report lists it, with what
    Harvester and KubeVirt will do and when); vm-stuck-report defers and records nothing. It named these
    node-not-ready and stop-not-honoured before."""
    s, detail = case(stuck, pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", "")),
                     node=NodeFacts("node-a", ready="Unknown", ready_reason="NodeStatusUnknown"))
    verdict = diagnose(s, detail)
    assert verdict.action is Action.DEFER and verdict.cause is None
    assert "evacuation-report" in wording.reason(verdict)
    assert diagnose(s, replace(detail, node=replace(detail.node, ready="True"))).action is Action.REPORT


def test_a_migration_off_a_node_being_emptied_is_evacuation_reports():
    s, detail = case(MIGRATING, pod_looked_for="migration target",
                     source_node=NodeFacts("node-a", ready="True", unschedulable=True, draining=("cordoned",)))
    verdict = diagnose(s, detail)
    assert verdict.action is Action.DEFER and "being emptied (cordoned)" in wording.reason(verdict)
    assert diagnose(s, replace(detail, source_node=replace(detail.source_node, draining=()))).action \
        is Action.REPORT


PROVISIONING = Stuck("DataVolumeError", "starting", at(15), "dv-uid", timedelta(minutes=10), vm="vm1")
CRASHING = Stuck("CrashLoopBackOff", "starting", at(15), "vm-uid", timedelta(minutes=10), vm="vm1")
IMPORT_FAILS = DataVolumeFacts("vm1-rootdisk", uid="dv-uid", created=at(40), phase="ImportInProgress", progress="N/A",
                               running=("False", "Error", "Unable to connect to http data source: expected status code "
                                        "200, got 404. Status: 404 Not Found"),
                               bound=("True", "Bound", "PVC vm1-rootdisk Bound"), restarts=4)
LIMITS_REFUSED = ('Error creating pod: pods "virt-launcher-vm1-x" is forbidden: exceeded quota: tenant-quota, '
                  'requested: limits.memory=2262Mi, used: limits.memory=15Gi, limited: limits.memory=16Gi')
MORE = [  # the next steps the rows above do not reach
    pytest.param(case(MIGRATING, pod_looked_for="migration target", kubevirt_events=(
        EventFact("VirtualMachineInstance/vm1", "FailedCreate", LIMITS_REFUSED),)), id="quota-on-limits"),
    pytest.param(case(STARTING, synchronized=("False", "FailedCreate", 'failed to create virtual machine pod: pods '
                                              '"virt-launcher-vm1-x" is forbidden: failed quota: compute: must specify '
                                              'limits.memory for: compute')), id="quota-wants-limits"),
    pytest.param(case(STARTING, pod=_unschedulable("0/1 nodes are available: pod has unbound immediate "
                                                   "PersistentVolumeClaims.")), id="unbound-claims-unread"),
    pytest.param(case(STARTING, volumes=(VolumeFacts("disk-0", "vm1-disk", phase="Pending"),)), id="no-class"),
    pytest.param(case(STARTING, pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", ""),
                                             events=(EventFact("Pod/virt-launcher-vm1-abcde", "FailedAttachVolume",
                                                               "AttachVolume.Attach failed", 2),)),
                      volumes=(VolumeFacts("disk-0", "vm1-disk", phase="Bound", longhorn="pvc-1",
                                           longhorn_state="detached", longhorn_robustness="degraded"),)),
                 id="longhorn-attach"),
    pytest.param(case(STARTING, pod=PodFacts("virt-launcher-vm1-abcde", node="node-a", scheduled=("True", "", ""),
                                             events=(EventFact("Pod/virt-launcher-vm1-abcde", "FailedMount",
                                                               "MountVolume.SetUp failed", 2),))), id="csi-attach"),
    pytest.param(case(STARTING, pod=PodFacts("p", scheduled=("True", "", ""))), id="unknown"),
    pytest.param(case(MIGRATING, pod_looked_for="migration target",
                      queue=QueueFacts(0, 5, "node-a", 0, 0, "kubevirt/kubevirt")), id="migrations-held-by-a-zero"),
    pytest.param(case(PROVISIONING, datavolumes=(IMPORT_FAILS,)), id="import-fails"),
    pytest.param(case(CRASHING, start_failures=StartFailures(7, at(-1), "vmi-7"),
                      pod=PodFacts("virt-launcher-vm1-x", phase="Failed", scheduled=("True", "", ""),
                                   ended=(Ended("compute", "Error", "qemu: could not open disk", 1),))),
                 id="crash-loop"),
]
COMMAND = re.compile(r"`((?:kubectl|virtctl) [^`]+)`")
NAMESPACED = re.compile(r"\b(vm|vmi|pod|pvc|resourcequota|limitrange|datavolume|volumes\.longhorn\.io|restart)\b")


@pytest.mark.parametrize("facts", [p.values[0] for p in ROWS] + [p.values[0] for p in MORE],
                         ids=[p.id for p in ROWS] + [p.id for p in MORE])
def test_every_next_step_names_a_command_to_run_as_printed(facts):
    """Issue 35: no placeholder (`<node>`), no description in place of a name ("the namespace's ResourceQuota"),
    and a namespaced object with its namespace."""
    step = advice.next_step(diagnose(*facts))
    commands = COMMAND.findall(step)
    assert commands, step
    for command in commands:
        assert not re.search(r"[<>]|'s |\bthe\b", command), command
        if NAMESPACED.search(command) and " -A" not in command:
            assert re.search(r" -n [a-z0-9-]+ ", command), command


def test_the_rows_reach_every_next_step():
    kinds = {diagnose(*p.values[0]).step.kind for p in ROWS + MORE}
    assert kinds == set(advice.STEPS), set(advice.STEPS) - kinds


@pytest.mark.parametrize("queue,action,words", [
    pytest.param(QueueFacts(5, 5, "node-a", 1, 2, "kubevirt/kubevirt"), Action.SETTLED,
                 "5 migration(s) running of parallelMigrationsPerCluster 5", id="the-cluster-limit"),
    pytest.param(QueueFacts(2, 5, "node-a", 2, 2, ""), Action.SETTLED,
                 "2 out of node node-a of parallelOutboundMigrationsPerNode 2 (KubeVirt's defaults)",
                 id="the-node-limit-by-default"),
    pytest.param(QueueFacts(0, 5, "node-a", 0, 0, "kubevirt/kubevirt"), Action.REPORT,
                 "parallelOutboundMigrationsPerNode 0", id="a-limit-of-zero-holds-it-for-ever"),
    pytest.param(QueueFacts(1, 5, "node-a", 1, 2, "kubevirt/kubevirt"), Action.REPORT, "", id="room-in-the-queue"),
])
def test_a_queued_migration_is_not_stuck_and_never_unknown_for_it(queue, action, words):
    """KubeVirt keeps a VMIM Pending while parallelMigrationsPerCluster (5) or parallelOutboundMigrationsPerNode (2)
    are in use (migration.go handleTargetPodCreation): queued, not stuck. Only a limit of 0 holds it for ever."""
    verdict = diagnose(MIGRATING, Detail(pod_looked_for="migration target", queue=queue))
    assert verdict.action is action
    if action is Action.SETTLED:
        assert words in wording.reason(verdict) and "queued" in wording.reason(verdict)
    elif words:
        assert verdict.cause is Cause.MIGRATION_QUEUED and any(words in e for e in wording.evidence(verdict))
        assert "`kubectl -n kubevirt edit kubevirt kubevirt`" in advice.next_step(verdict)
    else:
        assert verdict.cause is Cause.UNKNOWN
        assert any("KubeVirt's migration queue: 1 migration(s) running" in c
                   for c in wording.checked(Detail(queue=queue)))


def _with_datavolume(status, dv):
    v = b.vm(status=status)
    v["spec"]["template"]["spec"]["volumes"] = [{"name": "rootdisk", "dataVolume": {"name": dv.name}}]
    return v


@pytest.mark.parametrize("status,dv,action", [
    pytest.param("Provisioning", replace(IMPORT_FAILS, running=("True", "", ""), created=at(40)), Action.EXPLAIN,
                 id="importing-for-40m"),
    pytest.param("DataVolumeError", IMPORT_FAILS, Action.EXPLAIN, id="import-failing-for-40m"),
    pytest.param("Provisioning", replace(IMPORT_FAILS, created=at(5)), Action.WAIT, id="importing-for-5m"),
    pytest.param("Provisioning", DataVolumeFacts("vm1-rootdisk", found=False), Action.WAIT, id="no-datavolume-yet"),
])
def test_provisioning_and_datavolume_error_are_timed_from_the_datavolume(status, dv, action):
    """KubeVirt creates no VMI until the VM's DataVolumes are ready (vm.go handleDataVolumes): Provisioning and
    DataVolumeError are timed from the first DataVolume not ready, its creation (the episode is of it)."""
    verdict = decide(Facts(_with_datavolume(status, dv), None, datavolumes=(dv,)), S, NOW)
    assert verdict.action is action
    if action is Action.EXPLAIN:
        assert (verdict.stuck.since, verdict.stuck.instance) == (dv.created, dv.uid)


@pytest.mark.parametrize("count,retry_in,action", [
    pytest.param(7, 60, Action.EXPLAIN, id="seven-failures"),
    pytest.param(2, 60, Action.WAIT, id="two-failures-are-a-minute-at-least"),
])
def test_a_crash_loop_is_timed_from_kubevirts_back_off(count, retry_in, action):
    """CrashLoopBackOff is printed with no live VMI: timed from status.startFailure by KubeVirt's back-off schedule
    (vm.go calculateStartBackoffTime), never earlier than it can have lasted; one episode of the VM across tries."""
    v = b.vm(status="CrashLoopBackOff")
    v["status"]["startFailure"] = {"consecutiveFailCount": count, "lastFailedVMIUID": "vmi-9",
                                   "retryAfterTimestamp": b.stamp(NOW + timedelta(seconds=retry_in))}
    failed = b.vmi(v, phase="Failed")
    verdict = decide(Facts(v, failed), S, NOW)
    assert verdict.action is action and verdict.stuck.instance == v["metadata"]["uid"]
    retry = b.vmi(v, phase="Scheduling", created=NOW)  # the next try: the same episode, the same time
    assert decide(Facts(dict(v, status=dict(v["status"], printableStatus="Starting")), retry), S, NOW).stuck == \
        verdict.stuck.__class__(**{**verdict.stuck.__dict__, "state": "Starting"})


@pytest.mark.parametrize("row,cause,evidence,step", [
    ("import-fails", Cause.VOLUME_IMPORT, "DataVolume vm1-rootdisk: phase ImportInProgress, Running=False (Error): "
     "Unable to connect to http data source", "`kubectl -n default describe datavolume vm1-rootdisk`"),
    ("crash-loop", Cause.CRASH_LOOP, "KubeVirt counted 7 start(s) in a row that failed before the VM ran",
     "`kubectl -n default logs virt-launcher-vm1-x -c compute`"),
])
def test_an_import_that_fails_and_a_crash_loop_name_their_cause(row, cause, evidence, step):
    [facts] = [p.values[0] for p in MORE if p.id == row]
    verdict = diagnose(*facts)
    assert verdict.cause is cause
    assert any(evidence in e for e in wording.evidence(verdict)), wording.evidence(verdict)
    assert step in advice.next_step(verdict)


def test_a_quota_refusal_names_the_quota_and_its_numbers_on_limits():
    """Harvester's and Rancher's namespace quotas are on limits.*: the admission's message names the quota and
    what it exceeds (k8s.io/apiserver plugin/resourcequota controller.go); the requests arithmetic finds nothing."""
    verdict = diagnose(*MORE[0].values[0])
    assert verdict.cause is Cause.QUOTA
    assert "ResourceQuota tenant-quota: limits.memory used 15Gi of 16Gi, the migration target pod asked 2262Mi" in \
        wording.evidence(verdict)
    assert "`kubectl -n default edit resourcequota tenant-quota`" in advice.next_step(verdict)
    wants = diagnose(*MORE[1].values[0])
    assert wants.cause is Cause.QUOTA and "specify limits.memory for: compute" in advice.next_step(wants)


def test_a_quota_on_limits_is_exceeded_by_the_pods_limits():
    q = b.quota(hard={"limits.memory": "16Gi"}, used={"limits.memory": "15Gi"})
    assert not exceeded(q, {"memory": "2262Mi"})
    [over] = exceeded(q, {"memory": "2262Mi"}, {"memory": "2262Mi"})
    assert (over.resource, over.used, over.hard) == ("limits.memory", "15Gi", "16Gi")


@pytest.mark.parametrize("text,value", [("500m", 0.5), ("2Gi", 2 * 2**30), ("1.5", 1.5), ("1e3", 1000.0),
                                        ("10M", 1e7), ("x", None), ("", None)])
def test_quantities(text, value):
    assert quantity(text) == value


def test_a_quota_is_exceeded_when_used_plus_requested_is_over_hard():
    q = b.quota(hard={"requests.memory": "8Gi", "pods": "10"}, used={"requests.memory": "7Gi", "pods": "3"})
    [over] = exceeded(q, {"memory": "2200Mi", "cpu": "1"})
    assert (over.resource, over.hard, over.used, over.requested) == ("requests.memory", "8Gi", "7Gi", "2200Mi")
    assert not exceeded(q, {"memory": "1Gi"})


# -- the rule, as the docs say it ---------------------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[3] / "docs" / "vm-stuck-report.md"


def _tables(text: str) -> list[list[str]]:
    """The causes of each table of 'The causes', in their order (a row's first cell, `cause`)."""
    section = text.split("## The causes", 1)[1].split("\n## ", 1)[0]
    tables, rows = [], []
    for line in section.splitlines() + [""]:
        found = re.match(r"\| `([a-z-]+)` \|", line)
        if found:
            rows.append(found.group(1))
        elif rows and not line.startswith("|"):
            tables.append(rows)
            rows = []
    return tables


def test_the_docs_list_the_causes_in_the_order_the_code_tries_them():
    """Issue 35 point 7: the page said "the first rule whose facts hold" over one table with node-not-ready before
    stop-not-honoured, while a stuck Stopping VM was (rightly) named stop-not-honoured. The rule is per group; since
    issue 37 a stop has no rule of its own (a stop that hangs is a dead node's, evacuation-report's)."""
    start, first = _tables(DOC.read_text())
    assert start == list(dict.fromkeys(c.value for c in RULES["starting"])) + ["unknown"], start
    assert first == [c.value for c in RULES["migrating"] if c not in RULES["starting"]], first
    assert RULES["migrating"][1:] == RULES["starting"] and RULES["stopping"] == RULES["terminating"] == ()
    assert set(start + first) == {c.value for c in Cause}


@pytest.mark.parametrize("delta, words", [
    (timedelta(seconds=2), "2s"),   # the real node's lane (VM_STUCK_AFTER=2s) read "not yet 0m"
    (timedelta(seconds=45), "45s"),
    (timedelta(minutes=10), "10m"),
    (timedelta(seconds=90), "1m30s"),
    (timedelta(hours=2, minutes=5), "2h05m"),
])
def test_a_threshold_reads_as_set(delta, words):
    assert wording.duration(delta) == words

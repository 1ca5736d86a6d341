"""Small builders for the findings alert-forwarder receives: each function's reply, in the one finding schema
(docs/findings.md), with the categories, identities and details each producer puts there."""
from __future__ import annotations

import uuid

from cloudevents.http import CloudEvent

from shared.finding import Finding

VMIM_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}"
VMI_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}"
VM_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}"


def _ns_name(ref: str) -> tuple[str, str]:
    namespace, _, name = ref.rpartition("/")
    return namespace, name


def _data(function: str, category: str, subject: str, key: str, identity: dict, severity: str | None, summary: str,
          advice: list, details: dict, state: str) -> dict:
    """A finding as the schema (docs/findings.md) puts it in a reply."""
    finding = Finding(function, category, subject, key, {k: v for k, v in identity.items() if v},
                      severity or "", summary, tuple(advice), details)
    data = finding.data(state, episode=1, count=1, openedAt="2026-11-30T11:58:00Z",
                        resolvedAt="2026-11-30T12:30:00Z" if state == "resolved" else None)
    if severity is None:
        data.pop("severity")
    return data


def device_conflict(holder="default/vm2", blocked=("default/vm1",), *, device="harvester-ktmg4-000004102",
                    kind="taken-while-stopped", severity="warning", state="detected", summary=None, **extra) -> dict:
    details = {"kind": kind, "device": device, "resourceName": "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION",
               "node": "harvester-ktmg4", "holder": holder, "blocked": list(blocked), **extra}
    namespace, vm = _ns_name(holder or blocked[0])
    said = summary or (f"{holder} holds {device}; stopped VM {blocked[0]} names it too and cannot start while "
                       f"{holder} runs." if holder else f"{' and '.join(blocked)} all name {device}.")
    key = "|".join((kind, device, holder or "", ",".join(blocked)))
    return _data("device-conflict", kind, VM_PATH.format(ns=namespace, name=_ns_name(blocked[0])[1]), key,
                 {"namespace": namespace, "vm": vm, "device": device, "conflict": kind}, severity, said, [],
                 details, state)


def migration_report(vmi="default/vm1", migration="default/vm1-migration-abcde", *, category="completion-timeout",
                     state="detected", severity="warning", uid=None, **extra) -> dict:
    namespace, name = _ns_name(migration)
    details = {"migration": migration, "vmi": vmi, "vm": vmi, "phase": "Failed", "category": category, **extra}
    said = (f"Migration {migration} of VMI {vmi} failed: completion timeout after 7200 s "
            f"(8 GB at 800 s/GiB… the guest dirties memory faster than the network copies it).")
    advice = [{"action": "apply MigrationPolicy vm1-migration", "why": "Let KubeVirt auto-converge.",
               "yaml": "apiVersion: migrations.kubevirt.io/v1alpha1\nkind: MigrationPolicy\n"}]
    return _data("migration-report", category, VMIM_PATH.format(ns=namespace, name=name), uid or "uid-" + name,
                 {"namespace": namespace, "vm": _ns_name(vmi)[1], "migration": name}, severity, said, advice,
                 details, state)


def io_pause(vmi="default/vm1", *, pvcs=("vm1-disk-0",), category="rebuild-related", pauses=3, state="detected",
             severity="critical", uid=None, **extra) -> dict:
    namespace, name = _ns_name(vmi)
    volumes = [{"pvc": pvc, "pv": f"pvc-{i}", "longhornVolume": f"pvc-{i}", "robustness": "degraded",
                "rebuilding": True, "progress": 42} for i, pvc in enumerate(pvcs)]
    details = {"vmi": vmi, "category": category, "pauses": pauses, "volumes": volumes, **extra}
    said = (f"VMI {vmi} no longer pauses on IO errors." if state == "resolved"
            else f"VMI {vmi} pauses on IO errors ({category}), {pauses} pause(s) so far.")
    advice = ["Disable fstrim.timer in the guest, or spread its schedule.", "It ends when the replica rebuild ends."]
    return _data("io-pause-report", category, VMI_PATH.format(ns=namespace, name=name), uid or "uid-" + name,
                 {"namespace": namespace, "vm": name, "volume": ",".join(sorted(pvcs))}, severity, said,
                 advice if state != "resolved" else [], details, state)


def vm_stuck(vm="default/vm1", *, group="starting", cause="insufficient-resources", state="detected",
             severity="warning", **extra) -> dict:
    namespace, name = _ns_name(vm)
    details = {"vm": vm, "state": "ErrorUnschedulable", "group": group, "since": "2026-11-30T11:40:00Z",
               "cause": cause, "evidence": ["pod virt-launcher-vm1-abcde: PodScheduled=False (Unschedulable): "
                                            "0/3 nodes are available: 3 Insufficient memory."],
               "nextStep": "Free memory on a node, or lower the VM's request.", "checked": [], **extra}
    said = (f"VM {vm} is no longer stuck." if state == "resolved"
            else f"VM {vm} is ErrorUnschedulable since 2026-11-30T11:40:00Z: {cause}.")
    return _data("vm-stuck-report", f"stuck-{group}", VM_PATH.format(ns=namespace, name=name), "uid-" + name,
                 {"namespace": namespace, "vm": name, "state": group}, severity, said,
                 [details["nextStep"]], details, state)


def cleaned(vmi="default/vm1", action="deleted-vmi", uid=None) -> dict:
    namespace, name = _ns_name(vmi)
    details = {"vmi": vmi, "vm": vmi, "action": action,
               "reason": "runStrategy Manual: KubeVirt will not start it again", "previousRunStrategy": "Manual",
               "dryRun": False}
    return _data("vmi-cleanup", "vmi-cleaned-up", VMI_PATH.format(ns=namespace, name=name),
                 f"{uid or 'uid-' + name}/{action}",
                 {"namespace": namespace, "vm": name}, "info",
                 f"vmi-cleanup {action} for VMI {vmi}: {details['reason']}", [], details, "reported")


def finding_event(type_: str, data, subject: str | None = None, **attributes) -> CloudEvent:
    function = type_.split(".")[2] if type_.count(".") >= 3 else "test"
    attrs = {"type": type_, "source": f"/vmevents/{function}", "id": str(uuid.uuid4()),
             "datacontenttype": "application/json"}
    if subject:
        attrs["subject"] = subject
    attrs.update(attributes)
    return CloudEvent(attrs, data)


class _Writes:
    """What shared/ledger.py needs of a client to open a finding that is not on record yet: a GET that finds
    nothing, and the create (`create(obj)` of a SimCluster, straight into its store, or of a RealCluster)."""

    def __init__(self, create):
        self._create = create

    def get(self, kind, namespace, name):
        return None

    def create(self, kind, namespace, body):
        return self._create(body)


def open_findings(create, start: int, stop: int, *, namespace: str = "default", now=None) -> None:
    """Findings `start`..`stop - 1` on record and open, as a storage outage leaves them: io-pause-report's, one
    per paused VM, each Event written by shared/ledger.py's own code (`Ledger.sighted`)."""
    from datetime import UTC, datetime

    from shared.ledger import Ledger

    ledger = Ledger(_Writes(create), "io-pause-report", reason="IOErrorPause")  # type: ignore[arg-type]
    when = now or datetime.now(UTC)
    for i in range(start, stop):
        name = f"paused-{i:06d}"
        finding = Finding.from_data(io_pause(f"{namespace}/{name}", pvcs=(f"{name}-disk-0",), uid=f"uid-{name}"))
        recipient = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                     "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}
        ledger.sighted(finding, recipient, f"outage-{i}", when)

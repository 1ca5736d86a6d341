"""Small builders for the findings alert-forwarder receives: each function's reply, shaped as its
issue defines it (device-conflict, migration-report, io-pause-report) or as it is built
(vmi-cleanup)."""
from __future__ import annotations

import uuid

from cloudevents.http import CloudEvent

VMIM_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}"
VMI_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}"
VM_PATH = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}"


def device_conflict(holder="default/vm2", blocked=("default/vm1",), *, device="harvester-ktmg4-000004102",
                    kind="taken-while-stopped", severity="warning", **extra) -> dict:
    data = {"kind": kind, "device": device, "resourceName": "intel.com/82599_ETHERNET_CONTROLLER_VIRTUAL_FUNCTION",
            "node": "harvester-ktmg4", "holder": holder, "blocked": list(blocked), "severity": severity}
    data.update(extra)
    return {k: v for k, v in data.items() if v is not None}


def migration_report(vmi="default/vm1", migration="default/vm1-migration-abcde", *, category="completion-timeout",
                     **extra) -> dict:
    data = {"migration": migration, "vmi": vmi, "vm": vmi, "phase": "Failed", "category": category,
            "message": f"Migration {migration} of VMI {vmi} failed: completion timeout after 7200 s "
                       f"(8 GB at 800 s/GiB… "
                       f"the guest dirties memory faster than the network copies it).",
            "advice": [{"action": "apply MigrationPolicy vm1-migration", "why": "Let KubeVirt auto-converge.",
                        "yaml": "apiVersion: migrations.kubevirt.io/v1alpha1\nkind: MigrationPolicy\n"}]}
    data.update(extra)
    return data


def io_pause(vmi="default/vm1", *, pvcs=("vm1-disk-0",), category="rebuild-related", pauses=3, **extra) -> dict:
    data = {"vmi": vmi, "category": category, "pauses": pauses,
            "volumes": [{"pvc": pvc, "pv": f"pvc-{i}", "longhornVolume": f"pvc-{i}", "robustness": "degraded",
                         "rebuilding": True, "progress": 42} for i, pvc in enumerate(pvcs)],
            "advice": ["Disable fstrim.timer in the guest, or spread its schedule.",
                       "It ends when the replica rebuild ends."]}
    data.update(extra)
    return data


def cleaned(vmi="default/vm1", action="deleted-vmi") -> dict:
    return {"vmi": vmi, "vm": vmi, "action": action, "reason": "runStrategy Manual: KubeVirt will not start it again",
            "previousRunStrategy": "Manual", "dryRun": False}


def finding_event(type_: str, data, subject: str | None = None, **attributes) -> CloudEvent:
    function = type_.split(".")[2] if type_.count(".") >= 3 else "test"
    attrs = {"type": type_, "source": f"/vmevents/{function}", "id": str(uuid.uuid4()),
             "datacontenttype": "application/json"}
    if subject:
        attrs["subject"] = subject
    attrs.update(attributes)
    return CloudEvent(attrs, data)

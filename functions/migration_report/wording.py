"""What people read about a reported migration: the Event's one sentence, the advice, and the reply's data."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from functions.migration_report.analysis import Explained
from functions.migration_report.decide import Facts, Verdict
from functions.migration_report.settings import Settings
from shared import kubevirt as kv
from shared.finding import Finding
from shared.migrations import quantity

FUNCTION = "migration-report"


def reply_data(verdict: Verdict, facts: Facts, settings: Settings) -> dict:
    """The whole report: KubeVirt's numbers and the category (analysis.py), with the words: the detail where
    KubeVirt wrote none, the data size's note, the advice and the sentence."""
    report = _plain(verdict.report)
    if report.get("detail") is None and verdict.explained is not None:
        report["detail"] = explanation(verdict.explained, report)
    if report.get("dataSize") and report["dataSize"]["blockMigration"]:
        report["dataSize"]["note"] = BLOCK_MIGRATION_NOTE
    category = report["category"]
    report["advice"] = advise("completion-timeout" if category == "near-timeout" else category, report, facts)
    report["message"] = event_message(report, settings)
    return report


BLOCK_MIGRATION_NOTE = ("BlockMigration: KubeVirt adds the ephemeral disks' size, which the API does not show; the "
                        "real budget is at least this")


def explanation(explained: Explained, report: Mapping[str, Any]) -> str:
    """A failure's detail when KubeVirt wrote none: what the category rests on."""
    if explained is Explained.RAN_OUT:
        took, budget = report["timing"]["tookSeconds"], report["budget"]["completionTimeoutSeconds"]
        return f"ran {took} s, the budget is {budget} s"
    return {Explained.ABORT_REQUESTED: "an abort was requested (VMIM deleted or AbortRequested)",
            Explained.JOB_CANCELLED: "the libvirt job was cancelled (an abort was requested)",
            Explained.PROGRESS_TIMEOUT: "aborted before its completion budget ran out: the progress timeout",
            Explained.UNSCHEDULABLE: "the target pod stayed unschedulable",
            Explained.VMI_STOPPED: "the VMI stopped (or was deleted) while it was migrating",
            Explained.NO_REASON: "KubeVirt recorded no failureReason and no Event that explains it"}[explained]


def _plain(value: Any) -> Any:
    """A copy of the verdict's read-only report as plain JSON values."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def finding(report: dict, facts: Facts, notice: str) -> Finding:
    """The report as a finding (docs/findings.md): its category is the report's; its identity the migration
    (the alert's labels of old: namespace, the VMI's name, the migration's name)."""
    vmim = kv.meta(facts.vmim)
    details = {k: v for k, v in report.items() if k not in ("advice", "message")}
    details.update({"notice": notice, "vmiUid": kv.meta(facts.vmi).get("uid") if facts.vmi else None,
                    "createdAt": vmim.get("creationTimestamp")})
    return Finding(FUNCTION, report["category"], kv.api_path(facts.vmim), vmim.get("uid") or "",
                   {"namespace": vmim.get("namespace") or "", "vm": str(report["vmi"]).split("/", 1)[-1],
                    "migration": vmim.get("name") or ""},
                   "warning", report["message"], tuple(report.get("advice") or ()), details)


def resolved_message(details: Mapping[str, Any], because: str) -> str:
    """The resolved finding's sentence."""
    return f"The report on live migration {details.get('migration')} of VMI {details.get('vmi')} ends: {because}."


# -- the one sentence -----------------------------------------------------------------------------
def event_message(report: dict, settings: Settings) -> str:
    """One sentence with the numbers; the migration's uid in it is how a later look finds this report."""
    name = report["migration"].split("/", 1)[1]
    head = f"Live migration {name} (uid {report['uid']}) of VMI {report['vmi']}"
    took = report["timing"]["tookSeconds"]
    ran = f"it ran {took} s of" if took is not None else "it never started copying, with"
    numbers = (f"{ran} {_budget_phrase(report)}, "
               f"progress timeout {report['budget']['progressTimeoutSeconds']} s{_policy_phrase(report)}")
    if report["category"] == "near-timeout":
        return (f"{head} succeeded but used {report['budget']['usedRatio']:.0%} of its completion budget "
                f"(warning from {settings.warn_ratio:.0%}): {numbers}.")
    return f"{head} failed ({report['category']}: {_category_phrase(report)}): {numbers}."


def _budget_phrase(report: dict, per_gib: int | None = None) -> str:
    size = report["dataSize"]
    if size is None:
        return "an unknown completion budget (the VMI shows no memory size)"
    per_gib = per_gib or report["budget"]["completionTimeoutPerGiB"]
    plus = " plus ephemeral disks" if size["blockMigration"] else ""
    return (f"a {per_gib * size['gigabytes']} s completion budget ({per_gib} s/GiB × {size['gigabytes']} GB: "
            f"{size['memory']}{plus} rounded up to decimal GB)")


def _policy_phrase(report: dict) -> str:
    policy = report["policy"]
    per_gib = report["configuration"]["completionTimeoutPerGiB"]
    where = f"; {per_gib['value']} s/GiB is {per_gib['source']}"
    if policy["name"] and policy["how"].startswith("matched") and len(policy["ties"]) > 1:
        where += f" (policies tied: {', '.join(policy['ties'])}; KubeVirt takes the first by name)"
    return where


def _category_phrase(report: dict) -> str:
    category, seconds = report["category"], report.get("kubevirtSeconds")
    if category == "completion-timeout":
        said = f" after {seconds} s" if seconds is not None else ""
        return f"KubeVirt aborted it{said}, its completion budget used up"
    if category == "progress-stall":
        said = seconds if seconds is not None else report["budget"]["progressTimeoutSeconds"]
        return f"no data moved for {said} s, so KubeVirt aborted it"
    return {"target-unschedulable": f"the target pod could not be scheduled: {report['detail']}",
            "target-pod-removed": "the target pod was removed during the migration",
            "vmi-shutdown": "the VMI stopped during the migration",
            "aborted": "it was cancelled on request",
            "libvirt-error": f"libvirt error: {report['detail']}",
            "unknown": "KubeVirt recorded no reason"}[category].rstrip(".")


# -- advice ---------------------------------------------------------------------------------------
_VOLATILE_LABELS = ("kubevirt.io/nodeName", "kubevirt.io/migrationTargetNodeName", "kubevirt.io/outdatedLauncherImage",
                    "kubevirt.io/created-by", "kubevirt.io/schedulable")
_NAME_LABELS = ("harvesterhci.io/vmName", "vm.kubevirt.io/name", "kubevirt.io/vm")


def advise(category: str, report: dict, facts: Facts) -> list[dict]:
    """Concrete next steps from the category and the numbers; a ready-to-apply policy where one is the advice."""
    per_gib, config = report["budget"]["completionTimeoutPerGiB"], report["configuration"]
    if category == "completion-timeout":
        steps = []
        if not config["allowAutoConverge"]["value"]:
            steps.append(_policy_step(facts, report, {"allowAutoConverge": True},
                                      "Let KubeVirt auto-converge: it throttles the guest's vCPUs until its memory "
                                      "dirty rate falls below what the network copies, so pre-copy converges."))
        if not config["allowPostCopy"]["value"]:
            steps.append(_policy_step(facts, report, {"allowPostCopy": True},
                                      "Or allow post-copy: when the budget runs out the guest switches to the target "
                                      "and fetches missing pages from the source. Risk: until the copy ends the "
                                      "guest's state is split across both hosts, so a network failure or either "
                                      "side crashing loses the VM."))
        steps.append(_policy_step(facts, report, {"completionTimeoutPerGiB": per_gib * 2},
                                  f"Or give it more time: completionTimeoutPerGiB {per_gib} → {per_gib * 2} "
                                  f"({_budget_phrase(report, per_gib * 2)})."))
        return steps
    if category == "progress-stall":
        bandwidth = config["bandwidthPerMigration"]["value"]
        limited = (quantity(bandwidth) or 0) > 0
        steps = []
        if limited:
            source = config["bandwidthPerMigration"]["source"]
            steps.append(_policy_step(facts, report, {"bandwidthPerMigration": "0"},
                                      f"bandwidthPerMigration is {bandwidth}/s ({source}): "
                                      f"lift the limit (0 = unlimited) or raise it."))
        network = config["network"]["value"]
        where = (f"Migrations use network {network}: check that link." if network else
                 "Migrations share the pod network: set spec.configuration.migrations.network to a "
                 "NetworkAttachmentDefinition on a dedicated link (Harvester: the vm-migration-network setting).")
        patch = None if network else _kubevirt_patch({"network": "<namespace/network-attachment-definition>"})
        steps.append({"action": "check the migration network" if network else "use a dedicated migration network",
                      "why": (f"No data moved for {report['budget']['progressTimeoutSeconds']} s between "
                              f"{report['sourceNode'] or 'the source'} and {report['targetNode'] or 'the target'}. "
                              f"{where} A slow but working link can also get a larger progressTimeout "
                              f"(KubeVirt CR only; policies cannot set it)."),
                      "yaml": patch})
        return steps
    if category == "target-unschedulable":
        return [{"action": "make room for the target pod",
                 "why": f"The scheduler said: {report['detail']} Free the resource it names on another node, or relax "
                        f"the VM's nodeSelector/affinity; host devices and host-model CPUs also limit the targets.",
                 "yaml": None}]
    if category == "target-pod-removed":
        return [{"action": "look at the target node",
                 "why": f"The target virt-launcher pod went away mid-migration ({report['detail']}): eviction, OOM or "
                        f"a node problem on {report['targetNode'] or 'the target node'}; retry once it is healthy.",
                 "yaml": None}]
    if category == "vmi-shutdown":
        return [{"action": "nothing to tune", "why": "The guest stopped during the migration; start it again if "
                                                     "that was not intended.", "yaml": None}]
    if category == "aborted":
        return [{"action": "nothing to tune",
                 "why": "Someone cancelled it (the VMIM was deleted or `virtctl migrate-cancel`); "
                        "migrate again when ready.",
                 "yaml": None}]
    if category == "libvirt-error":
        return [{"action": "read the source virt-launcher's log",
                 "why": f"libvirt said: {report['failureReason']} — the source pod's log on "
                        f"{report['sourceNode'] or 'the source node'} has the details.", "yaml": None}]
    return [{"action": "read KubeVirt's Events and the virt-handler logs",
             "why": "KubeVirt recorded no reason this function recognises.", "yaml": None}]


def _policy_step(facts: Facts, report: dict, fields: dict, why: str) -> dict:
    """A MigrationPolicy that applies `fields` to this VMI: the policy in effect, amended (editing it changes
    nothing else's match), else a new one selecting this VMI by a stable label."""
    in_effect = next((p for p in facts.policies if kv.meta(p).get("name") == report["policy"]["name"]), None)
    note = None
    if in_effect is not None:
        name = kv.meta(in_effect)["name"]
        spec = {k: v for k, v in (in_effect.get("spec") or {}).items() if k != "selectors"}
        spec.update(fields)
        spec["selectors"] = (in_effect.get("spec") or {}).get("selectors")
        action = f"amend MigrationPolicy {name} (the policy in effect)"
    else:
        vmi_name = report["vmi"].split("/", 1)[1]
        name = f"{vmi_name}-migration"
        labels = _stable_labels(facts.vmi or {})
        if not labels:
            labels = {"vmevents.io/migration-policy": name}
            note = (f"The VMI has no stable label: label it (and the VM's spec.template.metadata.labels, so a restart "
                    f"keeps it) with vmevents.io/migration-policy={name}.")
        spec = {**fields, "selectors": {"virtualMachineInstanceSelector": labels}}
        action = f"apply MigrationPolicy {name}"
    document = {"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
                "metadata": {"name": name}, "spec": spec}
    return {"action": action, "why": why + (f" {note}" if note else ""),
            "yaml": _yaml(document)}


def _stable_labels(vmi: dict) -> dict:
    labels = {k: v for k, v in (kv.meta(vmi).get("labels") or {}).items() if k not in _VOLATILE_LABELS}
    for key in _NAME_LABELS:
        if key in labels:
            return {key: labels[key]}
    return labels


def _kubevirt_patch(migrations: dict) -> str:
    return _yaml({"spec": {"configuration": {"migrations": migrations}}})


def _yaml(document: Any) -> str:
    """A patch as YAML; PyYAML is imported the first time one is written (an irrelevant event writes none)."""
    import yaml

    return yaml.safe_dump(document, sort_keys=False)

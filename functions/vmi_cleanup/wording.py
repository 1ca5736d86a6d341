"""What people read about a cleanup: the Kubernetes Events' reasons and messages, and the reply's data."""
from __future__ import annotations

from typing import Any

from functions.vmi_cleanup.decide import Action, Verdict
from shared import kubevirt as kv
from shared.finding import Finding

CLEANED_UP = "VMICleanedUp"
# On an act's VMICleanedUp Event: the CloudEvent id of the delivery that reported it, and the reply it answered with.
ACTED_ON = "vmevents.io/cleaned-on-delivery"
REPLY = "vmevents.io/cleaned-reply"
DRY_RUN = "VMICleanupDryRun"
ANNOTATION_INVALID = "VMICleanupAnnotationInvalid"


def is_dry_run(effect: str) -> bool:
    """A dry run's effects are spelt `would-<action>`."""
    return effect.startswith("would-")


def event_message(effect: str, vmi: dict[str, Any], verdict: Verdict) -> str:
    """One sentence per effect; stable for the same effect on the same VMI so Events deduplicate."""
    name = f"{kv.meta(vmi)['namespace']}/{kv.meta(vmi)['name']}"
    if verdict.action is Action.DELETE_VMI:
        done = f"deleted VMI {name}"
    else:
        done = f"halted the VM (runStrategy {verdict.run_strategy} → Halted) so KubeVirt removes VMI {name}"
    said = f"Dry run: would have {done}" if is_dry_run(effect) else done[0].upper() + done[1:]
    return f"{said}, left in phase {kv.phase(vmi)}: {verdict.reason}."


def cleaned_data(effect: str, vmi: dict[str, Any], vm: dict[str, Any] | None, verdict: Verdict) -> dict[str, Any]:
    """The details of an `io.vmevents.vmi-cleanup.cleaned` reply's finding."""
    meta = kv.meta(vmi)
    return {"vmi": f"{meta['namespace']}/{meta['name']}",
            "vm": f"{meta['namespace']}/{kv.meta(vm)['name']}" if vm else None,
            "action": effect, "reason": verdict.reason,
            "previousRunStrategy": verdict.run_strategy, "dryRun": is_dry_run(effect)}


def finding(effect: str, vmi: dict[str, Any], vm: dict[str, Any] | None, verdict: Verdict) -> Finding:
    """What was done, as a finding (docs/findings.md) with no episode: category vmi-cleaned-up, informational."""
    meta = kv.meta(vmi)
    return Finding("vmi-cleanup", "vmi-cleaned-up", kv.api_path(vmi), f"{meta.get('uid')}/{effect}",
                   {"namespace": meta["namespace"], "vm": kv.meta(vm)["name"] if vm else meta["name"]}, "info",
                   event_message(effect, vmi, verdict), details=cleaned_data(effect, vmi, vm, verdict))


def scanned_reason(scanned: int, cleaned: int) -> str:
    return f"scanned {scanned} VMI(s), acted on {cleaned}"


def spared_reason(spared: int) -> str:
    return f"{spared} reported before on the same objects (dry run: not decided again)"

"""migration-report: explain every failed or nearly timed-out live migration with KubeVirt's own numbers.

KubeVirt says little when a live migration fails (harvester#3429, #8539, #8617) and no KubeVirt alert
covers it (FACTS.md §4). This function re-does KubeVirt's arithmetic from the objects — the policy it
chose, the effective configuration, the data size rounded up to decimal GB, the completion budget and
the progress timeout — classifies the failure, advises, and reports once: a Kubernetes Event on the
VMI and its VM, and a reply CloudEvent with the whole report.

Reads top to bottom: settings → KubeVirt's arithmetic (pure, each rule citing its KubeVirt source) →
decide (pure: classify, advise, word it) → parse (which migration an event is about, no API call) →
fetch (fresh reads) → report (Event + reply, once) → the periodic re-scan.

"Once" keeps no memory of its own: the Event this function records on the VMI *is* the record. Before
reporting it looks for its own Event naming the migration's uid; a duplicate or re-scan finds it and
stays quiet. Events expire (kube-apiserver --event-ttl, 1h by default), so only migrations that ended
within MIGRATION_REPORT_WITHIN (default 30m, keep it under the TTL) are considered at all.
"""
from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import yaml

from shared import kubevirt as kv
from shared.errors import TemporaryError
from shared.intake import Incoming, about, may_concern
from shared.kube import EVENT, KUBEVIRT, MIGRATION_POLICY, NAMESPACE, VM, VMI, VMIM
from shared.replies import Reply, reply_type
from shared.runtime import KubeContext, Outcome
from shared.settings import Env, SettingsError, in_scope

FUNCTION = "migration-report"
REASON_FAILED = "MigrationFailed"            # vmevents' own reasons: KubeVirt has none called so (FACTS §4)
REASON_NEAR_TIMEOUT = "MigrationNearTimeout"
VMIM_KIND = "VirtualMachineInstanceMigration"


# -- settings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    warn_ratio: float = 0.8
    within: timedelta = timedelta(minutes=30)
    namespaces: frozenset[str] = frozenset()
    exclude_namespaces: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        env = Env(environ)
        within = env.duration("MIGRATION_REPORT_WITHIN", "30m")
        if within <= timedelta(0):
            raise SettingsError("MIGRATION_REPORT_WITHIN='0s' would report nothing; use a value like 30m "
                                "(below the API server's --event-ttl, 1h by default).")
        return cls(warn_ratio=env.number("MIGRATION_WARN_RATIO", 0.8, minimum=0.01, maximum=1.0),
                   within=within,
                   namespaces=env.names("MIGRATION_NAMESPACES"),
                   exclude_namespaces=env.names("MIGRATION_EXCLUDE_NAMESPACES"))

    def in_scope(self, namespace: str) -> bool:
        return in_scope(namespace, self.namespaces, self.exclude_namespaces)


# -- KubeVirt's arithmetic: resource.Quantity  -----------------------------------------------------------------------------
_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), "": 1,
            "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
GIGA = 10 ** 9


def quantity(text: str | int | None) -> Fraction | None:
    """A Kubernetes quantity ('8Gi', '1948Mi', '2G', '1e9', 64) as an exact number; None when unreadable."""
    if text is None:
        return None
    match = _QUANTITY.match(str(text).strip())
    if not match:
        return None
    try:
        number = Fraction(Decimal(match.group(1)))
    except InvalidOperation:
        return None
    suffix = match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def scaled_giga(value: Fraction) -> int:
    """Quantity.ScaledValue(resource.Giga): rounds UP to whole decimal gigabytes (10^9 bytes)."""
    return math.ceil(value / GIGA)


@dataclass(frozen=True)
class DataSize:
    memory: str | None          # the quantity as written, e.g. "8Gi"
    source: str                 # which field it came from
    bytes: int
    gigabytes: int              # what KubeVirt multiplies completionTimeoutPerGiB by
    block_migration: bool       # ephemeral disks are added too, and the API does not show their size


def data_size(vmi: dict) -> DataSize | None:
    """pkg/virt-launcher/virtwrap/manager.go getVMIMigrationDataSize: resources.requests.memory, overridden
    by memory.guest when set; plus the ephemeral disks for BlockMigration; then ScaledValue(Giga)."""
    domain = ((vmi.get("spec") or {}).get("domain") or {})
    memory, source = ((domain.get("resources") or {}).get("requests") or {}).get("memory"), \
        "spec.domain.resources.requests.memory"
    guest = (domain.get("memory") or {}).get("guest")
    if guest is not None:
        memory, source = guest, "spec.domain.memory.guest"
    value = quantity(memory)
    if value is None:
        return None
    block = (vmi.get("status") or {}).get("migrationMethod") == "BlockMigration"
    return DataSize(str(memory), source, math.ceil(value), scaled_giga(value), block)


# -- defaults (pkg/virt-config/virt-config.go) -----------------------------------------------------
COMPLETION_PER_GIB_OLD = 800   # up to v1.3.x
COMPLETION_PER_GIB_NEW = 150   # from v1.4.0
NEW_DEFAULTS_FROM = (1, 4, 0)


def defaults(version: tuple[int, int, int] | None) -> dict:
    """KubeVirt's MigrationConfiguration defaults for that version. An unknown version gets the current ones."""
    per_gib = COMPLETION_PER_GIB_OLD if version is not None and version < NEW_DEFAULTS_FROM else COMPLETION_PER_GIB_NEW
    return {"completionTimeoutPerGiB": per_gib, "progressTimeout": 150, "bandwidthPerMigration": "0",
            "allowAutoConverge": False, "allowPostCopy": False, "allowWorkloadDisruption": False,
            "network": None}


# -- MigrationPolicy matching (pkg/virt-controller/watch/migration/migrationpolicy.go) -------------
@dataclass(frozen=True)
class PolicyMatch:
    policy: dict | None
    how: str                     # "recorded" | "matched" | "none"
    ties: tuple[str, ...] = ()   # every policy name with the winning score (the first by name wins)
    score: tuple[int, int] = (0, 0)  # (matching VMI labels, matching namespace labels)
    name: str | None = None      # a recorded name whose policy is gone


def _count(policy: dict, vmi_labels: dict | None, ns_labels: dict | None) -> tuple[int, int] | None:
    """countMatchingLabels: None when the policy does not match. Quirks kept: a policy without selectors
    never matches; a selector is only checked when the VMI *has labels* (the namespace one too: it tests
    vmiLabels, not namespaceLabels), so an unlabelled VMI is matched by every policy with selectors."""
    selectors = (policy.get("spec") or {}).get("selectors")
    if selectors is None:
        return None
    vmi_count = ns_count = 0
    vmi_selector, ns_selector = selectors.get("virtualMachineInstanceSelector"), selectors.get("namespaceSelector")
    if vmi_selector is not None and vmi_labels is not None:
        for key, value in vmi_selector.items():
            if (vmi_labels or {}).get(key) != value:
                return None
            vmi_count += 1
    if ns_selector is not None and vmi_labels is not None:
        for key, value in ns_selector.items():
            if (ns_labels or {}).get(key) != value:
                return None
            ns_count += 1
    return vmi_count, ns_count


def _greater(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """migrationPolicyMatchScore.greaterThan: more labels in total; on a tie, more VMI labels."""
    if sum(a) == sum(b):
        return a[0] > b[0]
    return sum(a) > sum(b)


def match_policy(policies: list[dict], vmi_labels: dict | None, ns_labels: dict | None) -> PolicyMatch:
    best, matching = (0, 0), []
    for policy in policies:
        score = _count(policy, vmi_labels, ns_labels)
        if score is None or (score != best and not _greater(score, best)):
            continue
        if _greater(score, best):
            best, matching = score, [policy]
        else:
            matching.append(policy)
    if not matching:
        return PolicyMatch(None, "none (no policy matches)")
    chosen = min(matching, key=lambda p: p["metadata"]["name"])
    return PolicyMatch(chosen, "matched", tuple(sorted(p["metadata"]["name"] for p in matching)), best)


# -- the effective configuration, field by field ---------------------------------------------------
POLICY_FIELDS = ("allowAutoConverge", "bandwidthPerMigration", "completionTimeoutPerGiB", "allowPostCopy",
                 "allowWorkloadDisruption")
FIELDS = ("completionTimeoutPerGiB", "progressTimeout", "bandwidthPerMigration", "allowAutoConverge",
          "allowPostCopy", "allowWorkloadDisruption", "network")


def effective_configuration(policy: dict | None, cluster: dict, version: tuple[int, int, int] | None,
                            recorded: dict | None) -> dict:
    """{field: {"value", "source"}}: the policy's field (migrationpolicy.go applyMigrationPolicySpec), else the
    KubeVirt CR's spec.configuration.migrations, else the version's default. What KubeVirt recorded in
    migrationState.migrationConfiguration, when present, is what it really used and wins."""
    base = defaults(version)
    spec = (policy or {}).get("spec") or {}
    name = (policy or {}).get("metadata", {}).get("name")
    result = {}
    for key in FIELDS:
        if key in POLICY_FIELDS and spec.get(key) is not None:
            value, source = spec[key], f"MigrationPolicy {name}"
        elif key == "allowWorkloadDisruption" and spec.get("allowPostCopy") is not None:
            # "if the policy specifies AllowPostCopy but not AllowWorkloadDisruption, it follows AllowPostCopy"
            value, source = spec["allowPostCopy"], f"MigrationPolicy {name} (follows allowPostCopy)"
        elif cluster.get(key) is not None:
            value, source = cluster[key], "the KubeVirt CR (spec.configuration.migrations)"
        else:
            value, source = base[key], f"KubeVirt {_dotted(version)}'s default" if version else "the default"
        if recorded and recorded.get(key) is not None and recorded[key] != value:
            value, source = recorded[key], "migrationState.migrationConfiguration (what KubeVirt used)"
        result[key] = {"value": value, "source": source}
    return result


def _dotted(version: tuple[int, int, int] | None) -> str:
    return "v" + ".".join(map(str, version)) if version else "unknown"


# -- failureReason wording (pkg/virt-launcher/virtwrap/live-migration-source.go) -------------------
_STUCK = re.compile(r"Live migration stuck for (\d+) seconds and has been aborted")
_NOT_COMPLETED = re.compile(r"Live migration is not completed after (\d+) seconds and has been aborted")
_ABORTED_19 = "live migration has been aborted"     # ≥ v1.9: both timeouts and a requested abort
_ABORTED_OLD = "live migration aborted"             # ≤ v1.8: libvirt job cancelled ("Live migration aborted ")
_STALL_DETECTOR = "migration aborted:"              # the experimental stall detector's own abort


@dataclass(frozen=True)
class FailureText:
    kind: str                 # "progress-stall" | "completion-timeout" | "aborted-or-timeout" | "aborted" | "libvirt-error"
    seconds: int | None = None


def read_failure_reason(text: str) -> FailureText:
    """≤ v1.8: "stuck for N seconds" (progress timeout), "not completed after N seconds" (completion
    timeout, N = the budget), "Live migration aborted " (cancelled), anything else = libvirt's error.
    ≥ v1.9: both timeouts and an abort read "Live migration has been aborted"."""
    if match := _STUCK.search(text):
        return FailureText("progress-stall", int(match.group(1)))
    if match := _NOT_COMPLETED.search(text):
        return FailureText("completion-timeout", int(match.group(1)))
    lowered = text.strip().lower()
    if lowered.startswith(_ABORTED_19):
        return FailureText("aborted-or-timeout")
    if lowered.startswith(_STALL_DETECTOR):
        return FailureText("progress-stall")
    if lowered == _ABORTED_OLD:
        return FailureText("aborted")
    return FailureText("libvirt-error")


# -- decide (pure) --------------------------------------------------------------------------------
class Action(str, enum.Enum):
    SKIP = "skip"          # not final, out of scope, too old, or a success well inside its budget
    REPORT = "report"


CLASSES = ("completion-timeout", "progress-stall", "target-unschedulable", "target-pod-removed", "vmi-shutdown",
           "aborted", "libvirt-error", "unknown")


@dataclass(frozen=True)
class Facts:
    """What the cluster keeps about one migration, read fresh."""

    vmim: dict
    vmi: dict | None = None          # None when gone, or a newer VMI of the same name (a restart since)
    vm: dict | None = None
    kubevirt: dict | None = None     # the KubeVirt CR
    policies: tuple[dict, ...] = ()
    namespace: dict | None = None
    events: tuple[dict, ...] = ()    # KubeVirt's Events on the VMIM and VMI, the scheduler's on target pods


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    kind: str | None = None          # "failed" | "near-timeout"
    message: str | None = None       # the Event's one sentence
    report: dict = field(default_factory=dict)


def precheck(vmim: dict, settings: Settings, now: datetime) -> str | None:
    """Why this VMIM needs no closer look (no API call needed to say so), or None."""
    meta, phase = kv.meta(vmim), kv.phase(vmim)
    if not settings.in_scope(meta.get("namespace", "")):
        return f"namespace {meta.get('namespace')} is out of scope"
    if phase not in kv.FINAL_PHASES:
        return f"phase is {phase or 'unset'}, not final yet"
    ended = finished_at(vmim)
    if ended is not None and now - ended > settings.within:
        return (f"ended at {ended:%Y-%m-%dT%H:%M:%SZ}, more than MIGRATION_REPORT_WITHIN="
                f"{_span(settings.within)} ago (its report, if any, may have expired with its Event)")
    return None


def decide(facts: Facts, settings: Settings, now: datetime) -> Decision:
    """Report this migration or not, and what to say. Pure: every fact is an argument."""
    skip = precheck(facts.vmim, settings, now)
    if skip:
        return Decision(Action.SKIP, skip)
    report = analyse(facts)
    if kv.phase(facts.vmim) == "Succeeded":
        used = report["budget"]["usedRatio"]
        if used is None:
            return Decision(Action.SKIP, "succeeded; its completion budget is unknown (no memory size)", report=report)
        if used < settings.warn_ratio:
            return Decision(Action.SKIP, f"succeeded in {report['timing']['tookSeconds']} s, {used:.0%} of its "
                                         f"{report['budget']['completionTimeoutSeconds']} s budget "
                                         f"(under MIGRATION_WARN_RATIO={settings.warn_ratio:g})", report=report)
        report["class"] = "near-timeout"
        report["advice"] = advise("completion-timeout", report, facts)
        kind = "near-timeout"
    else:
        report["advice"] = advise(report["class"], report, facts)
        kind = "failed"
    report["message"] = event_message(report, settings)
    return Decision(Action.REPORT, f"{kind}: {report['class']}", kind=kind, message=report["message"], report=report)


def finished_at(vmim: dict) -> datetime | None:
    phase = kv.phase(vmim)
    return kv.phase_since(vmim, phase) or kv.parse_time(migration_state(vmim, None).get("endTimestamp"))


def migration_state(vmim: dict, vmi: dict | None) -> dict:
    """The VMI's migrationState if it is this migration's, overlaid by the VMIM's copy (written once final,
    pkg/virt-controller/watch/migration/migration.go): the VMIM's survives the next migration."""
    vmi_state = ((vmi or {}).get("status") or {}).get("migrationState") or {}
    if vmi_state.get("migrationUid") != kv.meta(vmim).get("uid"):
        vmi_state = {}
    return {**vmi_state, **((vmim.get("status") or {}).get("migrationState") or {})}


def analyse(facts: Facts) -> dict:
    """Every number KubeVirt used for this migration, with where it came from, and the failure's class."""
    vmim, vmi = facts.vmim, facts.vmi
    meta = kv.meta(vmim)
    state = migration_state(vmim, vmi)
    version_text = ((facts.kubevirt or {}).get("status") or {}).get("observedKubeVirtVersion")
    version = kv.parse_version(version_text)
    match = _policy(facts, state)
    cluster = (((facts.kubevirt or {}).get("spec") or {}).get("configuration") or {}).get("migrations") or {}
    config = effective_configuration(match.policy, cluster, version, state.get("migrationConfiguration"))
    size = data_size(vmi) if vmi is not None else (_vm_as_vmi(facts.vm) and data_size(_vm_as_vmi(facts.vm)))
    per_gib = int(config["completionTimeoutPerGiB"]["value"])
    budget = per_gib * size.gigabytes if size else None
    started, ended, took = _timing(vmim, state)
    failure, failure_source = _failure_reason(state, facts)
    report = {
        "migration": f"{meta.get('namespace')}/{meta.get('name')}", "uid": meta.get("uid"),
        "vmi": f"{meta.get('namespace')}/{(vmim.get('spec') or {}).get('vmiName')}",
        "vm": f"{meta.get('namespace')}/{kv.meta(facts.vm)['name']}" if facts.vm else None,
        "phase": kv.phase(vmim), "kubevirtVersion": version_text,
        "sourceNode": state.get("sourceNode"), "targetNode": state.get("targetNode"),
        "mode": state.get("mode"), "migrationMethod": ((vmi or {}).get("status") or {}).get("migrationMethod"),
        "failureReason": failure, "failureReasonSource": failure_source,
        "policy": {"name": (kv.meta(match.policy).get("name") if match.policy else match.name),
                   "how": match.how, "ties": list(match.ties)},
        "configuration": config,
        "dataSize": _size_dict(size),
        "timing": {"started": started and _stamp(started), "ended": ended and _stamp(ended), "tookSeconds": took},
        "budget": {"completionTimeoutPerGiB": per_gib, "completionTimeoutSeconds": budget,
                   "progressTimeoutSeconds": int(config["progressTimeout"]["value"]),
                   "usedRatio": round(took / budget, 3) if took is not None and budget else None},
        "kubevirtEvents": [{"object": e["involvedObject"].get("kind"), "reason": e.get("reason"),
                            "message": e.get("message")} for e in facts.events],
    }
    if kv.phase(vmim) == "Failed":
        report["class"], report["detail"], report["kubevirtSeconds"] = classify(report, facts, state)
    return report


def _policy(facts: Facts, state: dict) -> PolicyMatch:
    recorded = state.get("migrationPolicyName")
    if recorded:
        policy = next((p for p in facts.policies if kv.meta(p).get("name") == recorded), None)
        return PolicyMatch(policy, "recorded" if policy else "recorded (deleted since)", name=recorded)
    if state.get("migrationConfiguration") is not None:
        return PolicyMatch(None, "none (KubeVirt recorded no policy)")
    labels = kv.meta(facts.vmi).get("labels") if facts.vmi else None
    ns_labels = kv.meta(facts.namespace).get("labels") if facts.namespace else None
    return match_policy(list(facts.policies), labels or None, ns_labels or {})


def _vm_as_vmi(vm: dict | None) -> dict | None:
    """No VMI left: the VM's template is what the VMI was made from."""
    template = ((vm or {}).get("spec") or {}).get("template")
    return {"spec": template.get("spec") or {}, "status": {}} if template else None


def _size_dict(size: DataSize | None) -> dict | None:
    if size is None:
        return None
    return {"memory": size.memory, "from": size.source, "bytes": size.bytes, "gigabytes": size.gigabytes,
            "blockMigration": size.block_migration,
            "note": ("BlockMigration: KubeVirt adds the ephemeral disks' size, which the API does not show; "
                     "the real budget is at least this") if size.block_migration else None}


def _timing(vmim: dict, state: dict) -> tuple[datetime | None, datetime | None, int | None]:
    started = kv.parse_time(state.get("startTimestamp")) or kv.phase_since(vmim, "Running")
    ended = kv.parse_time(state.get("endTimestamp")) or finished_at(vmim)
    took = int((ended - started).total_seconds()) if started and ended else None
    return started, ended, took


_MIGRATED = re.compile(r"migration uid (\S+) failed\. reason:\s*(.*)$", re.S)


def _failure_reason(state: dict, facts: Facts) -> tuple[str | None, str | None]:
    """migrationState.failureReason (KubeVirt ≥ 1.3), else the reason in KubeVirt's own Event on the VMI:
    "VirtualMachineInstance migration uid X failed. reason:<failureReason>" (every version)."""
    if state.get("failureReason"):
        return state["failureReason"], "migrationState.failureReason"
    uid = kv.meta(facts.vmim).get("uid")
    for event in facts.events:
        match = _MIGRATED.search(event.get("message") or "")
        if match and match.group(1) == uid and match.group(2).strip():
            return match.group(2).strip(), f"KubeVirt Event {event.get('reason')} on the VMI"
    return None, None


def _abort_requested(vmim: dict, state: dict) -> bool:
    conditions = (vmim.get("status") or {}).get("conditions") or ()
    return bool(state.get("abortRequested") or kv.meta(vmim).get("deletionTimestamp")
                or any(c.get("type") == "AbortRequested" and c.get("status") == "True" for c in conditions))


def classify(report: dict, facts: Facts, state: dict) -> tuple[str, str, int | None]:
    """(class, detail, the seconds KubeVirt's own message names)."""
    text = report["failureReason"]
    took, budget = report["timing"]["tookSeconds"], report["budget"]["completionTimeoutSeconds"]
    if text:
        read = read_failure_reason(text)
        if read.kind == "aborted-or-timeout":  # ≥ v1.9: one wording for both timeouts and an abort
            if _abort_requested(facts.vmim, state):
                return "aborted", "an abort was requested (VMIM deleted or AbortRequested)", None
            if took is not None and budget and took >= budget - 2:
                return "completion-timeout", f"ran {took} s, the budget is {budget} s", None
            return "progress-stall", "aborted before its completion budget ran out: the progress timeout", None
        if read.kind == "aborted" or "target pod is down" in text:
            if "target pod is down" in text:
                return "target-pod-removed", text, None
            return "aborted", "the libvirt job was cancelled (an abort was requested)", None
        detail = text if read.kind == "libvirt-error" else text.strip()
        return read.kind, detail, read.seconds
    messages = [(e.get("reason") or "", e.get("message") or "") for e in facts.events
                if (e.get("involvedObject") or {}).get("kind") == VMIM_KIND]
    if any(reason == "migrationTargetPodUnschedulable" for reason, _ in messages):
        scheduler = _scheduler_message(facts.events)
        return "target-unschedulable", scheduler or "the target pod stayed unschedulable", None
    if any("vmi shutdown" in m or "vmi does not exist" in m for _, m in messages) or facts.vmi is None \
            or kv.phase(facts.vmi) in kv.FINAL_PHASES:
        return "vmi-shutdown", "the VMI stopped (or was deleted) while it was migrating", None
    if any("target pod" in m and ("removed" in m or "shutdown" in m) for _, m in messages):
        return "target-pod-removed", next(m for _, m in messages if "target pod" in m), None
    if _abort_requested(facts.vmim, state):
        return "aborted", "an abort was requested (VMIM deleted or AbortRequested)", None
    return "unknown", "KubeVirt recorded no failureReason and no Event that explains it", None


def _scheduler_message(events: tuple[dict, ...]) -> str | None:
    failed = [e for e in events if e.get("reason") == "FailedScheduling" and e.get("message")]
    failed.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return failed[-1]["message"] if failed else None


# -- advice ---------------------------------------------------------------------------------------
_VOLATILE_LABELS = ("kubevirt.io/nodeName", "kubevirt.io/migrationTargetNodeName", "kubevirt.io/outdatedLauncherImage",
                    "kubevirt.io/created-by", "kubevirt.io/schedulable")
_NAME_LABELS = ("harvesterhci.io/vmName", "vm.kubevirt.io/name", "kubevirt.io/vm")


def advise(klass: str, report: dict, facts: Facts) -> list[dict]:
    """Concrete next steps from the class and the numbers; a ready-to-apply policy where one is the advice."""
    per_gib, config = report["budget"]["completionTimeoutPerGiB"], report["configuration"]
    if klass == "completion-timeout":
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
    if klass == "progress-stall":
        bandwidth = config["bandwidthPerMigration"]["value"]
        limited = (quantity(bandwidth) or 0) > 0
        steps = []
        if limited:
            steps.append(_policy_step(facts, report, {"bandwidthPerMigration": "0"},
                                      f"bandwidthPerMigration is {bandwidth}/s ({config['bandwidthPerMigration']['source']}): "
                                      f"lift the limit (0 = unlimited) or raise it."))
        network = config["network"]["value"]
        where = (f"Migrations use network {network}: check that link." if network else
                 "Migrations share the pod network: set spec.configuration.migrations.network to a "
                 "NetworkAttachmentDefinition on a dedicated link (Harvester: the vm-migration-network setting).")
        steps.append({"action": "check the migration network" if network else "use a dedicated migration network",
                      "why": (f"No data moved for {report['budget']['progressTimeoutSeconds']} s between "
                              f"{report['sourceNode'] or 'the source'} and {report['targetNode'] or 'the target'}. "
                              f"{where} A slow but working link can also get a larger progressTimeout "
                              f"(KubeVirt CR only; policies cannot set it)."),
                      "yaml": None if network else _kubevirt_patch({"network": "<namespace/network-attachment-definition>"})})
        return steps
    if klass == "target-unschedulable":
        return [{"action": "make room for the target pod",
                 "why": f"The scheduler said: {report['detail']} Free the resource it names on another node, or relax "
                        f"the VM's nodeSelector/affinity; host devices and host-model CPUs also limit the targets.",
                 "yaml": None}]
    if klass == "target-pod-removed":
        return [{"action": "look at the target node",
                 "why": f"The target virt-launcher pod went away mid-migration ({report['detail']}): eviction, OOM or "
                        f"a node problem on {report['targetNode'] or 'the target node'}; retry once it is healthy.",
                 "yaml": None}]
    if klass == "vmi-shutdown":
        return [{"action": "nothing to tune", "why": "The guest stopped during the migration; start it again if "
                                                     "that was not intended.", "yaml": None}]
    if klass == "aborted":
        return [{"action": "nothing to tune", "why": "Someone cancelled it (the VMIM was deleted or "
                                                     "`virtctl migrate-cancel`); migrate again when ready.", "yaml": None}]
    if klass == "libvirt-error":
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
            "yaml": yaml.safe_dump(document, sort_keys=False)}


def _stable_labels(vmi: dict) -> dict:
    labels = {k: v for k, v in (kv.meta(vmi).get("labels") or {}).items() if k not in _VOLATILE_LABELS}
    for key in _NAME_LABELS:
        if key in labels:
            return {key: labels[key]}
    return labels


def _kubevirt_patch(migrations: dict) -> str:
    return yaml.safe_dump({"spec": {"configuration": {"migrations": migrations}}}, sort_keys=False)


# -- the one sentence -----------------------------------------------------------------------------
def event_message(report: dict, settings: Settings) -> str:
    """One sentence with the numbers; the migration's uid in it is how a later look finds this report."""
    name = report["migration"].split("/", 1)[1]
    head = f"Live migration {name} (uid {report['uid']}) of VMI {report['vmi']}"
    took = report["timing"]["tookSeconds"]
    ran = f"it ran {took} s of" if took is not None else "it never started copying, with"
    numbers = (f"{ran} {_budget_phrase(report)}, "
               f"progress timeout {report['budget']['progressTimeoutSeconds']} s{_policy_phrase(report)}")
    if report["class"] == "near-timeout":
        return (f"{head} succeeded but used {report['budget']['usedRatio']:.0%} of its completion budget "
                f"(warning from {settings.warn_ratio:.0%}): {numbers}.")
    return f"{head} failed ({report['class']}: {_class_phrase(report)}): {numbers}."


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


def _class_phrase(report: dict) -> str:
    klass, seconds = report["class"], report.get("kubevirtSeconds")
    if klass == "completion-timeout":
        said = f" after {seconds} s" if seconds is not None else ""
        return f"KubeVirt aborted it{said}, its completion budget used up"
    if klass == "progress-stall":
        said = seconds if seconds is not None else report["budget"]["progressTimeoutSeconds"]
        return f"no data moved for {said} s, so KubeVirt aborted it"
    return {"target-unschedulable": f"the target pod could not be scheduled: {report['detail']}",
            "target-pod-removed": "the target pod was removed during the migration",
            "vmi-shutdown": "the VMI stopped during the migration",
            "aborted": "it was cancelled on request",
            "libvirt-error": f"libvirt error: {report['detail']}",
            "unknown": "KubeVirt recorded no reason"}[klass].rstrip(".")


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


# -- parse: which migration is this event about? (no API calls) -----------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    name: str


def target(event: Incoming, settings: Settings) -> Target | None:
    """The VMIM worth a fresh look, or None when the event cannot concern a report."""
    found = about(event, (VMIM_KIND,), FUNCTION)
    if found.deleted or not settings.in_scope(found.ref.namespace):
        return None
    if found.obj is not None and kv.phase(found.obj) not in kv.FINAL_PHASES:
        return None
    return Target(found.ref.namespace, found.ref.name)


_FINAL_TOKENS = (b'"Failed"', b'"Succeeded"')


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode VMIM event whose JSON names no final phase anywhere is a migration still under way:
    answered without decoding it. It can only err towards decoding; the re-scan catches anything missed."""
    return may_concern(headers, body, (VMIM_KIND,), _FINAL_TOKENS)


# -- fetch, decide, report ------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext) -> Outcome:
    if event.family == "ping":
        return rescan(ctx)
    found = target(event, ctx.settings)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    vmim = ctx.kube.get(VMIM, found.namespace, found.name)
    if vmim is None:
        return Outcome("gone", subject=event.subject, reason="the migration no longer exists")
    return converge(vmim, ctx)


def converge(vmim: dict, ctx: KubeContext) -> Outcome:
    subject = kv.api_path(vmim)
    skip = precheck(vmim, ctx.settings, ctx.clock())
    if skip:
        return Outcome("skip", subject=subject, reason=skip)
    vmi, vm = read_vmi_and_vm(vmim, ctx)
    recipients = [obj for obj in (vmi, vm) if obj is not None] or [vmim]
    if already_reported(ctx, recipients[0], vmim):
        return Outcome("skip", subject=subject, reason="already reported")
    decision = decide(gather(vmim, vmi, vm, ctx), ctx.settings, ctx.clock())
    if decision.action is Action.SKIP:
        return Outcome("skip", subject=subject, reason=decision.reason)
    return report(decision, recipients, vmim, ctx)


def read_vmi_and_vm(vmim: dict, ctx: KubeContext) -> tuple[dict | None, dict | None]:
    """The migrated VMI (None when gone, or when it is a newer VMI of the same name: a restart since) and its VM."""
    namespace, vmi_name = kv.meta(vmim)["namespace"], (vmim.get("spec") or {}).get("vmiName") or ""
    if not vmi_name:
        return None, None
    vmi = ctx.kube.get(VMI, namespace, vmi_name)
    if vmi is not None and _newer(vmi, vmim):
        vmi = None
    owner = kv.controller_owner(vmi, "VirtualMachine") if vmi is not None else None
    if vmi is not None and owner is None:
        return vmi, None  # a standalone VMI
    return vmi, ctx.kube.get(VM, namespace, owner["name"] if owner else vmi_name)


def gather(vmim: dict, vmi: dict | None, vm: dict | None, ctx: KubeContext) -> Facts:
    """Fresh reads of everything else KubeVirt used for this migration."""
    kubevirt = next(iter(ctx.kube.list(KUBEVIRT)), None)
    policies = tuple(ctx.kube.list(MIGRATION_POLICY))
    state = migration_state(vmim, vmi)
    needs_match = policies and not state.get("migrationPolicyName") and state.get("migrationConfiguration") is None
    ns = ctx.kube.get(NAMESPACE, None, kv.meta(vmim)["namespace"]) \
        if needs_match and vmi is not None and kv.meta(vmi).get("labels") else None
    events = _kubevirt_events(ctx, vmim, vmi, state) if kv.phase(vmim) == "Failed" else ()
    return Facts(vmim, vmi, vm, kubevirt, policies, ns, events)


def _newer(vmi: dict, vmim: dict) -> bool:
    created, asked = kv.parse_time(kv.meta(vmi).get("creationTimestamp")), \
        kv.parse_time(kv.meta(vmim).get("creationTimestamp"))
    return bool(created and asked and created > asked)


def _kubevirt_events(ctx: KubeContext, vmim: dict, vmi: dict | None, state: dict) -> tuple[dict, ...]:
    """KubeVirt's own Events, read only when migrationState has no failureReason (KubeVirt < 1.3, or a
    failure the controller saw rather than libvirt): on the VMIM, on the VMI, and the scheduler's on the
    target pods when KubeVirt said the target was unschedulable."""
    if state.get("failureReason"):
        return ()
    namespace = kv.meta(vmim)["namespace"]
    found = list(ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.uid={kv.meta(vmim)['uid']}"))
    if vmi is not None:
        found += ctx.kube.list(EVENT, namespace, field_selector=f"involvedObject.uid={kv.meta(vmi)['uid']}")
    if any(e.get("reason") == "migrationTargetPodUnschedulable" for e in found):
        prefix = f"virt-launcher-{(vmim.get('spec') or {}).get('vmiName')}-"
        source_pod = state.get("sourcePod")
        found += [e for e in ctx.kube.list(EVENT, namespace, field_selector="reason=FailedScheduling,involvedObject.kind=Pod")
                  if e["involvedObject"].get("name", "").startswith(prefix) and e["involvedObject"]["name"] != source_pod]
    return tuple(e for e in found if (e.get("source") or {}).get("component") != FUNCTION)


def already_reported(ctx: KubeContext, recipient: dict, vmim: dict) -> bool:
    """Our own Event on the first recipient names this migration's uid: it was reported. (A Failed
    migration is only ever reported as MigrationFailed, a Succeeded one as MigrationNearTimeout.)"""
    meta = kv.meta(recipient)
    reason = REASON_FAILED if kv.phase(vmim) == "Failed" else REASON_NEAR_TIMEOUT
    events = ctx.kube.list(EVENT, meta.get("namespace") or "default",
                           field_selector=f"involvedObject.uid={meta.get('uid')},reason={reason}")
    uid = f"(uid {kv.meta(vmim)['uid']})"
    return any((e.get("source") or {}).get("component") == FUNCTION and uid in (e.get("message") or "")
               for e in events)


def report(decision: Decision, recipients: list[dict], vmim: dict, ctx: KubeContext) -> Outcome:
    reason = REASON_FAILED if decision.kind == "failed" else REASON_NEAR_TIMEOUT
    for obj in recipients:
        ctx.recorder.record(obj, "Warning", reason, decision.message, ctx.clock())
    data = dict(decision.report)
    reply = Reply(reply_type(FUNCTION, decision.kind), kv.api_path(vmim), data,
                  key=f"{kv.meta(vmim)['uid']}/{decision.kind}")
    return Outcome(f"report-{decision.kind}", effect=f"reported-{decision.report['class']}",
                   subject=kv.api_path(vmim), reason=decision.message, reply=reply)


# -- the periodic re-scan -------------------------------------------------------------------------
def rescan(ctx: KubeContext) -> Outcome:
    """Every VMIM, page by page: a final one missed by its events is reported now (once)."""
    reported, failures, scanned = [], [], 0
    now = ctx.clock()
    for namespace in sorted(ctx.settings.namespaces) or [None]:
        for vmim in ctx.kube.list(VMIM, namespace):
            scanned += 1
            if precheck(vmim, ctx.settings, now):
                continue
            try:
                outcome = converge(vmim, ctx)
            except TemporaryError as exc:
                failures.append(exc)
                continue
            if outcome.reply is not None:
                reported.append({"type": outcome.reply.type, **outcome.reply.data})
    if failures:
        raise TemporaryError(f"re-scan could not finish {len(failures)} migration(s): {failures[0].message}")
    reason = f"scanned {scanned} migration(s), reported {len(reported)}"
    if not reported:
        return Outcome("rescan", reason=reason)
    reply = Reply(reply_type(FUNCTION, "scanned"), "/vmevents/migration-report/rescan",
                  {"scanned": scanned, "reported": reported}, key="|".join(sorted(r["uid"] for r in reported)))
    return Outcome("rescan", effect=f"reported-{len(reported)}", reason=reason, reply=reply)

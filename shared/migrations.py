"""KubeVirt's own arithmetic for a live migration, redone from the objects, each rule citing its KubeVirt source.

Pure: quantities, the data size and its rounding, the per-version defaults, MigrationPolicy matching, the
effective configuration field by field, and what KubeVirt's failureReason wording says (docs/facts.md §4).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

# -- resource.Quantity (k8s.io/apimachinery/pkg/api/resource) -----------------------------------------
_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10 ** 3), "M": Fraction(10 ** 6), "G": Fraction(10 ** 9), "T": Fraction(10 ** 12),
            "P": Fraction(10 ** 15), "E": Fraction(10 ** 18)}
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
    exponent = int(suffix[1:])  # "e3", "E-2": a decimal exponent
    return number * (Fraction(10 ** exponent) if exponent >= 0 else Fraction(1, 10 ** -exponent))


def scaled_giga(value: Fraction) -> int:
    """Quantity.ScaledValue(resource.Giga): rounds UP to whole decimal gigabytes (10^9 bytes)."""
    return math.ceil(value / GIGA)


# -- the data size (pkg/virt-launcher/virtwrap/manager.go getVMIMigrationDataSize) ----------------------
@dataclass(frozen=True)
class DataSize:
    memory: str | None          # the quantity as written, e.g. "8Gi"
    source: str                 # which field it came from
    bytes: int
    gigabytes: int              # what KubeVirt multiplies completionTimeoutPerGiB by
    block_migration: bool       # ephemeral disks are added too, and the API does not show their size


def data_size(vmi: dict) -> DataSize | None:
    """resources.requests.memory, overridden by memory.guest when set; plus the ephemeral disks for
    BlockMigration; then ScaledValue(Giga)."""
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
    # "progress-stall" | "completion-timeout" | "aborted-or-timeout" | "aborted" | "libvirt-error"
    category: str
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

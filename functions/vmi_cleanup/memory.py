"""A dry run's memory between ticks, kept in the cluster: what each VMICleanupDryRun Event last reported about.

A dry run changes nothing, so a due VMI stays due and every tick used to decide it again from scratch: read the
VMI and its VM in full, the KubeVirt version and the VMI's migrations, then count its Event again (issue 25: at
10,000 VMs with 50 due, 316 requests a tick where an acting install's steady tick makes 16). The function is
stateless (it may scale to zero), so the memory lives on the Event itself: each dry-run report writes, in the
annotation `vmevents.io/dry-run-of`, the **basis** of its verdict: the VMI (uid and resourceVersion), its VM (uid
and resourceVersion, or none), the settings the decision reads (a digest) and the KubeVirt version it read.

A re-scan of a dry-run install lists those Events once (one cached LIST, or one per namespace of
CLEANUP_NAMESPACES), and for a candidate that has one renewed within RENEW_AFTER it reads the VMI's and the VM's
metadata only, from the watch cache (PartialObjectMetadata: no spec, no status); when both versions, the settings
and the KubeVirt version are those of the basis, the verdict would be the one already reported, and the
candidate costs nothing more: no full read, no decision, no Event write, nothing in the reply. Why nothing is
missed:
- The verdict is a function of the VMI, the VM, the settings, the KubeVirt version, the migrations and the
  clock (decide.py). Any write to the VMI or the VM changes its resourceVersion (an opt-out annotation, a new run
  strategy, a state change request, a VM deleted and created again: a new uid), so the next tick sees a
  different version and decides again in full: within one tick of the change.
- The clock: a reported verdict is one that acts (delete or halt), reached only past the due time; time only
  moves further past it, and decide.py's verdicts past due do not depend on how far (RerunOnFailure's grace is
  a LEAVE before it ends, never reported, so such a VMI has no basis and is decided in full every tick).
- Migrations: a VMI in a final phase cannot be migrated (KubeVirt refuses a migration of a VMI that is not
  running), and its own migration state is in the VMI (its resourceVersion).
- Renewal: an Event not counted again would expire with the API server's --event-ttl (1 h by default). A basis
  older than RENEW_AFTER (shared.ledger' 15 min) is not trusted: that candidate is decided in full and its
  Event counted again, which renews it, so it is rewritten at most ~16 min apart.
- An Event deleted, or a basis that does not parse: the candidate is decided in full and reported again.
The act path never uses it: an acting install reads fresh and acts with preconditions, as before.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.vmi_cleanup import wording
from functions.vmi_cleanup.settings import FUNCTION, Settings
from shared import kubevirt as kv
from shared import rescan as rescans
from shared.kinds import EVENT, VM, VMI
from shared.ledger import DEFAULT_RENEW_AFTER

BASIS = "vmevents.io/dry-run-of"
RENEW_AFTER: timedelta = DEFAULT_RENEW_AFTER

Version = tuple[int, int, int]


def settings_digest(settings: Settings) -> str:
    """The settings a verdict reads (not dry_run itself, nor the re-scan's budget), as a short digest."""
    read = (settings.cleanup_after.total_seconds(), settings.cleanup_failed, sorted(settings.namespaces),
            sorted(settings.exclude_namespaces))
    return hashlib.sha256(repr(read).encode()).hexdigest()[:12]


def _version_of(obj: dict[str, Any] | None) -> str:
    if obj is None:
        return ""
    meta = kv.meta(obj)
    return f"{meta.get('uid', '')}/{meta.get('resourceVersion', '')}"


@dataclass(frozen=True)
class Basis:
    """What one dry-run verdict was decided on."""

    vmi: str        # namespace/name
    vmi_at: str     # uid/resourceVersion
    vm_at: str      # uid/resourceVersion, "" when the VMI has no VM (standalone, or its VM is gone)
    settings: str   # settings_digest
    kubevirt: str   # the KubeVirt version read ("" when none was)

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Basis | None:
        try:
            found = json.loads(text)
            return cls(**{k: str(found[k]) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None


def basis(vmi: dict[str, Any], vm: dict[str, Any] | None, settings: Settings, version: Version | None) -> Basis:
    meta = kv.meta(vmi)
    return Basis(f"{meta['namespace']}/{meta['name']}", _version_of(vmi), _version_of(vm), settings_digest(settings),
                 _dotted(version))


def _dotted(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else ""


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


@dataclass
class Memory:
    """The bases on record for one tick, by VMI (namespace/name), and how many candidates they spared."""

    bases: dict[str, list[tuple[Basis, datetime]]] = field(default_factory=dict)
    spared: int = 0
    _version: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def unchanged(self, kube: Any, namespace: str, name: str, settings: Settings, now: datetime,
                  kubevirt_version: Callable[[], Version | None]) -> bool:
        """Whether this candidate's verdict was reported on exactly its objects' current versions, recently enough:
        two metadata GETs from the watch cache (the VMI's, its VM's) and, once a tick, the KubeVirt version."""
        digest = settings_digest(settings)
        recent = [b for b, renewed in self.bases.get(f"{namespace}/{name}", ())
                  if b.settings == digest and timedelta(0) <= now - renewed < RENEW_AFTER]
        if not recent:
            return False
        vmi = kube.get_metadata(VMI, namespace, name, cached=True)
        recent = [b for b in recent if vmi is not None and b.vmi_at == _version_of(vmi)]
        if not recent:
            return False
        owner = kv.controller_owner(vmi, "VirtualMachine")
        vm = kube.get_metadata(VM, namespace, owner["name"], cached=True) if owner else None
        recent = [b for b in recent if b.vm_at == _version_of(vm)]
        if not recent or not any(b.kubevirt == self._kubevirt(kubevirt_version) for b in recent):
            return False
        with self._lock:
            self.spared += 1
        return True

    def _kubevirt(self, read: Callable[[], Version | None]) -> str:
        with self._lock:
            if not self._version:
                self._version.append(_dotted(read()))
            return self._version[0]


def load(kube: Any, namespaces: Iterable[str], settings: Settings) -> Memory:
    """The bases of this function's dry-run Events: one LIST of them (reason VMICleanupDryRun, cached), or one per
    namespace of CLEANUP_NAMESPACES that has a candidate (a scoped install may read Events only there)."""
    selector = f"reason={wording.DRY_RUN}"
    if settings.namespaces:
        events = [e for found in rescans.gather(sorted(set(namespaces)), lambda namespace: list(
            kube.list(EVENT, namespace, field_selector=selector, cached=True)), settings.rescan) for e in found]
    else:
        events = list(kube.list(EVENT, field_selector=selector, cached=True))
    memory = Memory()
    for event in events:
        if (event.get("source") or {}).get("component") != FUNCTION:
            continue
        found = Basis.decode(((event.get("metadata") or {}).get("annotations") or {}).get(BASIS) or "")
        renewed = _when(event.get("lastTimestamp") or "")
        where = (event.get("metadata") or {}).get("namespace")
        if found is not None and renewed is not None and found.vmi.startswith(f"{where}/"):
            memory.bases.setdefault(found.vmi, []).append((found, renewed))
    return memory

"""io-pause-report's reads of storage: a VMI's volumes followed PVC → PV → Longhorn Volume and Engines, into the
facts decide.py weighs (decide.VolumeFacts). Reads only; an unreadable step is said, not raised, except RBAC's
refusal, which is the configuration's failure and reaches the dead letter."""
from __future__ import annotations

import re
from dataclasses import replace

from functions.io_pause_report.decide import KubeVirtErrors, VolumeFacts
from functions.io_pause_report.settings import Settings
from shared import kubevirt as kv
from shared.kinds import LONGHORN_ENGINE, LONGHORN_VOLUME, PV, PVC
from shared.kube import Forbidden, KubeError
from shared.runtime import KubeContext

LONGHORN_DRIVER = "driver.longhorn.io"
LONGHORN_VOLUME_LABEL = "longhornvolume"         # longhorn-manager types.GetVolumeLabels, on every Engine
NO_SPACE = re.compile(r"not enough space|no space|insufficient storage", re.IGNORECASE)


def fetch_volumes(ctx: KubeContext[Settings], vmi: dict, errors: KubeVirtErrors) -> tuple[VolumeFacts, ...]:
    """The volumes KubeVirt named (else every PVC-backed volume), each followed to Longhorn."""
    specs = ((vmi.get("spec") or {}).get("volumes") or [])
    by_name = {v.get("name"): v for v in specs}
    names = list(errors.volumes) or [v.get("name") for v in specs
                                     if v.get("persistentVolumeClaim") or v.get("dataVolume")]
    return tuple(_follow(ctx, kv.meta(vmi)["namespace"], name, by_name.get(name)) for name in names)


def _follow(ctx: KubeContext[Settings], namespace: str, name: str, spec: dict | None) -> VolumeFacts:
    claim = ((spec or {}).get("persistentVolumeClaim") or {}).get("claimName") or \
        ((spec or {}).get("dataVolume") or {}).get("name")
    if not claim:
        source = next((k for k in (spec or {}) if k != "name"), None)
        return VolumeFacts(name, unknown=f"not backed by a PVC ({source or 'not in the VMI spec'})")
    facts = VolumeFacts(name, pvc=claim)
    try:
        pvc = ctx.kube.get(PVC, namespace, claim)
        if pvc is None:
            return replace(facts, unknown=f"PVC {namespace}/{claim} not found")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        pv = ctx.kube.get(PV, None, pv_name) if pv_name else None
        if pv is None:
            return replace(facts, unknown=f"PVC {claim} is not bound to a PersistentVolume")
        facts = replace(facts, pv=pv_name)
        csi = (pv.get("spec") or {}).get("csi") or {}
        if csi.get("driver") != LONGHORN_DRIVER or not csi.get("volumeHandle"):
            return replace(facts, unknown=f"not a Longhorn volume (CSI driver {csi.get('driver') or 'none'})")
        return _longhorn(ctx, replace(facts, longhorn_volume=csi["volumeHandle"]), csi["volumeHandle"])
    except Forbidden:  # the configuration's failure, not the volume's: it must reach the dead letter (500)
        raise
    except KubeError as exc:  # unreadable: still report the pause, and say why the storage is unknown
        return replace(facts, unknown=f"could not be read ({exc})")


def _longhorn(ctx: KubeContext[Settings], facts: VolumeFacts, name: str) -> VolumeFacts:
    namespace = ctx.settings.longhorn_namespace
    volume = ctx.kube.get(LONGHORN_VOLUME, namespace, name)
    if volume is None:
        return replace(facts, unknown=f"Longhorn volume {namespace}/{name} not found")
    engines = [e for e in ctx.kube.list(LONGHORN_ENGINE, namespace, label_selector=f"{LONGHORN_VOLUME_LABEL}={name}")
               if (e.get("spec") or {}).get("volumeName") in (None, name)]
    return longhorn_facts(facts, volume, engines)


def longhorn_facts(facts: VolumeFacts, volume: dict, engines: list[dict]) -> VolumeFacts:
    """Robustness and state from the Volume; rebuild progress from its Engines' rebuildStatus."""
    status, spec = volume.get("status") or {}, volume.get("spec") or {}
    rebuilds = [r for e in engines for r in ((e.get("status") or {}).get("rebuildStatus") or {}).values()
                if isinstance(r, dict) and r.get("isRebuilding")]
    progress = min((int(r.get("progress") or 0) for r in rebuilds), default=None)
    full = next((f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or ()
                 if NO_SPACE.search(f"{c.get('reason')} {c.get('message')}")), None)
    full = full or next((r.get("error") for e in engines
                         for r in ((e.get("status") or {}).get("rebuildStatus") or {}).values()
                         if isinstance(r, dict) and NO_SPACE.search(r.get("error") or "")), None)
    return replace(facts, robustness=status.get("robustness"), state=status.get("state"), rebuilding=bool(rebuilds),
                   progress=progress, size=to_int(spec.get("size")) or None,
                   actual_size=to_int(status.get("actualSize")) or None,
                   last_degraded_at=kv.parse_time(status.get("lastDegradedAt")), out_of_space=full)


def to_int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0

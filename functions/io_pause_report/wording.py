"""What people read about an IO-error pause episode: the Event's sentence, the advice, and the reply's data."""
from __future__ import annotations

from functions.io_pause_report.decide import Action, Category, Episode, Facts, Verdict, VolumeFacts, hms, stamp
from functions.io_pause_report.settings import Settings
from shared.finding import Finding
from shared.settings import format_duration

FUNCTION = "io-pause-report"

# The mitigations of the Harvester knowledge base article on filesystem trim during a Longhorn rebuild.
TRIM_ADVICE = (
    "In Linux guests stop filesystem trim from running during rebuilds: `systemctl disable --now fstrim.timer`, "
    "or edit fstrim.timer so VMs do not trim at the same time (e.g. a RandomizedDelaySec).",
    "Drop the `discard` mount option from /etc/fstab, then `mount -o remount /` (or reboot the VM).",
    "In Windows guests: `fsutil behavior set DisableDeleteNotify 1` (query it with "
    "`fsutil behavior query DisableDeleteNotify`).",
    "Upgrade Longhorn (Harvester) to a release with the fix for trim during a replica rebuild "
    "(filesystem trim exists since Longhorn 1.4.0).",
)


def advice(verdict: Verdict, facts: Facts, settings: Settings) -> tuple[str, ...]:
    """What to do, from the verdict's category and cause and the volumes' facts (one place for every sentence)."""
    out: list[str] = []
    cause = verdict.cause
    if verdict.category is Category.STUCK:
        out.append(f"The VMI has been paused since {hms(verdict.paused_since)}, longer than "
                   f"{format_duration(settings.stuck_after)}: KubeVirt is not resuming it (harvester#11585). "
                   f"Stop and start the VM (`virtctl stop` then `virtctl start`, or Stop/Start in the Harvester UI).")
    if cause is Category.REBUILD:
        rebuilding = [v for v in facts.volumes if v.rebuilding or v.robustness == "degraded"]
        for v in rebuilding or [v for v in facts.volumes if v.is_longhorn]:
            out.append(f"Longhorn volume {v.longhorn_volume} (PVC {v.pvc}) is {v.robustness or 'in an unknown state'}"
                       + (f", rebuilding a replica ({v.progress}%)" if v.rebuilding and v.progress is not None
                          else ", rebuilding a replica" if v.rebuilding else "")
                       + ": filesystem trim during a replica rebuild causes the IO errors, and the pauses end "
                         "when the rebuild completes.")
        out.extend(TRIM_ADVICE)
    elif cause is Category.OUT_OF_SPACE:
        no_space = facts.kubevirt.no_space
        for v in facts.volumes:
            if v.out_of_space or (no_space and v.name in facts.kubevirt.volumes) or len(facts.volumes) == 1:
                out.append(f"Volume {v.name} (PVC {v.pvc}, Longhorn volume {v.longhorn_volume}) of size "
                           f"{_size(v.size)} (actual size {_size(v.actual_size)}) has no space left"
                           + (f": Longhorn says {v.out_of_space!r}" if v.out_of_space else "")
                           + ". Free space on the Longhorn disks that hold its replicas, or expand the volume.")
        if no_space:
            out.append(f"KubeVirt says: {no_space}")
    elif cause is Category.UNKNOWN_STORAGE:
        for v in facts.volumes:
            if not v.is_longhorn:
                out.append(f"Volume {v.name}" + (f" (PVC {v.pvc})" if v.pvc else "") + f": {v.unknown}; "
                           "check its storage backend for IO errors.")
        if not facts.volumes:
            out.append("KubeVirt named no volume and the VMI has no PVC-backed volume: check the VM's storage.")
    elif cause is Category.STORAGE_ERROR:
        for v in facts.volumes:
            out.append(f"Longhorn volume {v.longhorn_volume} (PVC {v.pvc}) is {v.robustness or 'unknown'} and not "
                       f"rebuilding: the IO errors have another cause; check its replicas and the nodes' disks "
                       f"in the Longhorn UI.")
    return tuple(out)


def event_message(verdict: Verdict, vmi: str, advised: tuple[str, ...]) -> str:
    """One sentence per report about VMI `vmi` ("namespace/name"). Stable for one episode: recording it
    again raises the Event's count."""
    subject = f"VMI {vmi}"
    if verdict.action is Action.RESOLVE:
        return (f"{subject} no longer pauses on IO errors: {verdict.reason}. The episode that began at "
                f"{verdict.episode_start} had {verdict.pauses} pause(s).")
    volumes = ", ".join(_volume_words(v) for v in verdict.volumes) or "no PVC-backed volume"
    if verdict.action is Action.ESCALATE:
        return (f"{subject} is stuck paused on an IO error since {hms(verdict.paused_since)} (episode began at "
                f"{verdict.episode_start}): KubeVirt is not resuming it; stop and start the VM. Storage: "
                f"{named(verdict.cause)}: {volumes}.")
    head = (f"{subject} pauses on IO errors (KubeVirt resumes it, then it pauses again), episode began at "
            f"{verdict.episode_start}: {named(verdict.category)}: {volumes}.")
    return f"{head} {advised[0]}" if advised else head


def reply_data(verdict: Verdict, vmi: str, vm: str | None, episode: Episode | None, advised: tuple[str, ...]) -> dict:
    """The `.detected` / `.resolved` reply's data about VMI `vmi` and VM `vm` ("namespace/name")."""
    category = verdict.category.value if verdict.category else None
    data = {"vmi": vmi, "vm": vm, "volumes": [volume_data(v) for v in verdict.volumes], "category": category,
            "cause": verdict.cause.value if verdict.cause else None, "pauses": verdict.pauses,
            "episodeStart": verdict.episode_start,
            "pausedSince": stamp(verdict.paused_since) if verdict.paused_since else None,
            "advice": list(advised)}
    if verdict.action is Action.RESOLVE:
        reported = sorted(episode.categories) if episode else []
        data.update({"reason": verdict.reason, "reportedCategories": reported, "advice": []})
        if episode is not None and episode.reported_volumes is not None:
            data["volumes"] = episode.reported_volumes  # the alert's identity: the volumes first reported
    return data


def finding(verdict: Verdict, vmi: str, vm: str | None, vmi_uid: str, advised: tuple[str, ...],
            message: str) -> Finding:
    """A new episode as a finding (docs/findings.md). Its identity is the category it opened with and the VMI
    instance; its labels are the alert's labels of old (namespace, VMI name, the PVCs)."""
    data = reply_data(verdict, vmi, vm, None, advised)
    namespace, name = vmi.split("/", 1)
    pvcs = sorted({str(v.get("pvc") or v.get("longhornVolume") or v.get("name")) for v in data["volumes"]})
    details = {k: v for k, v in data.items() if k != "advice"}
    details.update({"vmiUid": vmi_uid, "baseline": verdict.baseline, "reportedCategories": [named(verdict.category)]})
    return Finding(FUNCTION, named(verdict.category), f"/apis/kubevirt.io/v1/namespaces/{namespace}/"
                   f"virtualmachineinstances/{name}", vmi_uid,
                   {"namespace": namespace, "vm": name, "volume": ",".join(pvcs)}, "critical", message,
                   tuple(advised), details)


def volume_data(v: VolumeFacts) -> dict:
    """A volume as the reply (and the episode's Event annotation) names it."""
    return {"name": v.name, "pvc": v.pvc, "pv": v.pv, "longhornVolume": v.longhorn_volume,
            "robustness": v.robustness, "rebuilding": v.rebuilding, "progress": v.progress,
            **({"unknown": v.unknown} if v.unknown else {})}


def named(category: Category | None) -> str:
    return category.value if category else "unknown"


def _volume_words(v: VolumeFacts) -> str:
    if not v.is_longhorn:
        return f"{v.name} ({v.unknown})"
    rebuild = f", rebuilding {v.progress}%" if v.rebuilding and v.progress is not None else \
        ", rebuilding" if v.rebuilding else ""
    return f"{v.name} → PVC {v.pvc} → Longhorn volume {v.longhorn_volume} ({v.robustness or 'unknown'}{rebuild})"


def _size(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"

"""Which VM each host device is assigned to: the content of the parameter object that device-conflict keeps
and that the ValidatingAdmissionPolicy of deploy/components/prevent reads. Pure, like decide.py.

"Assigned" is what Harvester's UI means by it: the VM that names the device (a `hostDevices[].name` or
`gpus[].name`). When several do, the one that runs with it (its recorded allocation where harvester/pcidevices
writes one, docs/facts.md §3), else the one that named it first: the oldest creationTimestamp, then the name.

The object is a ConfigMap, one key per device, so that CEL reads `params.data[<device>]` with no parsing
beyond `split(' ')`. Its value is `<assigned VM> <its state> [<every other VM naming or holding it> …]`, e.g.
`default/vm1 stopped default/vm2`: the policy reads the first two words; device-conflict reads them all, so
that an event about one VM needs to read only the few VMs that share its devices, never a LIST of all.
A device name that cannot be a ConfigMap key is not kept (Harvester's never are: node name and PCI address).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from functions.device_conflict.index import Workload

PURE = True
NAME = "vmevents-device-assignments"  # the parameter object: a ConfigMap in the function's own namespace
# k8s.io/apimachinery validation.IsConfigMapKey.
_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def is_key(device: str) -> bool:
    return bool(_KEY.match(device)) and device not in (".", "..")


@dataclass(frozen=True)
class Entry:
    """One device: the VM it is assigned to, that VM's state, and every other VM naming or holding it."""

    assigned: str              # "namespace/name"
    state: str                 # stopped, starting, running, blocked (index.State)
    others: tuple[str, ...] = ()

    @property
    def claimants(self) -> tuple[str, ...]:
        return (self.assigned,) + self.others

    def encode(self) -> str:
        return " ".join((self.assigned, self.state) + self.others)

    @classmethod
    def decode(cls, text: str) -> Entry | None:
        words = str(text).split()
        return cls(words[0], words[1], tuple(words[2:])) if len(words) >= 2 else None


def _claims(w: Workload, device: str) -> bool:
    return any(d.name == device for d in w.devices | w.named)


def _runs_with(w: Workload, device: str) -> bool:
    return w.active and any(d.name == device for d in w.devices)


def entries(workloads: Iterable[Workload], only: Iterable[str] | None = None) -> dict[str, Entry]:
    """The entry of every device these workloads name or hold (or only of the devices in `only`)."""
    claimants: dict[str, list[Workload]] = {}
    wanted = set(only) if only is not None else None
    for w in workloads:
        for name in {d.name for d in w.devices | w.named}:
            if is_key(name) and (wanted is None or name in wanted):
                claimants.setdefault(name, []).append(w)
    found = {}
    for device, those in claimants.items():
        runners = [w for w in those if _runs_with(w, device)]
        first = min(runners or those, key=lambda w: (w.created or "~", w.ref.id))
        others = tuple(sorted({w.ref.id for w in those} - {first.ref.id}))
        found[device] = Entry(first.ref.id, first.state.value, others)
    return found


def data_of(found: Mapping[str, Entry]) -> dict[str, str]:
    return {device: entry.encode() for device, entry in sorted(found.items())}


def read(data: Mapping[str, str] | None) -> dict[str, Entry]:
    """The entries of a ConfigMap's data; a value that does not read is dropped (the re-scan rewrites it)."""
    found = {}
    for device, text in (data or {}).items():
        entry = Entry.decode(text)
        if entry is not None:
            found[device] = entry
    return found


def devices_of(found: Mapping[str, Entry], vm: str) -> set[str]:
    """The devices whose entry names this VM, assigned or not."""
    return {device for device, entry in found.items() if vm in entry.claimants}


def updated(data: Mapping[str, str], fresh: Mapping[str, Entry], devices: Iterable[str]) -> dict[str, str]:
    """`data` with the entries of `devices` replaced by what was read fresh (absent: nobody claims it now)."""
    out = dict(data)
    for device in devices:
        if device in fresh:
            out[device] = fresh[device].encode()
        else:
            out.pop(device, None)
    return dict(sorted(out.items()))


def merged(base: Mapping[str, str], theirs: Mapping[str, str], mine: Mapping[str, str]) -> dict[str, str]:
    """A re-scan's view (`mine`, from LISTs that began after `base` was read) over the object as it is now
    (`theirs`): an entry an event changed since `base` was read is that event's fresher knowledge and is
    kept; every other entry is the re-scan's."""
    out = {}
    for device in set(base) | set(theirs) | set(mine):
        if base.get(device) != theirs.get(device):
            value = theirs.get(device)
        else:
            value = mine.get(device)
        if value is not None:
            out[device] = value
    return dict(sorted(out.items()))

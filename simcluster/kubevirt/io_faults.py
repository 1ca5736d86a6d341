"""Stands in for virt-launcher and virt-handler when a guest's disk fails IO (FACTS §5): it decides when the guest
pauses (condition Paused/PausedIOError and a Warning IOerror Event per disk) and when virt-handler resumes it, with
KubeVirt's backoff, until the storage works again, or never (harvester#11585).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from simcluster.kubevirt.objects import (
    VIRT_HANDLER_COMPONENT,
    VMIS,
    Key,
    condition_is,
    drop_condition,
    is_deleting,
    meta_of,
    set_condition,
    status_of,
    vmi_phase,
)

# virt-launcher: a domain paused with reason IOError gets the VMI condition Paused/PausedIOError, and
# one Warning "IOerror" Event per disk with an error (pkg/virt-launcher/virtwrap/cmd-server notify,
# SendK8sEvent); virt-handler resumes it with a backoff (FACTS §5: 10 s doubling to 3 min).
IO_ERROR_REASON = "IOerror"
PAUSED_IO_ERROR = {"type": "Paused", "status": "True", "reason": "PausedIOError",
                   "message": "VMI was paused, low-level IO error detected"}
IO_RESUME_FIRST, IO_RESUME_MAX = 10.0, 180.0
IO_ERROR_AGAIN_AFTER = 5.0   # a resumed guest that is still trimming hits the error again this soon


def io_error_message(volume: str, no_space: bool = False) -> str:
    """KubeVirt's IOerror Event message for a disk error (libvirt DISK_ERROR_UNSPEC / NO_SPACE)."""
    if no_space:
        return f"VM Paused due to not enough space on volume: {volume}"
    return f"VM Paused due to IO error at the volume: {volume}"


def io_resume_backoff(pauses: int) -> float:
    """Seconds a paused guest waits before its n-th resume: 10, 20, 40, ... at most 180."""
    return min(IO_RESUME_FIRST * 2 ** max(pauses - 1, 0), IO_RESUME_MAX)


@dataclass
class IOFault:
    """A volume whose IO fails (a Longhorn replica rebuilding while the guest trims, a full disk)."""

    volume: str
    no_space: bool = False
    stuck: bool = False       # never resumed (harvester#11585): only a stop and start helps
    active: bool = True       # False once the storage works again (the rebuild completed)
    pauses: int = 0
    next_at: float = 0.0      # monotonic time of the next pause or resume
    vmi_uid: str = ""         # the guest it belongs to: a restarted VM's new VMI starts healthy


class IOFaults:
    """Guests whose IO fails, a part of `KubeVirtSim` (simcluster/kubevirt/sim.py); timers run at its
    `io_time_scale` on its worker."""

    def start_io_errors(self, namespace: str, vmi_name: str, volume: str, *, no_space: bool = False,
                        stuck: bool = False) -> None:
        """From now on the guest's IO to `volume` (a VMI volume name) fails: it pauses (PausedIOError,
        an IOerror Event), is resumed after a backoff, pauses again ... until `stop_io_errors`.
        `stuck`: it is never resumed (harvester#11585). Timers run at `io_time_scale`."""
        self._call(lambda: self._io_begin(namespace, vmi_name, IOFault(volume, no_space=no_space, stuck=stuck)))

    def stop_io_errors(self, namespace: str, vmi_name: str) -> None:
        """The storage works again (the rebuild completed): the next resume is the last one."""
        def stop() -> None:
            fault = self._io.get((namespace, vmi_name))
            if fault is not None:
                fault.active = False
        self._call(stop)

    def io_pauses(self, namespace: str, vmi_name: str) -> int:
        """How many times the guest paused on the current IO fault (0 when none is active)."""
        fault = self._io.get((namespace, vmi_name))
        return fault.pauses if fault else 0

    def _io_begin(self, ns: str, name: str, fault: IOFault) -> None:
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None or vmi_phase(vmi) != "Running":
            raise RuntimeError(f"VMI {ns}/{name} is {vmi_phase(vmi) or 'missing'}, not Running; "
                               "only a running guest can hit an IO error.")
        fault.next_at = time.monotonic()
        fault.vmi_uid = meta_of(vmi)["uid"]
        self._io[(ns, name)] = fault

    def _io_step(self, key: Key) -> None:
        """One pause or one resume of a guest whose volume fails IO (virt-launcher + virt-handler)."""
        fault = self._io.get(key)
        if fault is None:
            return
        ns, name = key
        vmi = self._kube.get(VMIS, ns, name)
        if vmi is None or is_deleting(vmi) or vmi_phase(vmi) != "Running" or meta_of(vmi).get("uid") != fault.vmi_uid:
            self._io.pop(key, None)  # the guest is gone: so is its fault
            return
        now, scale = self.clock(), self.io_time_scale
        conditions = status_of(vmi).get("conditions")
        if condition_is(vmi, "Paused", "True", "PausedIOError"):
            if fault.stuck:
                return  # stays paused: next_at stays at infinity
            self._patch_vmi_status(vmi, {"conditions": drop_condition(conditions, "Paused")})
            if fault.active:
                fault.next_at = time.monotonic() + IO_ERROR_AGAIN_AFTER * scale
            else:
                self._io.pop(key, None)
        elif fault.active:
            # The Event first, then the condition: virt-launcher sends both, the Event is recorded at once.
            self._kube.record_counted(vmi, "Warning", IO_ERROR_REASON, io_error_message(fault.volume, fault.no_space),
                                      VIRT_HANDLER_COMPONENT, now)
            self._patch_vmi_status(vmi, {"conditions": set_condition(conditions, PAUSED_IO_ERROR, now)})
            fault.pauses += 1
            fault.next_at = time.monotonic() + io_resume_backoff(fault.pauses) * scale
        else:
            self._io.pop(key, None)
        self._enqueue(key)  # the VM controller copies the condition (printableStatus Paused)


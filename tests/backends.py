"""Which cluster an end-to-end test runs on: the simulator ("sim", always) and a real kube-apiserver with
etcd ("real", built from Kubernetes' published modules by controlplane/).

One real control plane serves the whole test session; each world resets it (controlplane.cluster.
RealCluster.reset). With CI=true the real backend must run: a missing Go or a failed build fails the
tests. Elsewhere, without Go, the real rows skip with one line saying how to enable them.
"""
from __future__ import annotations

import atexit
import os
import sys

import pytest

from controlplane import build

SIM, REAL = "sim", "real"
_plane = None
_failure: str | None = None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def real_missing() -> str | None:
    """Why the real backend cannot run here, or None."""
    if os.environ.get("VMEVENTS_BACKENDS", "").strip() == SIM:
        return "VMEVENTS_BACKENDS=sim"
    if not build.buildable():
        return "no Go toolchain: install Go ≥ 1.25 (the control plane is built from Kubernetes' modules)"
    return None


def params() -> list:
    """Backend parameters for a world fixture: sim, and real (marked to skip with the reason when it cannot)."""
    missing = real_missing()
    real = pytest.param(REAL, id=REAL, marks=[pytest.mark.real])
    if missing and not in_ci():
        real = pytest.param(REAL, id=REAL, marks=[pytest.mark.real, pytest.mark.skip(
            reason=f"real control plane: {missing}")])
    return [pytest.param(SIM, id=SIM), real]


def control_plane(revive: bool = True):
    """The session's real control plane, started on first use and stopped at exit; with `revive`, a component a
    test before left stopped is started again first (the fault tests, which stop and start them, pass False)."""
    global _plane, _failure
    if _failure:
        pytest.fail(_failure)
    if _plane is None:
        from controlplane.server import ControlPlane

        try:
            _plane = ControlPlane(event_ttl=os.environ.get("VMEVENTS_EVENT_TTL", "1h"), die_with_parent=True).start()
        except Exception as exc:  # noqa: BLE001 - a failed build or start fails every real test, once each
            _failure = f"the real control plane did not start: {exc}"
            pytest.fail(_failure)
        atexit.register(_plane.remove)
    elif revive:
        revived = _plane.revive()
        if revived:
            print(f"\n[control plane] {', '.join(revived)} had stopped (a test before this one left it so): "
                  "started again", file=sys.stderr, flush=True)
    return _plane


def cluster(backend: str, kubevirt_version: str, virt_controller: bool = True, knative: bool = False):
    """A started cluster of the given backend: SimCluster, or RealCluster on the session's control plane
    (with KubeVirt's virt-controller of that version unless `virt_controller` is False: API-level tests). knative:
    on the control plane where Knative runs instead (tests/delivery.py `session_knative`; its reset spares Knative)."""
    if backend == SIM:
        from simcluster.apiserver import SimCluster

        return SimCluster(kubevirt_version=kubevirt_version).start()
    from controlplane.cluster import RealCluster

    if knative:
        from tests.delivery import session_knative

        return RealCluster(session_knative()[0], kubevirt_version, virt_controller=virt_controller).start()
    return RealCluster(control_plane(), kubevirt_version, virt_controller=virt_controller).start()

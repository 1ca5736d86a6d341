"""device-conflict's parameter object converges from scratch in one re-scan of 2,000 VMs, on both backends: one
write (its creation), and a second re-scan writes nothing. Its own module: no KubeVirt or Knative runs here,
only the API server and the function's re-scan, with the function's own ServiceAccount."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from functions.device_conflict import handler
from functions.device_conflict.settings import FUNCTION, Settings
from shared.kube import Kube
from shared.recorder import Recorder
from shared.runtime import KubeContext
from simcluster.builders.devices import VF, host_device, seed_vm1
from tests import backends
from tests.functions.device_conflict.test_parameter_object import SA, data, writes

pytestmark = pytest.mark.e2e
VMS = 2_000


@pytest.fixture(scope="module", params=backends.params())
def crowd(request):
    """2,000 VMs shaped like the seed's vm1; one in ten names a device, of its own but for one in 100, which
    names the device of the VM 50 before it."""
    # The crowd is 2,000 stored VMs to re-scan; KubeVirt's decisions are not what this measures.
    cluster = backends.cluster(request.param, "1.3.1", virt_controller=False)
    try:
        def one(i):
            devices = [host_device(f"harvester-ktmg4-{i - 50 if i % 100 == 50 else i:09x}", VF)] \
                if i % 10 == 0 else []
            manifest = seed_vm1(f"crowd-{i:05d}", host_devices=devices)
            if not devices:
                del manifest["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"]
            cluster.create(manifest)
        with ThreadPoolExecutor(8 if request.param == backends.REAL else 1) as pool:
            list(pool.map(one, range(VMS)))
        yield cluster
    finally:
        cluster.stop()


def test_it_converges_from_scratch_in_one_rescan_of_2000_vms(crowd, capsys):
    kube = Kube(crowd.api_client(service_account=SA))
    ctx = KubeContext(function=FUNCTION, settings=Settings(), clock=lambda: datetime.now(UTC), kube=kube,
                      recorder=Recorder(kube, FUNCTION))
    before = len(writes(crowd))
    assert data(crowd) is None
    started = time.monotonic()
    handler.rescan(ctx)
    took = time.monotonic() - started
    first = data(crowd)
    assert len(writes(crowd)) - before == 1, "one write: the object's creation"
    assert len(first) == VMS // 10 - VMS // 100  # one entry per device: 200 VMs name 180 devices
    handler.rescan(ctx)
    assert data(crowd) == first and len(writes(crowd)) - before == 1, "converged: the second re-scan writes nothing"
    size = len(json.dumps(first))
    with capsys.disabled():
        print(f"\n[{getattr(crowd, 'backend', 'sim')}] {VMS} VMs: parameter object "
              f"{len(first)} entries, {size} bytes of data, 1 write, re-scan {took:.2f} s")
    assert size < 100_000

"""The faults a test can inject (simcluster/faults.py), as a function's client meets them, on both backends: the
simulated API server applies them itself, and on the real one the proxy in front of kube-apiserver does
(controlplane/faultproxy.py). Each kind must reach the client the same way on both, or a fault test proves
something on one backend only."""
from __future__ import annotations

import threading
import time

import pytest

from shared.kinds import NAMESPACE, VMIM
from shared.kube import Forbidden, Kube, Unavailable
from tests import backends

SA = "vmevents/migration-report"  # deploy/ lets it list and watch VMIMs
VMIMS = "/apis/kubevirt.io/v1/virtualmachineinstancemigrations"


@pytest.fixture(scope="module", params=backends.params())
def cluster(request):
    c = backends.cluster(request.param, "1.3.1")
    yield c
    c.stop()


@pytest.fixture
def kube(cluster):
    from kubernetes import config

    from shared.kubeconfig import _configuration

    cluster.faults.clear()
    client = config.new_client_from_config(config_file=cluster.kubeconfig(SA), client_configuration=_configuration())
    yield Kube(client)
    client.close()
    cluster.faults.clear()


def list_vmims(kube: Kube) -> list:
    return list(kube.list(VMIM))


def test_a_status_fault_answers_it_with_retry_after_once_then_the_server_answers(cluster, kube):
    fault = cluster.faults.add(method="GET", path=f"{VMIMS}$", service_account=SA, status=429, retry_after=7)
    with pytest.raises(Unavailable) as throttled:
        list_vmims(kube)
    assert throttled.value.retry_after == 7 and "Too many requests" in throttled.value.message
    assert list_vmims(kube) == [] and fault.hits == 1


def test_a_fault_for_another_caller_or_path_leaves_this_one_alone(cluster, kube):
    cluster.faults.add(path=f"{VMIMS}$", service_account="vmevents/device-conflict", status=503, times=None)
    cluster.faults.add(path="/virtualmachines$", service_account=SA, status=503, times=None)
    assert list_vmims(kube) == []


def test_latency_delays_the_answer(cluster, kube):
    cluster.faults.add(method="GET", path=f"{VMIMS}$", service_account=SA, kind="latency", delay=1.0)
    started = time.monotonic()
    assert list_vmims(kube) == []
    assert time.monotonic() - started >= 1.0


@pytest.mark.parametrize("kind", ["drop", "cut"])
def test_a_connection_dropped_or_cut_mid_answer_is_unavailable(cluster, kube, kind):
    cluster.faults.add(method="GET", path=f"{VMIMS}$", service_account=SA, kind=kind)
    with pytest.raises(Unavailable) as failed:
        list_vmims(kube)
    assert "unreachable" in failed.value.message
    assert list_vmims(kube) == []


def test_a_cut_watch_ends_early_and_is_unavailable(cluster, kube):
    since = kube.rows(VMIM).resource_version
    cluster.faults.add(method="GET", path=f"{VMIMS}$", service_account=SA, kind="cut", delay=0.5)
    started = time.monotonic()
    with pytest.raises(Unavailable):
        kube.changes(VMIM, None, since, seconds=8)
    assert time.monotonic() - started < 6, "the watch was cut, not ended by its timeout"


def test_call_runs_when_the_fault_is_taken_before_its_effect(cluster, kube):
    seen = threading.Event()
    cluster.faults.add(method="GET", path=f"{VMIMS}$", service_account=SA, kind="drop", call=seen.set)
    with pytest.raises(Unavailable):
        list_vmims(kube)
    assert seen.is_set()


def test_a_request_no_fault_matches_is_the_server_s_own_answer(cluster, kube):
    with pytest.raises(Forbidden):  # deploy/ grants migration-report no list of namespaces
        list(kube.list(NAMESPACE))

"""The world every end-to-end module runs in, built once here instead of once per module: the simulated
API server, the simulated KubeVirt, and the local broker running deploy/ with each function as a real
functions-framework server holding the credentials of its own ServiceAccount.

A module subclasses World for the helpers that are its own (what its function records and replies)
and passes what it varies: the KubeVirt version, KubeVirtSim's options (or no KubeVirtSim at all),
the functions' environment overrides and the time scale.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from controlplane import build
from localknative.runtime import LocalKnative, load_manifests
from simcluster.kubevirt.sim import KubeVirtSim
from simcluster.paths import DEPLOY_DIR
from simcluster.play import _source_account, namespaces_of
from tests import backends

UPDATE = "dev.knative.apiserver.resource.update"
# The default world's KubeVirt (SimCluster's and RealCluster's default; Harvester 1.4's): the one version a test whose
# decisions do not depend on KubeVirt's runs with (`one_kubevirt`), and the one `make test-fast` runs.
DEFAULT_KUBEVIRT = "1.3.1"
# How long a world's waits (settle, a VMI's phase) may take before they give up: deadlines, not delays, as they return
# the moment their condition holds. CI's machine is a loaded 2-core one, where a world of twenty VMs on the real
# backend took longer than the 15 s these were.
WAIT = 60.0


def eventually(predicate, timeout=15.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def kubevirt_versions(*versions: str) -> dict:
    """A module-scoped world fixture's params: one world per KubeVirt version and backend (sim, real);
    `World(*request.param)` builds it. The rows of another version than the default carry `other_kubevirt`
    (`make test-fast` leaves them out); a test marked `one_kubevirt` runs in the default version's world only
    (tests/conftest.py deselects its other rows)."""
    return {"params": [pytest.param((version, backend.values[0]), id=f"kubevirt-{version}-{backend.id}",
                                    marks=[*backend.marks, *([] if version == DEFAULT_KUBEVIRT
                                                             else [pytest.mark.other_kubevirt])])
                       for version in versions for backend in backends.params()]}


def backends_only() -> dict:
    """The params of a world fixture that varies only the backend (KubeVirt's default version)."""
    return {"params": [pytest.param((DEFAULT_KUBEVIRT, b.values[0]), id=b.id, marks=b.marks)
                       for b in backends.params()]}


def data_of(event: CloudEvent) -> Any:
    """A received CloudEvent's data as JSON values, however the broker carried it."""
    return json.loads(event.data) if isinstance(event.data, (bytes, str)) else event.data


class World:
    """SimCluster, KubeVirtSim (unless `kubevirt` is None: options for it otherwise) and LocalKnative,
    started in that order and stopped in the reverse one. Use it as a context manager.

    A world whose class sets `through_knative` (every function's e2e suite) runs on the real backend through
    Knative's own data plane instead of LocalKnative (controlplane/knative_runtime.py): on the control plane where
    Knative runs, its ApiServerSource adapters send the events, its broker delivers them to the functions by
    deploy/'s Triggers and publishes their replies."""

    function_sa = ""  # "namespace/name" of the function's ServiceAccount, for function_requests()
    # What runs each Knative Service (LocalKnative's function_server): None, a process from the work tree;
    # tests/deploy/test_image.py sets image.run.factory(...) to run every function from the image.
    function_server = None
    through_knative = False

    def __init__(self, kubevirt_version: str = DEFAULT_KUBEVIRT, *, backend: str = backends.SIM,
                 kubevirt: Mapping[str, Any] | None = None,
                 env_overrides: Mapping[str, Mapping[str, str]] | None = None, time_scale: float = 0.01,
                 knative_source: bool | None = None, cluster=None):
        """knative_source: Knative's own ApiServerSource adapter instead of the stand-in (default: on the
        real backend, where it can run). cluster: a started cluster of that backend to use (and stop) instead
        of the session's, e.g. a RealCluster on a control plane with its own --event-ttl."""
        self.backend = backend
        self.knative_broker = backend == backends.REAL and self.through_knative
        self.cluster = cluster if cluster is not None else backends.cluster(backend, kubevirt_version,
                                                                            knative=self.knative_broker)
        self.kubevirt = self.knative = None
        try:
            self.kubevirt = None if kubevirt is None else KubeVirtSim(self.cluster, **kubevirt).start()
            if self.knative_broker:
                self.knative = self._knative_runtime(env_overrides, time_scale)
                return
            use_knative = backend == backends.REAL if knative_source is None else knative_source
            adapter = build.ensure(build.KNATIVE) / "apiserver_receive_adapter" if use_knative else None
            self.knative = LocalKnative(
                load_manifests(DEPLOY_DIR),
                kubeconfig_for=lambda sa: self.cluster.kubeconfig(service_account=sa),
                api_client_for=lambda sa: self.cluster.api_client(service_account=sa),
                api_server_url=self.cluster.url,
                env_overrides=env_overrides,
                time_scale=time_scale,
                apiserversource_binary=adapter,
                namespaces_of=namespaces_of(self.cluster),
                source_listed=self._source_listed if use_knative else None,
                **({"function_server": self.function_server} if self.function_server else {}),
            ).start()
        except BaseException:
            self.stop()
            raise

    def _knative_runtime(self, env_overrides, time_scale):
        from controlplane.knative_runtime import KnativeRuntime
        from tests.delivery import session_knative

        return KnativeRuntime(
            session_knative()[2], load_manifests(DEPLOY_DIR),
            kubeconfig_for=lambda sa: self.cluster.kubeconfig(service_account=sa), env_overrides=env_overrides,
            time_scale=time_scale, **({"function_server": self.function_server} if self.function_server else {}),
        ).start()

    def _source_listed(self, manifest) -> bool:
        return self.cluster.listed_by(_source_account(manifest), manifest)

    def stop(self):
        for part in (self.knative, self.kubevirt, self.cluster):
            if part is not None:
                part.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- helpers every function's tests use ---------------------------------------------------
    def vmi(self, name, namespace="default"):
        return self.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", namespace, name)

    def wait_vmi_phase(self, name, phase, namespace="default", timeout=WAIT):
        """The VMI once it is in `phase`; on a timeout, the error says where KubeVirt stopped: the VM's and the VMI's
        status, the launcher pods, and the end of virt-controller's log when KubeVirt's own runs."""
        try:
            return eventually(lambda: (v := self.vmi(name, namespace)) and (v.get("status") or {}).get("phase") == phase
                              and v, timeout=timeout, what=f"VMI {name} in phase {phase}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.kubevirt_state(name, namespace)}") from None

    def announced_vmi(self, name, phase, namespace="default", timeout=WAIT):
        """The VMI as the ApiServerSource announced it in `phase`, from what the broker received. A phase the
        function ends at once (vmi-cleanup's Succeeded at CLEANUP_AFTER=0s) can be over before a poll sees it;
        the source's event cannot be missed."""
        def seen():
            for event in list(self.knative.broker.received):
                if event.get("kind") == "VirtualMachineInstance" and event.get("name") == name \
                        and event.get("namespace") == namespace:
                    obj = data_of(event)
                    if isinstance(obj, dict) and (obj.get("status") or {}).get("phase") == phase:
                        return obj
            return None
        try:
            return eventually(seen, timeout=timeout, what=f"the source's event of VMI {name} in phase {phase}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.kubevirt_state(name, namespace)}") from None

    def kubevirt_state(self, name, namespace="default") -> str:
        vm = self.cluster.get("kubevirt.io/v1", "VirtualMachine", namespace, name)
        vmi = self.vmi(name, namespace)
        pods = [(p["metadata"]["name"], (p.get("spec") or {}).get("nodeName"), (p.get("status") or {}).get("phase"))
                for p in self.cluster.list("v1", "Pod", namespace)
                if (p["metadata"].get("labels") or {}).get("vm.kubevirt.io/name") == name]
        controller = getattr(self.cluster, "virt_controller", None)
        log = f"; virt-controller {controller.version}'s log ends:\n{controller.log_tail(2500)}" if controller else ""
        return (f"VM status {(vm or {}).get('status')}; VMI status {(vmi or {}).get('status') if vmi else None}; "
                f"launcher pods {pods}{log}")

    def settle(self):
        """Let every event in flight reach the function (a subclass whose function makes KubeVirt act
        uses settle_with_kubevirt instead)."""
        self.knative.wait_idle(timeout=WAIT)

    def settle_with_kubevirt(self):
        """Let every event in flight reach the function and everything it causes settle."""
        for _ in range(2):
            self.knative.wait_idle(timeout=WAIT)
            self.kubevirt.wait_idle(timeout=WAIT)

    def tick(self):
        """Let what is in flight settle, then let the PingSource fire once and that settle."""
        self.settle()
        self.knative.ping.tick()
        self.settle()

    def send(self, obj, type_=UPDATE):
        """Publish an ApiServerSource event about `obj` into the broker."""
        meta = obj["metadata"]
        self.knative.broker.publish(CloudEvent({
            "type": type_, "source": self.cluster.url, "kind": obj["kind"],
            "apiversion": obj.get("apiVersion", "v1"), "name": meta["name"], "namespace": meta["namespace"]}, obj))

    def function_requests(self, verb=None):
        """The API requests the function made with its own ServiceAccount."""
        return [r for r in self.cluster.requests
                if r.service_account == self.function_sa and (verb is None or r.verb == verb)]

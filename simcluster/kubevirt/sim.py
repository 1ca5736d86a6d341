"""Stands in for a KubeVirt installation's informers and work queues: `KubeVirtSim` watches VMs, VMIs and launcher
pods over HTTP with the real `kubernetes` client and the admin kubeconfig, as the real components are clients of the
real API server, and one worker decides on fresh objects and acts, so the functions under test see the objects,
phases and Events they would see on a Harvester cluster.

The parts it is made of, each the stand-in for one real component: `VMController` (vm_controller.py),
`VMILifecycle` (vmi_controller.py), `Scheduler` (scheduler.py), `NodeAgent` (node.py, the kubelet and
virt-handler), `Migrations` (migration.py) and `IOFaults` (io_faults.py). docs/facts.md §1–3 is the summary.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from simcluster.instancetypes import Instancetypes
from simcluster.kubevirt.client import Kube
from simcluster.kubevirt.io_faults import IOFault, IOFaults
from simcluster.kubevirt.migration import Migrations, Plan, Run
from simcluster.kubevirt.node import DEFAULT_NODES, PERMANENT_DEVICES, NodeAgent
from simcluster.kubevirt.objects import (
    API_VERSION,
    FINAL_POD_PHASES,
    GROUP,
    VMIS,
    VMS,
    Key,
    is_deleting,
    meta_of,
    owner_name,
    parse_version,
    status_of,
)
from simcluster.kubevirt.scheduler import Scheduler
from simcluster.kubevirt.vm_controller import VMController
from simcluster.kubevirt.vmi_controller import VMILifecycle

log = logging.getLogger(__name__)


# node_only: how long nothing may change before wait_idle calls KubeVirt idle (its workqueues act within ms).
QUIET_PERIOD = 0.3
NODE_RESYNC_PERIOD = 3.0


class KubeVirtSim(VMController, VMILifecycle, Scheduler, NodeAgent, Migrations, IOFaults):
    """virt-controller's VM controller + a minimal virt-handler/scheduler against the sim API server.

    `node_only` (the default where KubeVirt's own virt-controller runs, i.e. `cluster.runs_virt_controller`):
    it is then only the **node stand-in**, what a Harvester node does and nothing virt-controller decides —
    kube-scheduler binding launcher pods (pods/binding) by their device requests, kubelet running them and
    removing them once deleted, and virt-handler moving a Scheduled VMI to Running, shutting a deleted one
    down, and reporting the guest's power-off, crash and IO-error pauses (`_sync_node`).

    One worker thread does every write (controller, handler and guest actions), so the simulated
    components never race each other; watch threads and a periodic resync only enqueue keys.
    No lock is ever held across an API call.
    """

    def __init__(self, cluster: Any, version: str | None = None,
                 nodes: Mapping[str, Mapping[str, int]] | None = None,
                 step_delay: float = 0.05, resync_period: float = 0.5, io_time_scale: float = 1.0,
                 volumes: bool = False, node_only: bool | None = None):
        self.cluster = cluster
        self.node_only = bool(getattr(cluster, "runs_virt_controller", False)) if node_only is None else node_only
        self.version_string = str(version or cluster.kubevirt_version).lstrip("v")
        self.version = parse_version(self.version_string)
        self.nodes = {name: dict(devs) for name, devs in (nodes or DEFAULT_NODES).items()}
        if self.node_only:  # real launcher pods request virt-handler's permanent device plugins' devices too
            self.nodes = {name: {**PERMANENT_DEVICES, **devs} for name, devs in self.nodes.items()}
        self.step_delay = step_delay
        # node_only: the watches carry virt-controller's changes; the resync only repairs a missed watch event,
        # and a pass over every VMI must fit in it on a loaded machine.
        self.resync_period = max(resync_period, NODE_RESYNC_PERIOD) if self.node_only else resync_period
        # IO-error pauses and resumes run on KubeVirt's backoff times this factor (tests: 0.01).
        self.io_time_scale = io_time_scale
        # A missing PVC or NetworkAttachmentDefinition always keeps the launcher pod from being created, as in
        # KubeVirt (ErrorPvcNotFound; FailedCreate). `volumes` adds the scheduler's and the kubelet's reading of
        # the PVCs: an unbound one keeps the pod unscheduled, a faulted Longhorn volume fails the attach.
        self.volumes = volumes
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self._io: dict[Key, IOFault] = {}
        self._plans: dict[Key, Plan] = {}      # node_only: how the next migration of a VMI goes
        self._runs: dict[str, Run] = {}        # node_only: migrations under way, by migration uid
        self._aborted_at: dict[str, float] = {}   # node_only: when virt-launcher aborted a migration (monotonic)

        self._cond = threading.Condition()
        self._due: dict[Key, float] = {}          # key -> monotonic time it may run
        self._calls: list[tuple[Callable[[], Any], Future]] = []
        self._busy = False
        self._changes = 0                          # writes + failures; wait_idle compares it
        self._last_step: dict[Key, float] = {}
        self._stop = threading.Event()
        self._resync_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_responses: set[Any] = set()
        self._api_clients: list[Any] = []
        self._kube = self._new_kube()     # the worker's
        self._lister = self._new_kube()   # resync and wait_idle (listing only)
        self._instancetypes = Instancetypes(self._kube, self.version)

    # -- lifecycle
    def start(self) -> KubeVirtSim:
        if self._threads:
            return self
        self._stop.clear()
        if self.node_only:
            self.register_nodes()
        self._spawn("kubevirt-sim-worker", self._work)
        self._spawn("kubevirt-sim-resync", self._resync_loop)
        for kind in ("vm", "vmi", "pod"):
            # Clients are made here, one after the other: SimCluster.api_client() writes a
            # kubeconfig file, which is not safe to do from several threads at once.
            self._spawn(f"kubevirt-sim-watch-{kind}", self._watch_loop, kind, self._new_kube())
        return self

    def stop(self) -> None:
        self._stop.set()
        self._resync_now.set()
        with self._cond:
            self._cond.notify_all()
            responses = list(self._watch_responses)
        for resp in responses:
            _interrupt(resp)
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        for api_client in self._api_clients:
            try:
                api_client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._api_clients = []

    def __enter__(self) -> KubeVirtSim:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Return once a full pass over every VM/VMI made no change and nothing is scheduled.

        Each round enqueues every key itself (it does not trust a watch event to have arrived),
        waits for the queue to drain, and stops when the round wrote nothing.
        """
        if not self._threads:
            raise RuntimeError("KubeVirtSim is not running; call start() before wait_idle().")
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            with self._cond:
                before = self._changes
            try:
                self._enqueue_all()
            except Exception as exc:  # noqa: BLE001 - an injected fault: try again
                log.debug("wait_idle: listing failed: %s", exc)
                with self._cond:
                    self._changes += 1
            self._wait_drained(deadline)
            with self._cond:
                quiet = self._changes == before
            if quiet and not self.node_only:
                return
            if quiet:
                # virt-controller acts on its own: idle once nothing it or we own changed for a quiet period.
                now_seen = self._fingerprint()
                if now_seen == seen:
                    return
                seen = now_seen
                time.sleep(QUIET_PERIOD)
            if time.monotonic() > deadline:
                raise TimeoutError(f"KubeVirtSim still reconciling after {timeout}s")
            time.sleep(0.005)

    def _fingerprint(self) -> frozenset:
        """Every VM, VMI and launcher pod by uid and resourceVersion: equal twice means nothing moved."""
        objects = self._lister.list(VMS) + self._lister.list(VMIS) + self._lister.pods()
        return frozenset((meta_of(o).get("uid"), meta_of(o).get("resourceVersion")) for o in objects)

    # -- the queue
    def _new_kube(self) -> Kube:
        api_client = self.cluster.api_client()
        self._api_clients.append(api_client)
        return Kube(api_client, self._count_write)

    def _count_write(self) -> None:
        with self._cond:
            self._changes += 1

    def _spawn(self, name: str, target: Callable, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _enqueue(self, key: Key, delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._cond:
            if key not in self._due or self._due[key] > due:
                self._due[key] = due
            self._cond.notify_all()

    def _enqueue_all(self) -> None:
        keys: set[Key] = set()
        for plural in (VMS, VMIS):
            for obj in self._lister.list(plural):
                keys.add((meta_of(obj)["namespace"], meta_of(obj)["name"]))
        for pod in self._lister.pods():
            owner = owner_name(pod, "VirtualMachineInstance")
            if owner:
                keys.add((meta_of(pod)["namespace"], owner))
        for key in keys:
            self._enqueue(key)

    def _wait_drained(self, deadline: float) -> None:
        with self._cond:
            while self._due or self._calls or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    pending = sorted(f"{ns}/{name}" for ns, name in self._due)
                    raise TimeoutError(f"KubeVirtSim still has work pending: {pending}")
                self._cond.wait(timeout=min(left, 0.05))

    def _call(self, fn: Callable[[], Any]) -> Any:
        if not self._threads:
            return fn()
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify_all()
        return fut.result(timeout=30)

    # -- the worker
    def _work(self) -> None:
        while not self._stop.is_set():
            job = self._next_job()
            if job is None:
                continue
            kind, item = job
            try:
                if kind == "call":
                    fn, fut = item
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(exc)
                elif kind == "io":
                    self._io_step(item)
                else:
                    self._sync(item)
            except Exception as exc:  # noqa: BLE001 - API fault: retry shortly, as a workqueue would
                log.debug("sync %s failed, retrying: %s", item, exc)
                with self._cond:
                    self._changes += 1
                if kind == "io":
                    if item in self._io:
                        self._io[item].next_at = time.monotonic() + 0.05
                else:
                    self._enqueue(item, delay=max(self.step_delay, 0.02))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_job(self) -> tuple[str, Any] | None:
        with self._cond:
            while not self._stop.is_set():
                if self._calls:
                    self._busy = True
                    return "call", self._calls.pop(0)
                now = time.monotonic()
                ready = [k for k, due in self._due.items() if due <= now]
                if ready:
                    key = min(ready, key=lambda k: self._due[k])
                    del self._due[key]
                    self._busy = True
                    return "key", key
                # IO-fault timers are not in _due: wait_idle must not wait for a flapping guest.
                io_ready = [k for k, f in self._io.items() if f.next_at <= now]
                if io_ready:
                    self._io[io_ready[0]].next_at = float("inf")  # until the step sets the next one
                    self._busy = True
                    return "io", io_ready[0]
                dues = list(self._due.values()) + [f.next_at for f in self._io.values()]
                wait = min(dues) - now if dues else 0.2
                self._cond.wait(timeout=max(0.001, min(wait, 0.2)))
            return None

    def _sync(self, key: Key) -> None:
        """One pass for a name: the VM controller, then virt-handler, on freshly fetched objects."""
        ns, name = key
        with self._cond:
            before = self._changes
        vm = None if self.node_only else self._kube.get(VMS, ns, name)
        vmi = self._kube.get(VMIS, ns, name)
        fault = self._io.get(key)
        if fault is not None and (vmi is None or is_deleting(vmi) or meta_of(vmi).get("uid") != fault.vmi_uid):
            self._io.pop(key, None)  # the guest is gone (stopped, restarted): so is its fault
        if self.node_only:
            step = self._sync_node(key, vmi)
        elif vm is not None and self._sync_vm(vm, vmi):
            vmi = self._kube.get(VMIS, ns, name)  # created or deleted: virt-handler sees the new state
            step = self._sync_vmi(key, vmi)
        else:
            step = self._sync_vmi(key, vmi)
        for _ in range(4):  # with no step delay, walk the next phases now rather than a pass each
            if step != 0.0 or self.step_delay > 0 or self.node_only:
                break
            step = self._sync_vmi(key, self._kube.get(VMIS, ns, name))
        with self._cond:
            wrote = self._changes != before
        if step is not None:
            self._enqueue(key, delay=step)
        elif wrote:
            self._enqueue(key)

    def _resync_loop(self) -> None:
        while not self._stop.is_set():
            asked = self._resync_now.wait(timeout=self.resync_period)
            self._resync_now.clear()
            if self._stop.is_set():
                return
            with self._cond:
                now = time.monotonic()
                behind = any(due <= now for due in self._due.values())
            if behind and not asked:
                # The worker has not caught up with the keys already due (a loaded machine, many VMs): enqueueing
                # every key again each period would keep the queue from ever draining and wait_idle from ever
                # returning. The next period tries again; a resync asked for (devices freed) runs regardless.
                continue
            try:
                self._enqueue_all()
            except Exception as exc:  # noqa: BLE001 - the next resync tries again
                log.debug("resync failed: %s", exc)

    def _watch_loop(self, kind: str, kube: Kube) -> None:
        while not self._stop.is_set():
            try:
                if kind == "pod":
                    resp = kube.core.list_pod_for_all_namespaces(
                        label_selector="kubevirt.io=virt-launcher", watch=True, _preload_content=False)
                else:
                    resp = kube.custom.list_cluster_custom_object(
                        GROUP, API_VERSION, VMS if kind == "vm" else VMIS, watch=True, _preload_content=False)
            except Exception as exc:  # noqa: BLE001 - server down or faulty: retry
                log.debug("watch %s could not start: %s", kind, exc)
                self._stop.wait(0.2)
                continue
            with self._cond:
                self._watch_responses.add(resp)
            try:
                self._consume(kind, resp)
            except Exception as exc:  # noqa: BLE001 - stream broke: re-watch (resync covers the gap)
                log.debug("watch %s ended: %s", kind, exc)
            finally:
                with self._cond:
                    self._watch_responses.discard(resp)
                _interrupt(resp)
            self._stop.wait(0.05)

    def _consume(self, kind: str, resp: Any) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        for line in iter_resp_lines(resp):
            if self._stop.is_set():
                return
            if not line:
                continue
            event = json.loads(line)
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                return
            meta = meta_of(obj)
            if kind == "pod":
                owner = owner_name(obj, "VirtualMachineInstance")
                if owner:
                    self._enqueue((meta.get("namespace", ""), owner))
                if event.get("type") == "DELETED" or status_of(obj).get("phase") in FINAL_POD_PHASES:
                    self._resync_now.set()  # devices freed
            elif meta.get("name"):
                self._enqueue((meta.get("namespace", ""), meta["name"]))


def _interrupt(resp: Any) -> None:
    """Unblock a thread reading a watch stream (urllib3 ≥ 2.3 has shutdown()), then close it."""
    for name in ("shutdown", "close", "release_conn"):
        try:
            getattr(resp, name, lambda: None)()
        except Exception:  # noqa: BLE001 - best effort
            pass

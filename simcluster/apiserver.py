"""A faithful, in-process Kubernetes API server for tests: the real `kubernetes` client talks to it over HTTP.

No real cluster can run where vmevents is tested, yet the functions' correctness hinges on API details:
RBAC denials, resourceVersion conflicts, delete preconditions, finalizers, watch expiry, schema rejection,
throttling. `SimCluster` serves those details over loopback HTTP/1.1 (`ThreadingHTTPServer`), so the code
under test uses its ordinary client, and tests set up and inspect state directly through the same store.

Module map: store.py (objects, resourceVersion, watch history, Status errors), selectors.py, patches.py,
schemas.py (CRD validation), rbac.py (deploy/ RBAC), faults.py (injected failures). This file holds the
HTTP layer, KubeVirt's start/stop subresources and the public `SimCluster`.
"""
from __future__ import annotations

import json
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import yaml

from simcluster import patches, paths, selectors, tables
from simcluster.faults import Fault, Faults
from simcluster.rbac import ADMIN, Authorizer, Request
from simcluster.schemas import SchemaRegistry
from simcluster.store import (
    RESOURCES,
    ApiError,
    ResourceType,
    Store,
    WatchEvent,
    bad_request,
    conflict,
    find_type,
    internal_error,
    type_for_kind,
)

KUBEVIRT_SUBRESOURCES = "subresources.kubevirt.io"
LIFECYCLE_ACTIONS = ("start", "stop")
PATCH_ALIASES = {"merge": patches.MERGE_PATCH, "json": patches.JSON_PATCH, "strategic": patches.STRATEGIC_MERGE_PATCH}
# How often a waiting watch checks whether its client went away or the server is stopping.
_WATCH_POLL_SECONDS = 0.2


class AuditRecord(NamedTuple):
    service_account: str | None   # "ns/name", "admin", or None when the caller did not authenticate
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    status: int                   # 0 when the connection was dropped by a fault
    allowed: bool


class Route(NamedTuple):
    """Where a URL points: a kind (or KubeVirt's subresource API, or discovery) plus namespace/name/subresource."""
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    subresource: str
    rt: ResourceType | None

    @property
    def is_lifecycle(self) -> bool:
        return self.group == KUBEVIRT_SUBRESOURCES

    @property
    def is_discovery(self) -> bool:
        return not self.plural


class _DroppedConnection(Exception):
    """A `drop` fault: close the socket without answering."""


def parse_route(path: str) -> Route:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif parts in ([], ["api"], ["apis"], ["version"]) or parts[:1] == ["apis"]:
        return Route("", "", "", "", "", "", None)
    else:
        raise _page_not_found()
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and _namespaced_here(group, version, rest[2]):
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return Route(group, version, "", "", "", "", None)
    if len(rest) > 3:
        raise _page_not_found()
    plural, name, subresource = (rest + ["", ""])[:3]
    if group == KUBEVIRT_SUBRESOURCES:
        return Route(group, version, plural, namespace, name, subresource, None)
    rt = find_type(group, version, plural)
    if rt is None:
        raise _page_not_found()
    return Route(group, version, plural, namespace, name, subresource, rt)


def _namespaced_here(group: str, version: str, plural: str) -> bool:
    if group == KUBEVIRT_SUBRESOURCES:
        return True
    rt = find_type(group, version, plural)
    return rt is not None and rt.namespaced


def _page_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def verb_for(method: str, route: Route, query: dict) -> str:
    """requestinfo.go: the RBAC verb of a request."""
    if method == "GET":
        if _flag(query, "watch"):
            return "watch"
        return "get" if route.name else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if route.name else "deletecollection"}.get(method, method.lower())


def _flag(query: dict, key: str) -> bool:
    return query.get(key, [""])[0].lower() in ("true", "1")


def _param(query: dict, key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


# ---------------------------------------------------------------------------------------------------------------
# KubeVirt start/stop (kubevirt/kubevirt pkg/virt-api/rest/lifecycle.go StartVMRequestHandler /
# StopVMRequestHandler). virt-api patches the VM with its own identity, so only the caller's right to
# `update virtualmachines/start|stop` in subresources.kubevirt.io is checked. The read-check-patch runs
# under the store lock, which stands in for the handlers' JSON-patch `test` operations.

def _vm_conflict(name: str, why: str) -> ApiError:
    # errors.NewConflict(v1.Resource("virtualmachine"), ...) — KubeVirt names the singular resource.
    return conflict("virtualmachine.kubevirt.io", "kubevirt.io", "virtualmachine", name, why)


def run_strategy(vm: dict) -> str:
    """VirtualMachine.RunStrategy(): `spec.running` is the legacy spelling of Always/Halted; default Halted."""
    spec = vm.get("spec") or {}
    if "running" in spec and spec.get("runStrategy") is not None and spec["running"] is not None:
        raise internal_error("running and runstrategy are mutually exclusive")
    if spec.get("running") is not None:
        return "Always" if spec["running"] else "Halted"
    return spec.get("runStrategy") or "Halted"


def _is_final(vmi: dict | None) -> bool:
    return (vmi or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")


def _running_patch(vm: dict, running: bool) -> list[dict]:
    """getRunningPatch: flip runStrategy to Always/Halted, or `spec.running` on legacy VMs."""
    if (vm.get("spec") or {}).get("runStrategy") is not None:
        return [{"op": "replace", "path": "/spec/runStrategy", "value": "Always" if running else "Halted"}]
    return [{"op": "replace", "path": "/spec/running", "value": running}]


def _change_request_patch(vm: dict, *changes: dict) -> list[dict]:
    """getChangeRequestJson: append state change requests to the VM status."""
    status = vm.get("status") or {}
    if not status:
        return [{"op": "add", "path": "/status", "value": {"stateChangeRequests": list(changes)}}]
    pending = status.get("stateChangeRequests") or []
    if not pending:
        operations = [{"op": "add", "path": "/status/stateChangeRequests", "value": list(changes)}]
    elif len(changes) == 1 and changes[0]["action"] == "Stop":
        operations = [{"op": "replace", "path": "/status/stateChangeRequests", "value": list(changes)}]
    else:
        raise internal_error("unable to complete request: stop/start already underway")
    if "startFailure" in status:
        operations.append({"op": "remove", "path": "/status/startFailure"})
    return operations


def lifecycle(store: Store, action: str, namespace: str, name: str, options: dict) -> None:
    vm_type = type_for_kind("kubevirt.io/v1", "VirtualMachine")
    vmi_type = type_for_kind("kubevirt.io/v1", "VirtualMachineInstance")
    with store.cond:
        vm = store.find(vm_type, namespace, name)
        if vm is None:
            raise ApiError(404, "NotFound", f'virtualmachine.kubevirt.io "{name}" not found',
                           {"name": name, "group": "kubevirt.io", "kind": "virtualmachine"})
        vmi = store.find(vmi_type, namespace, name)
        decide = _start_patch if action == "start" else _stop_patch
        target, operations = decide(vm, vmi, name, options, store, vmi_type)
        store.patch(vm_type, namespace, name, patches.JSON_PATCH, operations,
                    subresource="status" if target == "status" else None)


def _start_patch(vm, vmi, name, options, store, vmi_type):
    strategy = run_strategy(vm)
    phase = (vmi or {}).get("status", {}).get("phase", "")
    if vmi is not None and not _is_final(vmi) and phase not in ("Unknown", ""):
        raise _vm_conflict(name, "VM is already running")
    if strategy == "Halted":
        return "spec", _running_patch(vm, True)
    if strategy in ("RerunOnFailure", "Manual"):
        if strategy == "RerunOnFailure" and phase == "Failed":
            raise _vm_conflict(name, "RerunOnFailure does not support starting VM from failed state")
        restart = vmi is not None and (phase == "Succeeded" if strategy == "RerunOnFailure" else _is_final(vmi))
        changes = ([{"action": "Stop", "uid": vmi["metadata"]["uid"]}] if restart else []) + [{"action": "Start"}]
        return "status", _change_request_patch(vm, *changes)
    raise _vm_conflict(name, f"{strategy} does not support manual start requests")


def _stop_patch(vm, vmi, name, options, store, vmi_type):
    strategy = run_strategy(vm)
    running = vmi is not None and not _is_final(vmi)
    grace = options.get("gracePeriod")
    if running and grace is not None:
        store.patch(vmi_type, vmi["metadata"]["namespace"], name, patches.MERGE_PATCH,
                    {"spec": {"terminationGracePeriodSeconds": grace}})
    if strategy in ("Always", "Once"):
        return "spec", _running_patch(vm, False)
    if not running:
        raise _vm_conflict(name, "VM is not running")
    if strategy == "Halted" and grace is None:
        raise _vm_conflict(name, "Halted only supports manual stop requests with a shorter graceperiod")
    return "status", _change_request_patch(vm, {"action": "Stop", "uid": vmi["metadata"]["uid"]})


# ---------------------------------------------------------------------------------------------------------------
# Discovery (a plus for kubectl-like clients; the functions do not need it).

def discovery(route: Route, host: str, unserved: frozenset[str] = frozenset()) -> dict:
    if not route.group and not route.version:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in _groups()
            if g not in unserved]}
    if route.group in unserved or (route.group and (route.group, route.version) not in _groups()):
        raise _page_not_found()  # kube-apiserver answers 404 for a group version it does not serve
    resources = [{"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced, "kind": rt.kind,
                  "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}
                 for rt in RESOURCES if (rt.group, rt.version) == (route.group, route.version)]
    resources += [{"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced, "kind": rt.kind,
                   "verbs": ["get", "patch", "update"]}
                  for rt in RESOURCES
                  if (rt.group, rt.version) == (route.group, route.version) and rt.status_subresource]
    if route.group == KUBEVIRT_SUBRESOURCES:
        resources = [{"name": f"virtualmachines/{a}", "singularName": "", "namespaced": True, "kind": "",
                      "verbs": ["update"]} for a in LIFECYCLE_ACTIONS]
    group_version = f"{route.group}/{route.version}" if route.group else route.version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


def _groups() -> list[tuple[str, str]]:
    seen = {(rt.group, rt.version) for rt in RESOURCES if rt.group}
    return sorted(seen | {(KUBEVIRT_SUBRESOURCES, "v1")})


def _core_discovery(path: str, host: str) -> dict:
    if path.rstrip("/") == "/version":
        return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-vmevents-sim", "platform": "linux/amd64"}
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}


# ---------------------------------------------------------------------------------------------------------------
# HTTP.

class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, cluster: SimCluster):
        self.cluster = cluster
        self.connections: set[socket.socket] = set()
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address):
        # A client hanging up mid-request (a stopped watch, a test's closed pool) is normal; anything else is
        # a simulator bug and is printed as socketserver does.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive; every response carries Content-Length or is chunked
    # TCP_NODELAY, as Go's net/http sets on every connection: headers and body go out in two writes,
    # and with Nagle on the body waits for the client's delayed ACK (~40 ms per call on loopback).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self):
        super().setup()
        self.server.connections.add(self.connection)

    def finish(self):
        self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass  # the audit log (`SimCluster.requests`) replaces stderr noise

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_DELETE(self):
        self._handle("DELETE")

    # -- one request ---------------------------------------------------------------------------------------------

    def _handle(self, method: str):
        cluster = self.server.cluster
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        body = self._read_body()
        self._cut: Fault | None = None
        self._record = dict(service_account=None, verb=method.lower(), api_group="", resource="", subresource="",
                            namespace="", name="", status=0, allowed=False)
        try:
            route = parse_route(url.path)
            if route.group in cluster.unserved:  # a cluster without that API (e.g. no harvester/pcidevices)
                raise _page_not_found()
            request = Request(verb_for(method, route, query), route.group, route.plural, route.subresource,
                              route.namespace, route.name)
            self._record.update(verb=request.verb, api_group=request.api_group, resource=request.resource,
                                subresource=request.subresource, namespace=request.namespace, name=request.name)
            identity = self._record["service_account"] = cluster.auth.authenticate(self.headers.get("Authorization"))
            allowed = self._record["allowed"] = route.is_discovery or cluster.auth.allows(identity, request)
            self._apply_faults(cluster.faults.take(method, url.path, identity))
            if not allowed:
                raise cluster.auth.forbidden(identity, request)
            self._dispatch(method, route, url.path, query, body)
        except _DroppedConnection:
            self._drop()
        except ApiError as err:
            self._send_json(err.code, err.status(), err.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # noqa: BLE001 - a simulator bug must reach the client as a 500, not a hang
            self._send_json(500, internal_error(f"{type(err).__name__}: {err}").status())
        finally:
            self._audit(0)  # only a dropped connection is still unrecorded here

    def _audit(self, status: int):
        """Record the request once, before its answer leaves, so a client never sees an answer unrecorded."""
        if self._record is not None:
            self._record["status"] = status
            self.server.cluster.requests.append(AuditRecord(**self._record))
            self._record = None

    def _apply_faults(self, faults: list[Fault]):
        for fault in faults:
            if fault.kind == "latency":
                time.sleep(fault.delay)
            elif fault.kind == "drop":
                raise _DroppedConnection()
            elif fault.kind == "cut":
                self._cut = fault
            else:
                headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
                body = fault.status_body()
                raise ApiError(fault.status, body["reason"], body["message"], body.get("details"), headers)

    def _dispatch(self, method: str, route: Route, path: str, query: dict, body: Any) -> int:
        if route.is_discovery:
            host = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
            document = (discovery(route, host, self.server.cluster.unserved) if route.version
                        else _core_discovery(path, host))
            return self._send_json(200, document)
        if _param(query, "dryRun"):
            raise bad_request("dryRun is not supported by the vmevents simulator")
        if route.is_lifecycle:
            return self._lifecycle(method, route, body)
        handler = getattr(self, f"_{verb_for(method, route, query)}", None)
        if handler is None:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        return handler(route, query, body)

    # -- verbs ---------------------------------------------------------------------------------------------------

    @property
    def _store(self) -> Store:
        return self.server.cluster.store

    def _get(self, route: Route, query: dict, body: Any) -> int:
        form = tables.wanted_form(self.headers.get("Accept"))
        obj = self._store.get(route.rt, route.namespace, route.name)
        if form == "PartialObjectMetadata":
            return self._send_json(200, tables.partial(obj))
        if form is not None:
            raise ApiError(406, "NotAcceptable", f"the vmevents simulator answers a GET of one object as "
                                                 f"PartialObjectMetadata or in full, not as {form}")
        return self._send_json(200, obj)

    def _list(self, route: Route, query: dict, body: Any) -> int:
        form = tables.wanted_form(self.headers.get("Accept"))
        limit, token, rv = _param(query, "limit"), _param(query, "continue"), _param(query, "resourceVersion")
        if token and rv not in (None, "", "0"):
            # k8s.io/apiserver storage/etcd3 store.go GetList: a continue token carries its own version; "0"
            # is let through (and ignored: the continued list reads etcd at the token's version).
            raise bad_request("specifying resource version is not allowed when using continue")
        if rv == "0" and not token:
            # "Any version": the watch cache answers, and up to 1.33 it does not paginate (limit ignored).
            limit = None
        page = self._store.list(route.rt, route.namespace or None, _param(query, "labelSelector"),
                                _param(query, "fieldSelector"), int(limit) if limit else None, token)
        metadata = {"resourceVersion": page.resource_version}
        if page.continue_token:
            metadata["continue"] = page.continue_token
            if page.remaining is not None:
                metadata["remainingItemCount"] = page.remaining
        items = page.items
        if form == "Table":
            return self._send_json(200, tables.table(route.rt, items, metadata,
                                                     _param(query, "includeObject") or "Metadata"))
        if form is not None:
            return self._send_json(200, tables.metadata_list(items, metadata))
        if not route.rt.group:
            # Built-in lists carry apiVersion/kind only on the list, not on each item.
            items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
        return self._send_json(200, {"kind": f"{route.rt.kind}List", "apiVersion": route.rt.api_version,
                                     "metadata": metadata, "items": items})

    def _create(self, route: Route, query: dict, body: Any) -> int:
        if route.name and route.rt.kind == "Pod" and route.subresource == "binding":
            target = (_object_body(body).get("target") or {})
            if target.get("kind", "Node") != "Node" or not target.get("name"):
                raise bad_request("a Binding must target a Node by name")
            self._store.bind(route.rt, route.namespace, route.name, target["name"])
            return self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                         "status": "Success", "code": 201})
        if route.name:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        return self._send_json(201, self._store.create(route.rt, route.namespace or None, _object_body(body),
                                                       refuse_resource_version=True))

    def _update(self, route: Route, query: dict, body: Any) -> int:
        updated = self._store.update(route.rt, route.namespace or None, route.name, _object_body(body),
                                     self._subresource(route))
        return self._send_json(200, updated)

    def _patch(self, route: Route, query: dict, body: Any) -> int:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type not in patches.PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted media types include: "
                           f"{', '.join(patches.PATCH_TYPES)}")
        patched = self._store.patch(route.rt, route.namespace or None, route.name, content_type, body,
                                    self._subresource(route))
        return self._send_json(200, patched)

    def _delete(self, route: Route, query: dict, body: Any) -> int:
        preconditions = (body or {}).get("preconditions") if isinstance(body, dict) else None
        obj, deleted = self._store.delete(route.rt, route.namespace or None, route.name, preconditions)
        if deleted and not route.rt.returns_deleted_object:
            return self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                         "details": {"name": route.name, "group": route.rt.group,
                                                     "kind": route.rt.plural, "uid": obj["metadata"]["uid"]}})
        return self._send_json(200, obj)

    def _deletecollection(self, route: Route, query: dict, body: Any) -> int:
        deleted = self._store.delete_collection(route.rt, route.namespace or None, _param(query, "labelSelector"),
                                                _param(query, "fieldSelector"))
        return self._send_json(200, {"kind": f"{route.rt.kind}List", "apiVersion": route.rt.api_version,
                                     "metadata": {"resourceVersion": str(self._store.resource_version)},
                                     "items": deleted})

    def _lifecycle(self, method: str, route: Route, body: Any) -> int:
        if route.plural != "virtualmachines" or route.subresource not in LIFECYCLE_ACTIONS or not route.namespace:
            raise _page_not_found()
        if method != "PUT":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        lifecycle(self._store, route.subresource, route.namespace, route.name, body if isinstance(body, dict) else {})
        return self._send_json(202, None)

    @staticmethod
    def _subresource(route: Route) -> str | None:
        if not route.subresource:
            return None
        if route.subresource == "status" and route.rt.status_subresource:
            return "status"
        raise _page_not_found()

    # -- watch ---------------------------------------------------------------------------------------------------

    def _watch(self, route: Route, query: dict, body: Any) -> int:
        store, rt, namespace = self._store, route.rt, route.namespace or None
        try:
            match = selectors.matcher(_param(query, "labelSelector"), _param(query, "fieldSelector"), rt.field_labels)
            since = _param(query, "resourceVersion")
            cursor = int(since) if since not in (None, "", "0") else None
            timeout = _param(query, "timeoutSeconds")
            deadline = time.monotonic() + float(timeout) if timeout else None
        except ValueError as err:
            raise bad_request(str(err)) from None
        with store.cond:
            expired = cursor is not None and cursor < store.floor
            floor = store.floor
            initial = []
            if cursor is None:
                # "Get State and Start at Most Recent": synthetic ADDED events for what exists now.
                initial = [("ADDED", o) for o in store.list(rt, namespace).items if match(o)]
                cursor = store.resource_version
        self._start_stream()
        if self._cut is not None:  # an injected cut ends the stream after its delay, without the end chunk
            self._cut_at = time.monotonic() + self._cut.delay
            deadline = self._cut_at if deadline is None else min(deadline, self._cut_at)
        if expired:
            self._write_event("ERROR", _expired(cursor, floor))
        else:
            for event_type, obj in initial:
                self._write_event(event_type, obj)
            self._follow(store, rt, namespace, match, cursor, deadline)
        if self._cut is not None:
            self._drop()
            return 200
        self._end_stream()
        return 200

    def _follow(self, store: Store, rt, namespace, match, cursor: int, deadline: float | None):
        while not store.closed and not self._client_gone():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            with store.cond:
                if store.resource_version <= cursor and not store.closed:
                    store.cond.wait(_WATCH_POLL_SECONDS if remaining is None else min(_WATCH_POLL_SECONDS, remaining))
                events = store.events_after(cursor, rt, namespace)
                floor, latest = store.floor, store.resource_version
            if events is None:  # this watcher fell behind the bounded history
                self._write_event("ERROR", _expired(cursor, floor))
                return
            cursor = latest
            for event in events:
                converted = _filtered(event, match)
                if converted:
                    self._write_event(*converted)

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- wire ----------------------------------------------------------------------------------------------------

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            return _UnparsableBody(str(err))

    def _send_json(self, code: int, body: Any, headers: dict | None = None) -> int:
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        self._audit(code)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self._cut is not None:  # an injected cut: half the body, then the connection closes
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self._drop()
            return code
        self.wfile.write(data)
        return code

    def _start_stream(self):
        self._audit(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _write_event(self, event_type: str, obj: dict):
        line = json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def _end_stream(self):
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        if self.server.cluster.store.closed:
            self.close_connection = True

    def _drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _UnparsableBody(str):
    """A request body that is not JSON; only an error if a handler needs the body."""


def _object_body(body: Any) -> dict:
    if isinstance(body, _UnparsableBody):
        raise bad_request(f"couldn't get version/kind; json parse error: {body}")
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _expired(cursor: int, floor: int) -> dict:
    # The watch cache's answer to a compacted resourceVersion: errors.NewResourceExpired, 410 Gone, reason Expired.
    return ApiError(410, "Expired", f"too old resource version: {cursor} ({floor})").status()


def _filtered(event: WatchEvent, match) -> tuple[str, dict] | None:
    """cacheWatcher.convertToWatchEvent: selectors see both sides of a change, so leaving the selection is a
    DELETED and entering it an ADDED."""
    current = event.type != "DELETED" and match(event.obj)
    previous = event.prev is not None and match(event.prev)
    if current and previous:
        return "MODIFIED", event.obj
    if current:
        return "ADDED", event.obj
    if previous:
        gone = dict(event.prev, metadata=dict(event.prev["metadata"], resourceVersion=str(event.rv)))
        return "DELETED", gone
    return None


# ---------------------------------------------------------------------------------------------------------------
# The public face.

class SimCluster:
    """A simulated cluster: HTTP API server on loopback, seeded with namespaces and the KubeVirt CR.

    Direct access (`create`, `get`, `list`, `patch`, `update`, `delete`) uses the store exactly as HTTP does
    (validation, resourceVersion, uid, generateName, finalizers, watch events) without HTTP, RBAC or faults.
    Two conveniences for test set-up: `create` keeps a posted `status` (HTTP create drops it for kinds with a
    status subresource, as the real server does), and `patch`/`update` take `subresource="status"`.
    """

    def __init__(self, kubevirt_version: str = "1.3.1", kubevirt_namespace: str = "kubevirt",
                 deploy_dir: Path | str = paths.DEPLOY_DIR, host: str = "127.0.0.1", port: int = 0,
                 history_size: int = 2000, event_ttl: float | None = 3600.0, unserved: tuple[str, ...] = ()):
        """event_ttl: seconds an Event lives after its last write, as kube-apiserver --event-ttl (1h). unserved:
        API groups this cluster does not serve (404, as a cluster without their CRDs), e.g. a plain KubeVirt
        cluster without harvester/pcidevices' devices.harvesterhci.io."""
        self.unserved = frozenset(unserved)
        self.kubevirt_version = kubevirt_version
        self.kubevirt_namespace = kubevirt_namespace
        self._address = (host, port)
        self.schemas = SchemaRegistry(kubevirt_version)
        self.store = Store(validate=self.schemas.validate, history_size=history_size, event_ttl=event_ttl)
        self.auth = Authorizer(Path(deploy_dir) / "base")
        self.faults = Faults()
        self.requests: list[AuditRecord] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._tmpdir: str | None = None
        self._clients: list = []

    # -- life ----------------------------------------------------------------------------------------------------

    def start(self) -> SimCluster:
        self._tmpdir = tempfile.mkdtemp(prefix="vmevents-sim-")
        self._kubeconfig_lock = threading.Lock()
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="sim-apiserver", daemon=True)
        self._thread.start()
        self._seed()
        return self

    def stop(self):
        if self._server is None:
            return
        self.store.close()          # wakes every watch; each ends its stream
        self._server.shutdown()
        for connection in list(self._server.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join(timeout=5)
        for client in self._clients:
            client.close()
        self._clients.clear()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._server = None

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _seed(self):
        # The namespaces every cluster has, then KubeVirt's and ours.
        for namespace in dict.fromkeys(("default", "kube-system", "kube-public", "kube-node-lease",
                                        self.kubevirt_namespace, "vmevents")):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self.create({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                     "metadata": {"name": "kubevirt", "namespace": self.kubevirt_namespace},
                     "spec": {"configuration": {}},
                     "status": {"phase": "Deployed", "observedKubeVirtVersion": f"v{self.kubevirt_version}",
                                "targetKubeVirtVersion": f"v{self.kubevirt_version}"}})

    # -- identities ----------------------------------------------------------------------------------------------

    def kubeconfig(self, service_account: str | None = None) -> str:
        """Write a kubeconfig with a bearer token for "ns/name" (or admin) and return its path."""
        identity = service_account or ADMIN
        token = self.auth.token_for(identity)
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                  "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
                  "users": [{"name": identity, "user": {"token": token}}],
                  "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": identity,
                                                          "namespace": "default"}}]}
        path = Path(self._tmpdir) / f"kubeconfig-{identity.replace('/', '-')}.yaml"
        with self._kubeconfig_lock:  # written once per identity: a reader never sees a half-written file
            if not path.exists():
                partial = path.with_suffix(".tmp")
                partial.write_text(yaml.safe_dump(config))
                partial.replace(path)
        return str(path)

    def api_client(self, service_account: str | None = None):
        from kubernetes import config

        client = config.new_client_from_config(config_file=self.kubeconfig(service_account))
        self._clients.append(client)  # closed on stop(), so no socket outlives the cluster
        return client

    # -- direct access -------------------------------------------------------------------------------------------

    def create(self, obj: dict) -> dict:
        """Create as HTTP does, but for set-up: the object's namespace is created first when missing."""
        rt = type_for_kind(obj["apiVersion"], obj["kind"])
        namespace = (obj.get("metadata") or {}).get("namespace")
        if rt.namespaced:
            ns_type = type_for_kind("v1", "Namespace")
            if self.store.find(ns_type, None, namespace or "default") is None:
                self.store.create(ns_type, None, {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": namespace or "default"}})
        return self.store.create(rt, namespace, obj, keep_status=True)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict | None:
        return self.store.find(type_for_kind(api_version, kind), namespace, name)

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        return self.store.list(type_for_kind(api_version, kind), namespace, label_selector, field_selector).items

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: Any,
              patch_type: str = "merge", subresource: str | None = None) -> dict:
        return self.store.patch(type_for_kind(api_version, kind), namespace, name,
                                PATCH_ALIASES.get(patch_type, patch_type), patch, subresource)

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        rt = type_for_kind(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata") or {}
        return self.store.update(rt, meta.get("namespace"), meta["name"], obj, subresource)

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None = None,
               resource_version: str | None = None) -> dict | None:
        """Delete (or mark for deletion while finalizers remain); None when absent. Preconditions as on HTTP."""
        rt = type_for_kind(api_version, kind)
        if self.store.find(rt, namespace, name) is None:
            return None
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        return self.store.delete(rt, namespace, name, preconditions)[0]

    def compact(self) -> int:
        """Drop the watch history (etcd compaction): watches from an older resourceVersion get 410 Gone."""
        return self.store.compact()

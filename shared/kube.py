"""Kubernetes access for the functions: the real `kubernetes` client, dicts in and out, errors wrapped.

Functions never import `kubernetes.client.exceptions`: every failure leaves this module as one of the errors
below, already sorted into permanent and temporary (kopf's `_cogs/clients/errors.py` does the same). Requests go
through `ApiClient.param_serialize` / `call_api`, so configuration, authentication and TLS are the client's own,
but responses stay plain dicts: no model classes to build for objects we only read a few fields of.
"""
from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shared.deadline import request_timeout
from shared.errors import PermanentError, TemporaryError, parse_retry_after, refused_request
from shared.kinds import (  # noqa: F401 - the resource types (shared/kinds.py), imported from here by the functions
    EVENT,
    KINDS,
    KUBEVIRT,
    LONGHORN_ENGINE,
    LONGHORN_VOLUME,
    MIGRATION_POLICY,
    NAMESPACE,
    POD,
    PV,
    PVC,
    VM,
    VMI,
    VMIM,
    Kind,
)
from shared.kubeclient import ApiException
from shared.kubeclient import client as k8s

# (connect, read) seconds: a hung API server is a 5xx before the broker's delivery timeout, so it redelivers.
REQUEST_TIMEOUT = (3.0, 10.0)
PAGE_SIZE = 250


class KubeError(Exception):
    """Mixin: an error that came from the Kubernetes API."""


class NotFound(PermanentError, KubeError):
    pass


class Conflict(TemporaryError, KubeError):
    """409, or a JSON-patch `test` that failed (422): the object changed; read again, decide again."""


class Vanished(Conflict):
    """404 on a PATCH or PUT: deleted since it was read. Read again, never a permanent 400."""


class Forbidden(TemporaryError, KubeError):
    """403: the shipped RBAC does not allow it (the message names the grant missing). Retried, then dead-lettered."""

    status = 500


class Invalid(PermanentError, KubeError):
    pass


class Unavailable(TemporaryError, KubeError):
    """The API server is unreachable, throttling (429) or failing (5xx)."""


class Throttled(Unavailable):
    """429: the API server turned the request away before doing anything (max-in-flight, priority and fairness).
    Unlike a 5xx or a lost answer, a write answered so was certainly not applied."""


class NotSent(Unavailable):
    """Not sent: the delivery's time was up (shared/deadline.py). Like a 429, certainly not applied."""


class Expired(PermanentError, KubeError):
    """410 Gone: a watch (or a continue token) from a resourceVersion the server no longer keeps. List again."""


_PATCH_DID_NOT_APPLY = "the server rejected our request due to an error in our request"
def _error_for(status: int, message: str, retry_after: float | None, method: str = "GET") -> Exception:
    if status == 404:  # a write names an object it read: gone meanwhile (Kube.delete answers a 404 itself: done)
        return Vanished(f"{message} (deleted since it was read)") if method in ("PATCH", "PUT") else NotFound(message)
    if status == 409:
        return Conflict(message)
    if status == 410:
        return Expired(message)
    if status == 403:
        return Forbidden(message)
    if status == 422 and _PATCH_DID_NOT_APPLY in message:
        # k8s.io/apiserver handlers/patch.go applyJSPatch: a JSON patch whose `test` fails answers NewGenericServer-
        # Response(422) with only this generic message. Ours test the version we read: the object changed.
        return Conflict(f"{message} (a JSON-patch test failed: the object changed)")
    if status in (400, 422):
        return Invalid(message)
    if status == 429:
        return Throttled(message, retry_after=retry_after)
    return Unavailable(message, retry_after=retry_after)


def _transport_error() -> type[Exception]:
    """urllib3's base error, what the client lets through for a failed connection (urllib3 is imported by then)."""
    from urllib3.exceptions import HTTPError

    return HTTPError


def _status_message(body: bytes, fallback: str) -> str:
    try:
        return json.loads(body).get("message") or fallback
    except (ValueError, AttributeError):
        return fallback


def _json_object(data: bytes) -> dict[str, Any]:
    """A response body: every Kubernetes API answer is a JSON object (an empty body is `{}`); orjson: 10x json."""
    import orjson  # noqa: PLC0415 - imported once; here, so that this module's imports stay what they were
    decoded: dict[str, Any] = orjson.loads(data) if data else {}
    return decoded


# The media types of the cheap LIST forms (k8s.io/apiserver endpoints/handlers/response.go negotiates them
# from Accept). Full objects are a fine answer to a metadata LIST, hence its JSON fallback.
_AS_METADATA = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
_AS_PARTIAL = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io,application/json"  # one object
_AS_TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"  # no fallback: full objects would read as no rows

RowList = list[dict]  # (named out here: inside Kube, `list` is the method)


class Rows(RowList):
    """Table rows (`Kube.rows`), and the resourceVersion of the list they came from."""

    resource_version = ""


@dataclass
class Changes:
    """What a watch from a resourceVersion saw (`Kube.changes`): (type, object) in order, and where it got to."""

    resource_version: str
    events: list[tuple[str, dict]] = field(default_factory=list)


# A JSON patch (RFC 6902): its operations, in order.
JsonPatch = list[dict[str, Any]]


class Kube:
    """A small façade over one `ApiClient`, or over `connect`, which makes it on the first request
    (shared/kubeconfig.py in a pod: urllib3, pydantic, dateutil, which an irrelevant event never needs, are then
    imported when first needed). Counts its calls (the benchmark reports them)."""

    def __init__(self, api_client: k8s.ApiClient | None = None, *, page_size: int = PAGE_SIZE,
                 connect: Callable[[], k8s.ApiClient] | None = None):
        self._api, self._connect = api_client, connect
        self.page_size = page_size
        self._calls = itertools.count()
        self.calls = 0
        self.bytes_received = 0  # response bodies, as received (the benchmark reports them)
        self._count = threading.Lock()  # re-scans read in parallel (shared/rescan.py)

    @property
    def api(self) -> k8s.ApiClient:
        with self._count:
            if self._api is None:
                if self._connect is None:
                    raise TypeError("a Kube needs an ApiClient or a way to connect")
                self._api = self._connect()
            return self._api

    # -- transport ---------------------------------------------------------------------------
    def request(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
                content_type: str = "application/json", accept: str = "application/json") -> dict:
        return _json_object(self._send(method, path, query, body, content_type, accept))

    def _send(self, method: str, path: str, query: dict | None, body: Any = None,
              content_type: str = "application/json", accept: str = "application/json") -> bytes:
        """One request; its response body, or the error it is (`_error_for`); bounded by shared/deadline.py."""
        timeout = request_timeout(REQUEST_TIMEOUT)
        if timeout is None:
            raise NotSent(f"{method} {path}: not sent, the delivery's time is up (shared/deadline.py)")
        with self._count:
            self.calls = next(self._calls) + 1
        headers = {"Accept": accept} if body is None else {"Accept": accept, "Content-Type": content_type}
        api = self.api
        params = api.param_serialize(method=method, resource_path=path,
                                          query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                                          header_params=headers, body=body, auth_settings=["BearerToken"])
        what = f"{method} {path}"
        try:
            response = api.call_api(*params, _request_timeout=timeout)
            data: bytes = response.read()
            with self._count:
                self.bytes_received += len(data)
        except ApiException as exc:  # raised by the client for transport-level trouble
            raise Unavailable(f"{what}: {exc.reason or exc}") from None
        except (_transport_error(), OSError) as exc:
            raise Unavailable(f"{what}: Kubernetes API unreachable ({exc.__class__.__name__})") from None
        if response.status >= 300:
            message = _status_message(data, f"HTTP {response.status}")
            retry_after = parse_retry_after(response.getheader("Retry-After"))
            if response.status == 403:
                raise Forbidden(refused_request(method, path, query, message))
            raise _error_for(response.status, f"{what}: {message}", retry_after, method)
        return data

    # -- verbs -------------------------------------------------------------------------------
    def get(self, kind: Kind, namespace: str | None, name: str) -> dict | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", kind.path(namespace, name))
        except NotFound:
            return None

    def get_metadata(self, kind: Kind, namespace: str | None, name: str, *, cached: bool = False) -> dict | None:
        """The object's metadata only (PartialObjectMetadata, as `kind` so an Event can name it), or None.
        `cached`: resourceVersion=0, from the watch cache (see `_pages`)."""
        try:
            found = self.request("GET", kind.path(namespace, name), accept=_AS_PARTIAL,
                                 query={"resourceVersion": "0"} if cached else None)
        except NotFound:
            return None
        return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": found.get("metadata") or {}}

    def list(self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, cached: bool = False) -> Iterator[dict]:
        """Every object, fetched page by page (limit/continue) so memory stays flat at any scale.
        `cached`: served from the API server's watch cache (see `_pages`)."""
        for page in self._pages(kind, namespace, label_selector, field_selector, cached, "application/json", {}):
            yield from page.get("items") or ()

    def list_metadata(self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None,
                      cached: bool = False) -> Iterator[dict]:
        """Every object's metadata only: PartialObjectMetadata dicts (`{"metadata": {...}}`), paged like `list`.
        The server reads the same objects but encodes a fraction of each (no spec, no status)."""
        for page in self._pages(kind, namespace, label_selector, None, cached, _AS_METADATA, {}):
            yield from page.get("items") or ()

    def list_rows(self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None,
                  cached: bool = False, metadata: bool = True) -> Iterator[dict]:
        """One dict per row of the Table form of a LIST: `{"metadata": <the row object's metadata>, "cells":
        {<column name lower-case>: value}}`. The columns are the kind's printer columns (a CRD's
        additionalPrinterColumns, e.g. a VMI's Phase and Paused); includeObject=Metadata puts each row's
        PartialObjectMetadata beside its cells. `metadata=False` (includeObject=None) leaves it out, and with
        it the managedFields that make up most of it: a row is then its cells only, a few dozen bytes, and
        its metadata is just the name (the Name cell) and the namespace asked for, so a namespaced kind must
        then be listed one namespace at a time."""
        for _, rows in self._row_pages(kind, namespace, label_selector, cached, metadata):
            yield from rows

    def rows(self, kind: Kind, namespace: str | None = None, *, cached: bool = False,
             metadata: bool = True) -> Rows:
        """`list_rows`, all at once, with the list's resourceVersion: where a watch of its changes starts."""
        found = Rows()
        for version, rows in self._row_pages(kind, namespace, None, cached, metadata):
            found.resource_version = found.resource_version or version  # every page is of the first's version
            found += rows
        return found

    def _row_pages(self, kind: Kind, namespace: str | None, label_selector: str | None, cached: bool,
                   metadata: bool) -> Iterator[tuple[str, RowList]]:
        if not metadata and kind.namespaced and not namespace:
            raise ValueError(f"rows of {kind.plural} without metadata need a namespace: a row would not say its own")
        include = "Metadata" if metadata else "None"
        for page in self._pages(kind, namespace, label_selector, None, cached, _AS_TABLE, {"includeObject": include}):
            names = [str(c.get("name", "")).lower() for c in page.get("columnDefinitions") or ()]
            rows: RowList = []
            for row in page.get("rows") or ():
                cells = dict(zip(names, row.get("cells") or (), strict=False))
                if metadata:
                    meta = (row.get("object") or {}).get("metadata") or {}
                else:
                    meta = {"name": cells.get("name"), **({"namespace": namespace} if kind.namespaced else {})}
                rows.append({"metadata": meta, "cells": cells})
            yield str((page.get("metadata") or {}).get("resourceVersion") or ""), rows

    def changes(self, kind: Kind, namespace: str | None, since: str, *, seconds: int = 1, labels: str = "") -> Changes:
        """What changed since resourceVersion `since` (among what `labels` selects: one coming to match is ADDED, one
        ceasing to, DELETED; docs/facts.md §8): a WATCH from there, ended by the server after `seconds`. The watch
        cache sends what it kept since then at once, then what happens meanwhile. `Changes.resource_version`: the
        last change's (`since` when none), where the next call starts. Expired (410) when the cache no longer keeps
        `since`: list again. No bookmarks: 1.33's cacher plans them 2 s before a watch's deadline or once a minute
        (cache_watcher.go nextBookmarkTime), and watches of 1-4 s got none (docs/api-cost.md)."""
        query = {"watch": "1", "resourceVersion": since, "timeoutSeconds": seconds, "labelSelector": labels or None}
        data = self._send("GET", kind.path(namespace), query)
        found = Changes(resource_version=since)
        for line in data.splitlines():
            try:
                event = json.loads(line) if line.strip() else {}
            except ValueError:  # a stream cut short: what came before it stands, the next call sees the rest
                break
            obj = event.get("object") if isinstance(event, dict) else None
            if not isinstance(obj, dict):
                continue
            if event.get("type") == "ERROR":  # a Status: 410 Expired, or whatever else ended the watch
                raise _error_for(int(obj.get("code") or 500), f"WATCH {kind.path(namespace)}: "
                                 f"{obj.get('message') or obj.get('reason')}", None)
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and version:
                found.events.append((str(event["type"]), obj))
                found.resource_version = str(version)
        return found

    def _pages(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
               cached: bool, accept: str, extra: dict) -> Iterator[dict]:
        """The pages of one LIST. `cached` asks for resourceVersion=0: "any version", which kube-apiserver
        answers from its watch cache instead of reading etcd (k8s.io/apiserver cacher.go, and "Semantics for
        get and list" in the API concepts). Up to 1.33 the cache does not paginate: with resourceVersion=0 the
        server ignores `limit` and answers every object in one response without a continue token (paginated
        lists from the cache need the alpha ListFromCacheSnapshot gate). A continue token, should one come,
        is followed without resourceVersion: it carries its own (the server ignores "0" beside it and refuses
        any other, "specifying resource version is not allowed when using continue"). Slightly stale: use it
        only where the act re-reads with a precondition."""
        token = None
        while True:
            query = {"labelSelector": label_selector, "fieldSelector": field_selector, "limit": self.page_size,
                     "continue": token, "resourceVersion": "0" if cached and token is None else None, **extra}
            page = self.request("GET", kind.path(namespace), query=query, accept=accept)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def delete(self, kind: Kind, namespace: str | None, name: str, *, uid: str, resource_version: str) -> bool:
        """Delete exactly this version of this object. False when it is already gone."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            self.request("DELETE", kind.path(namespace, name), body=options)
        except NotFound:
            return False
        return True

    def json_patch(self, kind: Kind, namespace: str | None, name: str, operations: JsonPatch) -> dict:
        return self.request("PATCH", kind.path(namespace, name), body=operations,
                            content_type="application/json-patch+json")

    def merge_patch(self, kind: Kind, namespace: str | None, name: str, patch: dict) -> dict:
        return self.request("PATCH", kind.path(namespace, name), body=patch,
                            content_type="application/merge-patch+json")

    def create(self, kind: Kind, namespace: str | None, body: dict) -> dict:
        return self.request("POST", kind.path(namespace), body=body)
